"""ld.so.conf inside a root, read the way glibc's ldconfig reads it (elf/ldconfig.c parse_conf).

Why our own parser: `ldcheck` must tell which directories a *container's*
ldconfig will index without running anything inside the container, and the
driver root's configuration decides where its libraries live.  Rules kept
from glibc 2.36:

* text after `#` is dropped, leading blanks skipped, blank lines ignored, a
  NUL ends the line;
* `include` + blank + one or more glob patterns separated by spaces/tabs;
  relative patterns are relative to the including file's directory; matches
  are read in `glob` order (sorted, `LC_COLLATE=C`); no match is silent;
* `hwcap ...` lines (any case) are ignored;
* anything else is a directory: `dir=TYPE` loses `=TYPE`, trailing blanks and
  slashes are stripped (so `/` alone is dropped);
* a missing configuration file is silent.

Every path is resolved inside the root (`rootfs.resolve_in_root`, or a
`RootFS` fd walk on the apply side), so a symlink in an image cannot make us
read the host's files; FIFOs, devices and files over CONF_LIMIT are never read
(ldconfig would block or read for ever on them; we report `truncated`).

`dirs_by_inode` / `existing_dirs` are the hook's one implementation of
ldconfig's "one directory per inode, first name wins" rule (ldmerge uses it).
"""

from __future__ import annotations

import errno
import os
import stat

from pyxis_hook.errors import PathError
from pyxis_hook.record import record
from pyxis_hook.rootfs import resolve_in_root

#: typing.TYPE_CHECKING without importing typing (~3 ms on the hook's path)
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's names cost ~3 ms of imports on the hook's path: hints only
    from typing import Iterable, Union

    from pyxis_hook.rootfs import RootFS

    Where = Union[str, RootFS]

_SPACE = " \t\n\v\f\r"
_BLANK = " \t"
_MAGIC = "*?["
#: ldconfig has no limits (a self-including file exhausts its descriptors); we
#: stop at these so a hostile image cannot make `ldcheck` run for ever.
MAX_INCLUDE_DEPTH = 64
MAX_FILES = 1024
#: a configuration file larger than this is not read (Debian's whole tree is < 1 KiB)
CONF_LIMIT = 1 << 20

#: `Where` (a hint): a root directory by name (reads: ldcheck, libscan, tests) or an open RootFS (the apply side)


@record
class LdSoConf:
    """What an ld.so.conf tree says.

    `dirs`: configured directories in ldconfig's order, duplicates (same
    string) dropped, first occurrence kept.  `unmatched_includes`: (file,
    line, pattern) for include patterns that matched nothing.  `files_read`:
    root-relative config files read, in order.  `truncated`: the tree could
    not be read as ldconfig would read it (an include loop hit
    MAX_INCLUDE_DEPTH or MAX_FILES, or a file exists but is a FIFO, a device,
    larger than CONF_LIMIT, a symlink loop, unreadable); `problems` says why,
    one line each.  The result is then a prefix of ldconfig's view, fine for
    advice but not for reproducing its cache.
    """

    dirs: tuple[str, ...]
    unmatched_includes: tuple[tuple[str, int, str], ...]
    files_read: tuple[str, ...]
    truncated: bool = False
    problems: tuple[str, ...] = ()


def read_ld_so_conf(root: str, conf: str = "/etc/ld.so.conf", *, rfs: "RootFS | None" = None) -> LdSoConf:
    """Parse `conf` (a path inside `root`) and its includes.

    With `rfs` (an open RootFS of `root`) every file and directory is opened
    through its fd walk, never by name: the apply side runs as root inside
    the container's mount namespace, where a name could be swapped between a
    check and the open.  Without it, paths are resolved with `resolve_in_root`
    (read-only advice: ldcheck, libscan).  Either way a FIFO, device or huge
    file is never read (`truncated`), and nothing raises for what the image
    holds.
    """
    state = _State(_RfsAccess(rfs) if rfs is not None else _PathAccess(root))
    state.parse(conf, 0)
    return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files), state.truncated,
                    tuple(state.problems))


def dir_identity(where: Where, path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the directory `path` inside the root, or None when it is not one we can reach.

    A lookup the host kept racing (RootFS: EAGAIN after kernel.OPENAT2_TRIES) raises its PathError:
    it says nothing about the directory.
    """
    if isinstance(where, str):
        try:
            st = os.stat(resolve_in_root(where, path))
        except (OSError, PathError):
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
    try:
        fd = where.open(path, os.O_PATH | os.O_DIRECTORY)
    except PathError as e:
        if getattr(e, "errno", 0) == errno.EAGAIN:
            raise  # the host kept racing the lookup (kernel.OPENAT2_TRIES): not "no such directory"
        return None
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def dirs_by_inode(where: Where, dirs: Iterable[str]) -> dict[tuple[int, int], str]:
    """The existing directories among `dirs`, first name per inode, in order: {(dev, ino): name}.

    This is ldconfig's add_dir_1/add_single_dir rule (a missing directory is
    skipped, /lib and /usr/lib on a merged-/usr image count once, under the
    name listed first) and the one implementation of it in the hook.
    """
    out: dict[tuple[int, int], str] = {}
    for d in dirs:
        ident = dir_identity(where, d)
        if ident is not None and ident not in out:
            out[ident] = d
    return out


def existing_dirs(where: Where, dirs: Iterable[str]) -> tuple[str, ...]:
    """`dirs_by_inode` as a tuple of names in scan order."""
    return tuple(dirs_by_inode(where, dirs).values())


class _Unreadable(Exception):
    """A configuration file that exists but cannot be read the way ldconfig would."""


class _PathAccess:
    """Reads by name under `root` (resolve_in_root): for tools that only advise."""

    def __init__(self, root: str) -> None:
        self.root = root

    def read(self, path: str) -> bytes | None:
        """The file's bytes; None when it is missing or a directory (both silent in ldconfig)."""
        try:
            host = resolve_in_root(self.root, path)
            fd = os.open(host, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        except PathError as e:
            raise _Unreadable(str(e)) from None
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise _Unreadable(f"{path}: {e.strerror}") from None
        try:
            st = os.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return None
            if not stat.S_ISREG(st.st_mode):
                raise _Unreadable(f"{path}: not a regular file")
            data = os.read(fd, CONF_LIMIT + 1)
        except OSError as e:
            raise _Unreadable(f"{path}: {e.strerror}") from None
        finally:
            os.close(fd)
        if len(data) > CONF_LIMIT:
            raise _Unreadable(f"{path}: larger than {CONF_LIMIT} bytes")
        return data

    def exists(self, path: str) -> bool:
        try:
            return os.path.lexists(resolve_in_root(self.root, path))
        except PathError:
            return False

    def isdir(self, path: str) -> bool:
        try:
            return os.path.isdir(resolve_in_root(self.root, path))
        except PathError:
            return False

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(resolve_in_root(self.root, path or "."))
        except (OSError, PathError):
            return []


class _RfsAccess:
    """Reads through a RootFS's fd walk: nothing is opened by a name the image could swap."""

    def __init__(self, rfs: "RootFS") -> None:
        self.rfs = rfs

    def read(self, path: str) -> bytes | None:
        try:
            return self.rfs.read_bytes(path, CONF_LIMIT)
        except PathError as e:
            if getattr(e, "errno", 0) in (errno.ENOENT, errno.ENOTDIR, errno.EISDIR):
                return None
            raise _Unreadable(str(e)) from None

    def _opens(self, path: str, flags: int) -> bool:
        try:
            os.close(self.rfs.open(path or "/", flags))
            return True
        except PathError as e:
            _busy(e)
            return False

    def exists(self, path: str) -> bool:
        return self._opens(path, os.O_PATH)

    def isdir(self, path: str) -> bool:
        return self._opens(path, os.O_PATH | os.O_DIRECTORY)

    def listdir(self, path: str) -> list[str]:
        try:
            fd = self.rfs.open(path or "/", os.O_RDONLY | os.O_DIRECTORY)
        except PathError as e:
            _busy(e)
            return []
        try:
            return os.listdir(fd)
        except OSError:
            return []
        finally:
            os.close(fd)


def _busy(e: PathError) -> None:
    """A lookup the host kept racing (EAGAIN after kernel.OPENAT2_TRIES) says nothing about the
    image: the tree is unread (`truncated`), never an include that matched nothing."""
    if getattr(e, "errno", 0) == errno.EAGAIN:
        raise _Unreadable(str(e)) from None


class _State:
    def __init__(self, fs: _PathAccess | _RfsAccess) -> None:
        self.fs = fs
        self.dirs: list[str] = []
        self.unmatched: list[tuple[str, int, str]] = []
        self.files: list[str] = []
        self.problems: list[str] = []
        self.attempts = 0
        self.truncated = False

    def parse(self, filename: str, depth: int) -> None:
        self.attempts += 1
        if depth > MAX_INCLUDE_DEPTH or self.attempts > MAX_FILES:
            if not self.truncated:
                self.problems.append(f"{filename}: more than {MAX_INCLUDE_DEPTH} nested or {MAX_FILES} "
                                     "included files")
            self.truncated = True
            return
        try:
            raw = self.fs.read(filename)
        except _Unreadable as e:
            self.truncated = True
            self.problems.append(str(e))
            return
        if raw is None:
            return  # missing (silent in ldconfig) or a directory (read as empty)
        self.files.append(filename)
        for lineno, line in enumerate(raw.split(b"\n"), 1):
            line = line.split(b"\0", 1)[0].split(b"#", 1)[0]
            text = os.fsdecode(line).lstrip(_SPACE)
            if not text:
                continue
            if text.startswith("include") and len(text) > 7 and text[7] in _BLANK:
                for pattern in _strsep(text[8:]):
                    self.include(filename, lineno, pattern, depth)
            elif text[:5].lower() == "hwcap" and len(text) > 5 and text[5] in _BLANK:
                continue
            else:
                self.add_dir(text)

    def include(self, filename: str, lineno: int, pattern: str, depth: int) -> None:
        full = pattern
        if not pattern.startswith("/") and "/" in filename:
            full = os.path.dirname(filename) + "/" + pattern
        try:
            matches = self.glob(full)
        except _Unreadable as e:
            self.truncated = True
            self.problems.append(f"{filename}:{lineno}: {e}")
            return
        if not matches:
            self.unmatched.append((filename, lineno, pattern))
        for m in matches:
            self.parse(m, depth + 1)

    def add_dir(self, text: str) -> None:
        path = text.split("=", 1)[0].rstrip(_SPACE).rstrip("/")
        if path and path not in self.dirs:
            self.dirs.append(path)

    def glob(self, pattern: str) -> list[str]:
        """glob(3) inside the root, results sorted bytewise (C collation); errors match nothing, as in glob."""
        fs = self.fs
        if not any(c in pattern for c in _MAGIC):
            return [pattern] if fs.exists(pattern) else []
        absolute = pattern.startswith("/")
        parts = [p for p in pattern.split("/") if p]
        found = ["/" if absolute else ""]
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = []
            for base in found:
                joined = (base.rstrip("/") + "/" if base else "")
                if not any(c in part for c in _MAGIC):
                    cand = joined + part
                    if fs.exists(cand) and (last or fs.isdir(cand)):
                        nxt.append(cand)
                    continue
                for name in fs.listdir(base):
                    if name.startswith(".") and not part.startswith("."):
                        continue
                    if name_matches(name, part):
                        cand = joined + name
                        if last or fs.isdir(cand):
                            nxt.append(cand)
            found = nxt
        return sorted(found, key=os.fsencode)


def name_matches(name: str, pattern: str) -> bool:
    """fnmatch.fnmatchcase(name, pattern), without importing fnmatch when the pattern has no `[`.

    Debian's `include /etc/ld.so.conf.d/*.conf` is read on every container
    start, and fnmatch costs ~7 ms of imports there (`re` and the `enum` it
    brings; issue 7).  `*` and `?` are matched here, greedily with one
    backtrack point as usual; a bracket expression goes to fnmatch itself.
    """
    if "[" in pattern:
        try:
            import fnmatch
        except ImportError:  # inside a container's namespace (apply's child forbids imports there)
            raise _Unreadable(f"include pattern {pattern!r}: a bracket expression, not matched here") from None
        return fnmatch.fnmatchcase(name, pattern)
    n = p = 0
    star = -1  # position in the pattern after the last '*', and where in the name it started
    mark = 0
    while n < len(name):
        if p < len(pattern) and (pattern[p] == "?" or pattern[p] == name[n]) and pattern[p] != "*":
            n += 1
            p += 1
        elif p < len(pattern) and pattern[p] == "*":
            p += 1
            star, mark = p, n
        elif star >= 0:
            mark += 1
            n, p = mark, star
        else:
            return False
    return pattern[p:].strip("*") == ""


def _strsep(text: str) -> list[str]:
    """strsep(" \\t") keeping only non-empty tokens (the other whitespace stays in the token)."""
    out = []
    token = []
    for c in text:
        if c in _BLANK:
            if token:
                out.append("".join(token))
            token = []
        else:
            token.append(c)
    if token:
        out.append("".join(token))
    return out
