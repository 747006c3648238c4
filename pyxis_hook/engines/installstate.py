"""The node tree `pyxis-hook install` changes, and its record of what was there before.

`NodeTree(root)` reads and writes node paths under `root` (`--root DIR`; "/"
on a node), each resolved inside it (`rootfs.resolve_in_root`: a link is
followed as if `root` were /, never out of it).  The record
(`/var/lib/pyxis-hook/install.json`) holds, for every path an install wrote
or created: the engines that need it, what was there before (absent, or a
backup copy with its mode) and a digest of what was written, so `uninstall`
puts back exactly what was there once the last engine needing a path is gone,
and leaves a file someone changed since (an admin's pyxis.conf) as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat

from pyxis_hook.engines.enginefiles import STATE_DIR
from pyxis_hook.engines.install import install_text
from pyxis_hook.errors import PathError, UsageError
from pyxis_hook.rootfs import resolve_in_root

RECORD = f"{STATE_DIR}/install.json"
BACKUP_DIR = f"{STATE_DIR}/backup"


def digest(content: str) -> str:
    return hashlib.sha256(content.encode()).hexdigest()


class NodeTree:
    """Node paths under `root`: read (`get`), write (`put`, `link`), remove, make directories."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def host(self, path: str, follow_last: bool = False) -> str:
        """The host path of node path `path`, links followed inside the root (the last one with `follow_last`)."""
        try:
            return resolve_in_root(self.root, path, follow_last=follow_last)
        except PathError as e:  # a loop, a link out of the root, a component that keeps changing
            raise UsageError(f"{path}: cannot be resolved under {self.root}: {e}") from None

    def get(self, path: str) -> tuple[str, str, int] | None:
        """(kind, content, mode) of `path`: kind 'file' (text) or 'link' (its target); None when absent."""
        h = self.host(path)
        try:
            st = os.lstat(h)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        if stat.S_ISLNK(st.st_mode):
            return "link", os.readlink(h), 0
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: not a regular file")
        try:
            fd = os.open(h, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                data = f.read()
        except OSError as e:
            raise UsageError(f"{path}: cannot read: {e.strerror}") from None
        return "file", data.decode("utf-8", "surrogateescape"), stat.S_IMODE(st.st_mode)

    def put(self, path: str, content: str, mode: int) -> None:
        h = self.host(path)
        install_text(h, content, mode)

    def link(self, path: str, target: str) -> None:
        h = self.host(path)
        tmp = f"{h}.{os.getpid()}.tmp"
        try:
            os.symlink(target, tmp)
            os.replace(tmp, h)
        except OSError as e:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            raise UsageError(f"{path}: cannot link: {e.strerror}") from None

    def remove(self, path: str) -> None:
        try:
            os.unlink(self.host(path))
        except FileNotFoundError:
            pass

    def missing_dirs(self, path: str) -> list[str]:
        """The node directories above `path` that do not exist, outermost first.

        UsageError for one that is not a directory, or a link to a place
        whose own parent is missing (install creates directories, not link
        targets).
        """
        out = []
        d = os.path.dirname(path)
        while d not in ("/", ""):
            h = self.host(d, follow_last=True)
            if os.path.isdir(h) and not os.path.islink(h):
                break
            if os.path.lexists(h):
                raise UsageError(f"{d}: not a directory")
            if os.path.lexists(self.host(d)) and not os.path.isdir(os.path.dirname(h)):
                raise UsageError(f"{d}: a link to a missing directory under {self.root}")
            out.append(d)
            d = os.path.dirname(d)
        return out[::-1]

    def mkdir(self, path: str) -> None:
        try:
            os.mkdir(self.host(path, follow_last=True), 0o755)
        except FileExistsError:
            pass
        except OSError as e:
            raise UsageError(f"{path}: cannot create directory: {e.strerror}") from None

    def rmdir(self, path: str) -> bool:
        """Remove an empty directory; False when it holds something now."""
        try:
            os.rmdir(self.host(path, follow_last=True))
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


def load_record(tree: NodeTree) -> dict:
    """The install record ({"paths": {...}, "dirs": {...}}); an empty one when there is none."""
    got = tree.get(RECORD)
    if got is None:
        return {"paths": {}, "dirs": {}}
    try:
        doc = json.loads(got[1])
    except ValueError:
        raise UsageError(f"{RECORD}: not JSON; move it away to start over") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("paths"), dict) or not isinstance(doc.get("dirs"), dict):
        raise UsageError(f"{RECORD}: not an install record; move it away to start over")
    return doc


def save_record(tree: NodeTree, doc: dict) -> None:
    tree.put(RECORD, json.dumps(doc, indent=1, sort_keys=True) + "\n", 0o644)


def installed_engines(doc: dict) -> set[str]:
    """The engines the record says are installed."""
    return {e for entry in doc["paths"].values() for e in entry.get("users", [])}
