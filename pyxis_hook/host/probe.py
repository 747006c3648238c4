"""Probes of the host's GPU facts: a file read, a directory listed, a node stat'ed, failures as warnings.

`host/gpuscan.py` makes every probe through a `Reader`: a probe that fails
adds a warning naming the path instead of raising.  Reads use `posix` calls
and are capped at `rootfs.PROC_LIMIT` bytes.
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


#: each kind of probe, by name
_LOOKS = {"read": _read_raw, "list": _list_raw, "dir": pathnames.isdir, "stat": _stat_raw}


class Reader:
    """Probes host files for discovery; a failed probe becomes a warning naming the path (`warnings`)."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def _look(self, kind: str, path: str):
        return _LOOKS[kind](path)

    def read(self, path: str, *, missing_ok: bool = False) -> str | None:
        """The file's text as `open(path, errors="replace").read()` gives it; None when missing or unreadable."""
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
