"""Discovery's looks at the host: each file read, directory listed and node stat'ed, kept as found.

Discovery (`host/gpuscan.py`) makes every look through a `Reader`, which
turns failures into warnings naming the path and keeps what the look found
(`Reader.seen`).  Why keep them: discovery is a pure function of those
looks, and the looks it makes depend only on what earlier ones found.  So a
later start that makes the same looks in the same order and finds the same
(`replay`) would decide exactly the same HostGpus: `host/gpumemo.py` then
takes it from its memo instead of parsing every GPU's files again (on a
64-GPU node, most of what a start spends per GPU), and loads neither
discovery nor the parsers.
"""

from __future__ import annotations

import posix

from pyxis_hook import pathnames
from pyxis_hook.rootfs import PROC_LIMIT, read_to_end


def _read_raw(path: str) -> bytes | str | None:
    """The file's bytes; None when it does not exist; the error's text when it cannot be read."""
    try:
        return read_to_end(posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC), PROC_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as e:
        return str(e.strerror or e)


def _list_raw(path: str) -> tuple[str, ...] | str | None:
    """The directory's names, sorted; None when it does not exist; the error's text when it cannot be listed."""
    try:
        return tuple(sorted(posix.listdir(path)))
    except FileNotFoundError:
        return None
    except OSError as e:
        return str(e.strerror or e)


def _stat_raw(path: str) -> tuple[int, int] | str | None:
    """(st_mode, st_rdev), all a node check looks at; None when missing; the error's text."""
    try:
        st = posix.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return str(e.strerror or e)
    return st.st_mode, st.st_rdev


#: each kind of look, by the name a `seen` entry gives it
_LOOKS = {"read": _read_raw, "list": _list_raw, "dir": pathnames.isdir, "stat": _stat_raw}


class Reader:
    """Looks at host files for discovery: failures become warnings naming the path; every look is kept in `seen`."""

    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.seen: list[tuple[str, str, object]] = []

    def _look(self, kind: str, path: str):
        found = _LOOKS[kind](path)
        self.seen.append((kind, path, found))
        return found

    def read(self, path: str, *, missing_ok: bool = False) -> str | None:
        """The file's text as `open(path, errors="replace").read()` gives it, read with `posix` calls.

        Why not `open`: a buffered text file costs seven syscalls and two
        objects a read, and a GPU start reads one of these per GPU (a
        64-GPU node must cost at most 1.3x a one-GPU one).
        """
        data = self._look("read", path)
        if data is None:
            if not missing_ok:
                self.warnings.append(f"{path}: missing")
            return None
        if isinstance(data, str):
            self.warnings.append(f"{path}: cannot read: {data}")
            return None
        text = data.decode("utf-8", "replace")
        # text mode's universal newlines: \r\n and \r read as \n
        return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text

    def listdir(self, path: str) -> list[str]:
        names = self._look("list", path)
        if isinstance(names, str):
            self.warnings.append(f"{path}: cannot list: {names}")
            return []
        return list(names or ())

    def isdir(self, path: str) -> bool:
        return bool(self._look("dir", path))

    def stat(self, path: str) -> tuple[int, int] | str | None:
        return self._look("stat", path)


def replay(seen) -> bool:
    """Whether each look in `seen` (a `Reader.seen`) finds now what it found then, in order.

    Then discovery, which would make the very same looks, would decide the
    same HostGpus.  Stops at the first difference.
    """
    try:
        for kind, path, found in seen:
            if _LOOKS[kind](path) != found:
                return False
    except (KeyError, TypeError, ValueError):  # not a list of looks (a damaged memo)
        return False
    return True
