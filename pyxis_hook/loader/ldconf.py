"""ld.so.conf inside a root, read the way glibc's ldconfig reads it (elf/ldconfig.c parse_conf).

Why our own parser: `ldcheck` must tell which directories a *container's*
ldconfig will index without running anything inside the container, the
merge must know them to place new cache entries, and before the hook lets
the confined ldconfig loose on an image it must know that the image's
configuration will not make it hang, spin or open a device.  Rules kept
from glibc 2.36:

* text after `#` is dropped, leading blanks skipped, blank lines ignored, a
  NUL ends the line;
* `include` + blank + one or more glob patterns separated by spaces/tabs;
  relative patterns are relative to the including file's directory; matches
  are read in `glob` order (sorted, `LC_COLLATE=C`); no match is silent;
* `hwcap ...` lines (any case) are ignored;
* anything else is a directory: `dir=TYPE` loses `=TYPE`, trailing blanks and
  slashes are stripped (so `/` alone is dropped);
* a missing configuration file is silent, a directory reads as empty.

One reader for the hook (a `RootFS` of the container, inside its mount
namespace) and for `ldcheck`/`libscan` (a `RootFS` opened on the directory):
every path is resolved by `RootFS.locate`'s fd walk, so a symlink in an image
never leads out of it, `..` at the root stays there (as in the kernel), and
the name of each directory is the resolved one (a relative include of an
included file does not grow `../../..` at every level).  The root's `/proc`
and `/sys` are absent, as in the confined ldconfig's view (they are empty
tmpfs there): the reader never opens `/proc/kmsg` nor walks `/sys`.

glibc's ldconfig has no limits: an include loop recurses until it runs out of
descriptors or CPU, a FIFO blocks `fopen`, a device node runs its driver's
open() and `/dev/zero` never ends.  The reader stops at the first thing it
cannot read as ldconfig would, and says why in `LdSoConf.stop`, one of the
kinds below; the kinds in `UNSAFE` are the ones where ldconfig must not run
either (`require_safe`: the hook refuses the start).  The work is bounded:
MAX_INCLUDE_DEPTH, MAX_FILES, CONF_LIMIT bytes in all, MAX_ENTRIES paths and
directory entries looked at, MAX_SECONDS.

`dirs_by_inode` / `existing_dirs` are the hook's one implementation of
ldconfig's "one directory per inode, first name wins" rule (ldmerge uses it).
"""

from __future__ import annotations

import errno
import posix
import stat
import time

from pyxis_hook import pathnames
from pyxis_hook.errors import LdCacheError, PathError
from pyxis_hook.record import record
from pyxis_hook.rootfs import RootFS, RootPathError, resolve_in_root

#: typing.TYPE_CHECKING without importing typing (~3 ms on the hook's path)
TYPE_CHECKING = False
if TYPE_CHECKING:  # typing's names cost ~3 ms of imports on the hook's path: hints only
    from typing import Iterable, Union

    Where = Union[str, RootFS]

_SPACE = " \t\n\v\f\r"
_BLANK = " \t"
#: we stop at these so a hostile image cannot make the hook or `ldcheck` run for ever
MAX_INCLUDE_DEPTH = 64
MAX_FILES = 1024
#: the configuration files' bytes, all together (Debian's whole tree is < 1 KiB)
CONF_LIMIT = 1 << 20
#: paths resolved plus directory entries listed by include patterns, all together
MAX_ENTRIES = 10000
#: wall-clock bound of one read (a slow or hostile filesystem under the rootfs)
MAX_SECONDS = 5.0
#: directories a read keeps open to look up entries in them (`_Tree.held`); more are walked to again
MAX_HELD = 16
#: what one read(2) of a configuration file asks for after the first (which asks for its size)
_CHUNK = 1 << 16
#: top-level directories of the root that do not exist for ldconfig (apply/confined.py masks them)
HIDDEN = ("proc", "sys")

#: why a read stopped (`LdSoConf.stop`; "" when it did not)
NOT_REGULAR = "not-regular"  # a FIFO or socket: ldconfig's fopen blocks (FIFO) or fails
DEVICE = "device"  # a character or block device: ldconfig's open() would run its driver as root
LOOP = "include-loop"  # a file includes itself: ldconfig recurses until it runs out of fds or CPU
LIMIT = "limit"  # more than one of the limits above allows
UNREADABLE = "unreadable"  # a symlink loop, a name too long, an error: ldconfig warns and skips it
UNMODELLED = "unmodelled"  # a `[...]` pattern in apply's child: read on with a wider match, not stopped
#: the kinds after which glibc's ldconfig must not run on the image either
UNSAFE = frozenset((NOT_REGULAR, DEVICE, LOOP, LIMIT))


@record
class LdSoConf:
    """What an ld.so.conf tree says.

    `dirs`: configured directories in ldconfig's order, duplicates (same
    string) dropped, first occurrence kept.  `unmatched_includes`: (file,
    line, pattern) for include patterns that matched nothing.  `files_read`:
    root-relative config files read, in order, each under its resolved
    directory.  `truncated`: the read stopped at something it cannot read
    as ldconfig would; `stop` is its kind (NOT_REGULAR, DEVICE, LOOP, LIMIT,
    UNREADABLE, UNMODELLED) and `problems` its one-line reason.  The result
    is then a prefix of ldconfig's view (for UNMODELLED, read to the end
    with wider matches), fine for advice but not for reproducing its cache.
    """

    dirs: tuple[str, ...]
    unmatched_includes: tuple[tuple[str, int, str], ...]
    files_read: tuple[str, ...]
    truncated: bool = False
    problems: tuple[str, ...] = ()
    stop: str = ""

    @property
    def unsafe(self) -> bool:
        """glibc's ldconfig would hang, spin or open a device on this configuration."""
        return self.stop in UNSAFE


class UnsafeLoaderConfig(LdCacheError):
    """The image's loader configuration is one glibc's ldconfig must not be run on: the start is refused."""


def read_ld_so_conf(root: str, conf: str = "/etc/ld.so.conf", *, rfs: RootFS | None = None) -> LdSoConf:
    """Parse `conf` (a path inside `root`) and its includes.

    With `rfs` (an open RootFS of `root`: the apply side, inside the
    container's mount namespace) the files are read through it; without,
    a RootFS of `root` is opened for the read.  Nothing raises for what the
    image holds: a refusal is `stop` (see the module doc).
    """
    if rfs is None:
        try:
            with RootFS(root) as own:
                return read_ld_so_conf(root, conf, rfs=own)
        except RootPathError as e:  # no root: nothing configured, as for a missing ld.so.conf
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return LdSoConf((), (), ())
            return LdSoConf((), (), (), True, (str(e),), UNREADABLE)
    state = _State(_Tree(rfs))
    try:
        state.parse(conf, 0)
    except _Stop as e:
        return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files), True, (e.reason,), e.kind)
    finally:
        state.tree.close()
    if state.tree.unmodelled:
        return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files), True,
                        (state.tree.unmodelled,), UNMODELLED)
    return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files))


def require_safe(rfs: RootFS, conf: str = "/etc/ld.so.conf") -> LdSoConf:
    """`read_ld_so_conf` through `rfs`; UnsafeLoaderConfig when ldconfig must not run on it either.

    Both ld.so.cache modes call it before anything else of the update: the
    merge models what it reads, and the confined ldconfig (mode `ldconfig`,
    or the merge's fallback) runs only on a configuration that passed here.
    """
    got = read_ld_so_conf(rfs.path, conf, rfs=rfs)
    if got.unsafe:
        raise UnsafeLoaderConfig(f"ld.so.cache not updated: the image's loader configuration is refused: "
                                 f"{got.problems[0]}")
    return got


def dir_identity(where: Where, path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the directory `path` inside the root, or None when it is not one we can reach.

    A lookup the host kept racing (RootFS: EAGAIN after kernel.OPENAT2_TRIES) raises its PathError:
    it says nothing about the directory.
    """
    if isinstance(where, str):
        try:
            st = posix.stat(resolve_in_root(where, path))
        except (OSError, PathError):
            return None
        return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None
    try:
        fd = where.open(path, posix.O_PATH | posix.O_DIRECTORY)
    except PathError as e:
        if getattr(e, "errno", 0) == errno.EAGAIN:
            raise  # the host kept racing the lookup (kernel.OPENAT2_TRIES): not "no such directory"
        return None
    try:
        st = posix.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        posix.close(fd)


def dirs_by_inode(where: Where, dirs: Iterable[str],
                  seen: dict[str, tuple[int, int] | None] | None = None) -> dict[tuple[int, int], str]:
    """The existing directories among `dirs`, first name per inode, in order: {(dev, ino): name}.

    This is ldconfig's add_dir_1/add_single_dir rule (a missing directory is
    skipped, /lib and /usr/lib on a merged-/usr image count once, under the
    name listed first) and the one implementation of it in the hook.  A name
    listed twice is looked up once; `seen`, when given, receives each name's
    `dir_identity` (the merge asks it again for its libraries' directories).
    """
    out: dict[tuple[int, int], str] = {}
    seen = {} if seen is None else seen
    for d in dirs:
        if d in seen:
            continue
        ident = seen[d] = dir_identity(where, d)
        if ident is not None and ident not in out:
            out[ident] = d
    return out


def existing_dirs(where: Where, dirs: Iterable[str]) -> tuple[str, ...]:
    """`dirs_by_inode` as a tuple of names in scan order."""
    return tuple(dirs_by_inode(where, dirs).values())


class _Stop(Exception):
    """The read ends here: `kind` is one of the constants above, `reason` one line naming the file."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class _Tree:
    """The root as the confined ldconfig sees it, read through one RootFS, within the read's budget.

    The directories `dir_path` found stay open (O_PATH, up to MAX_HELD, in
    `held` by resolved name until `close`): listing one, looking up an entry
    in it or opening a configuration file in it then starts from that fd
    instead of walking the path from the root again (`include
    /etc/ld.so.conf.d/*.conf` would otherwise resolve `/etc` four times).
    """

    def __init__(self, rfs: RootFS) -> None:
        self.rfs = rfs
        self.steps = 0
        self.bytes = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        #: why some pattern was matched by `_widened` (the read goes on: every file it reaches is checked)
        self.unmodelled = ""
        self.held: dict[str, int] = {}

    def close(self) -> None:
        for fd in self.held.values():
            posix.close(fd)
        self.held.clear()

    def _dir_fd(self, base: str) -> tuple[int, bool] | None:
        """(O_PATH fd of the resolved directory `base`, whether the caller closes it); None when unreachable."""
        fd = self.held.get(base)
        if fd is not None:
            return fd, False
        found = self.locate(base, strict=False)
        return None if found is None else (found[0], True)

    def tick(self) -> None:
        """Count one path resolved or directory entry looked at; LIMIT past the budget or the deadline."""
        self.steps += 1
        if self.steps > MAX_ENTRIES:
            raise _Stop(LIMIT, f"include patterns in {self.rfs.path} look at more than {MAX_ENTRIES} paths "
                               "and directory entries")
        if time.monotonic() > self.deadline:
            raise _Stop(LIMIT, f"reading the loader configuration in {self.rfs.path} took more than "
                               f"{MAX_SECONDS:g} s")

    def locate(self, path: str, *, strict: bool) -> tuple[int, str] | None:
        """(O_PATH fd, resolved path), None where ldconfig finds nothing (missing, under /proc or /sys).

        Any other error is a stop when `strict` (a file ldconfig would fail
        to open), no match otherwise (glob ignores what it cannot read).
        """
        self.tick()
        try:
            return self.rfs.locate(path, hidden=HIDDEN)
        except RootPathError as e:
            if strict and e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise _Stop(UNREADABLE, str(e)) from None
            return None

    def read(self, path: str, via: str) -> tuple[tuple[int, int], bytes] | None:
        """((st_dev, st_ino), bytes) of the configuration file `path`; None when missing or a directory.

        The type is taken from the fd the walk opened (O_PATH), and only a
        regular file is opened for reading, as that same inode: a FIFO never
        blocks and a device's driver never sees an open().
        """
        found = self._in_held(path)
        if found is None:
            found = self.locate(path, strict=True)
            if found is None:
                return None
        fd = found[0]
        try:
            st = posix.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return None
            if not stat.S_ISREG(st.st_mode):
                kind = DEVICE if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else NOT_REGULAR
                raise _Stop(kind, f"{path} (in {self.rfs.path}){via}: {_file_type(st.st_mode)}, "
                                  "not a configuration file")
            left = CONF_LIMIT - self.bytes
            if st.st_size > left:
                raise _Stop(LIMIT, f"{path} (in {self.rfs.path}){via}: the configuration files are larger "
                                   f"than {CONF_LIMIT} bytes in all")
            try:
                rfd = self.rfs.reopen(fd, posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY)
                try:
                    # asked for by the chunk, not the whole budget: a 1 MiB request is a 1 MiB buffer (mmap, munmap)
                    data = posix.read(rfd, min(left + 1, st.st_size + 1))
                    while len(data) <= left and (more := posix.read(rfd, min(left + 1 - len(data), _CHUNK))):
                        data += more
                finally:
                    posix.close(rfd)
            except OSError as e:
                raise _Stop(UNREADABLE, f"{path} (in {self.rfs.path}){via}: {e.strerror}") from None
            if len(data) > left:
                raise _Stop(LIMIT, f"{path} (in {self.rfs.path}){via}: the configuration files are larger "
                                   f"than {CONF_LIMIT} bytes in all")
            self.bytes += len(data)
            return (st.st_dev, st.st_ino), data
        finally:
            posix.close(fd)

    def _in_held(self, path: str) -> tuple[int, str] | None:
        """`locate(path)` for a plain entry of a held directory: one open, no walk; None: walk instead.

        Only a name that is neither a symlink (opened O_NOFOLLOW, its type
        read from the fd) nor `.`/`..` nor a masked top-level directory is
        taken this way; the walk handles everything else.
        """
        base, _, name = path.rpartition("/")
        fd = self.held.get(base or "/")
        if fd is None or name in ("", ".", "..") or (not base and name in HIDDEN):
            return None
        self.tick()
        try:
            own = posix.open(name, posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None  # the walk says what ldconfig would make of it
        if stat.S_ISLNK(posix.fstat(own).st_mode):
            posix.close(own)
            return None
        return own, path

    def dir_path(self, path: str) -> str | None:
        """The resolved name of directory `path`, None when it is not one ldconfig can reach.

        The directory stays open in `held` (while there is room) for what is looked up in it next.
        """
        found = self.locate(path, strict=False)
        if found is None:
            return None
        fd, real = found
        if not stat.S_ISDIR(posix.fstat(fd).st_mode):
            posix.close(fd)
            return None
        if real in self.held or len(self.held) >= MAX_HELD:
            posix.close(fd)
        else:
            self.held[real] = fd
        return real

    def lexists(self, base: str, name: str) -> bool:
        """Whether directory `base` (resolved) has an entry `name`, a dangling link too (glob's lstat)."""
        if base == "/" and name in HIDDEN:
            return False
        found = self._dir_fd(base)
        if found is None:
            return False
        fd, own = found
        try:
            posix.stat(name, dir_fd=fd, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            if own:
                posix.close(fd)

    def matching(self, base: str, pattern: str) -> list[str]:
        """Names in directory `base` (resolved) that `pattern` matches; each entry looked at counts."""
        found = self._dir_fd(base)
        if found is None:
            return []
        fd, own = found
        out = []
        try:
            dfd = posix.open(".", posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return []
        finally:
            if own:
                posix.close(fd)
        try:
            with posix.scandir(dfd) as entries:
                for entry in entries:
                    self.tick()
                    name = entry.name
                    if base == "/" and name in HIDDEN:
                        continue
                    if name.startswith(".") and not pattern.startswith("."):
                        continue
                    try:
                        matched = name_matches(name, pattern)
                    except _Unmodelled as e:
                        self.unmodelled = self.unmodelled or str(e)
                        matched = name_matches(name, _widened(pattern))
                    if matched:
                        out.append(name)
        except OSError:
            return []
        finally:
            posix.close(dfd)
        return out


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"


def _magic(part: str) -> bool:
    return "*" in part or "?" in part or "[" in part


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


class _State:
    def __init__(self, tree: _Tree) -> None:
        self.tree = tree
        self.dirs: list[str] = []
        self.seen: set[str] = set()
        self.unmatched: list[tuple[str, int, str]] = []
        self.files: list[str] = []
        self.attempts = 0
        #: (st_dev, st_ino) of the files being read, outermost first: one of them again is a loop
        self.active: list[tuple[int, int]] = []

    def parse(self, filename: str, depth: int, via: str = "") -> None:
        self.attempts += 1
        if depth > MAX_INCLUDE_DEPTH:
            raise _Stop(LIMIT, f"{filename} (in {self.tree.rfs.path}){via}: includes nested more than "
                               f"{MAX_INCLUDE_DEPTH} deep")
        if self.attempts > MAX_FILES:
            raise _Stop(LIMIT, f"{filename} (in {self.tree.rfs.path}){via}: more than {MAX_FILES} "
                               "configuration files included")
        got = self.tree.read(filename, via)
        if got is None:
            return  # missing (silent in ldconfig) or a directory (read as empty)
        ident, raw = got
        if ident in self.active:
            raise _Stop(LOOP, f"{filename} (in {self.tree.rfs.path}){via}: includes itself (an include loop)")
        self.files.append(filename)
        self.active.append(ident)
        for lineno, line in enumerate(raw.split(b"\n"), 1):
            line = line.split(b"\0", 1)[0].split(b"#", 1)[0]
            text = pathnames.fsdecode(line).lstrip(_SPACE)
            if not text:
                continue
            if text.startswith("include") and len(text) > 7 and text[7] in _BLANK:
                for pattern in _strsep(text[8:]):
                    self.include(filename, lineno, pattern, depth)
            elif text[:5].lower() == "hwcap" and len(text) > 5 and text[5] in _BLANK:
                continue
            else:
                self.add_dir(text)
        self.active.pop()

    def include(self, filename: str, lineno: int, pattern: str, depth: int) -> None:
        full = pattern if pattern.startswith("/") else _join(pathnames.dirname(filename) or "/", pattern)
        matches = self.glob(full)
        if not matches:
            self.unmatched.append((filename, lineno, pattern))
        for m in matches:
            self.parse(m, depth + 1, f" (included at {filename}:{lineno})")

    def add_dir(self, text: str) -> None:
        path = text.split("=", 1)[0].rstrip(_SPACE).rstrip("/")
        if path and path not in self.seen:
            self.seen.add(path)
            self.dirs.append(path)

    def glob(self, pattern: str) -> list[str]:
        """glob(3) inside the root: each match named under its directory's resolved name.

        Matches are sorted bytewise (C collation) by the name as the pattern
        spells it, as glob sorts them; the name handed on is the directory's
        resolved path plus the entry, which is where a relative include in
        that file starts (so `include ../../etc/*` never grows the path).
        Errors match nothing, as in glob.
        """
        parts = [p for p in pattern.split("/") if p and p != "."]
        # a run of components without magic before the last one is one lookup (`/etc/ld.so.conf.d`):
        # it resolves as those components one after the other would (symlinks, `..`, the masked dirs)
        i = 0
        while i < len(parts) - 2 and not _magic(parts[i]) and not _magic(parts[i + 1]):
            parts[i:i + 2] = [parts[i] + "/" + parts[i + 1]]
        found = [("", "/")]  # (name as spelled, resolved directory or match)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            magic = _magic(part)
            nxt = []
            for spelled, base in found:
                for name in (self.tree.matching(base, part) if magic else (part,)):
                    if last:
                        if magic or self.tree.lexists(base, name):
                            nxt.append((spelled + "/" + name, _join(base, name)))
                        continue
                    real = self.tree.dir_path(_join(base, name))
                    if real is not None:
                        nxt.append((spelled + "/" + name, real))
            found = nxt
        found.sort(key=lambda f: pathnames.fsencode(f[0]))
        return [real for _spelled, real in found]


def name_matches(name: str, pattern: str) -> bool:
    """fnmatch.fnmatchcase(name, pattern), without importing fnmatch when the pattern has no `[`.

    Debian's `include /etc/ld.so.conf.d/*.conf` is read on every container
    start, and fnmatch costs ~7 ms of imports there (`re` and the `enum` it
    brings).  `*` and `?` are matched here, greedily with one
    backtrack point as usual; a bracket expression goes to fnmatch itself.
    """
    if "[" in pattern:
        try:
            import fnmatch
        except ImportError:  # inside a container's namespace (apply's child forbids imports there)
            raise _Unmodelled(f"include pattern {pattern!r}: a bracket expression, not matched here") from None
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


class _Unmodelled(Exception):
    """A pattern `name_matches` cannot evaluate here (fnmatch cannot be imported)."""


def _widened(pattern: str) -> str:
    """`pattern` with each bracket expression as `?`, and a `[` opening none or a `\\` escape as `*`.

    It matches every name the pattern matches (and maybe more): where the
    exact match cannot be had, every file the pattern could reach is still
    checked before ldconfig is let loose on it.
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append("*")
            i += 2
            continue
        if c != "[":
            out.append(c)
            i += 1
            continue
        j = i + 1
        if j < len(pattern) and pattern[j] in "!^":
            j += 1
        if j < len(pattern) and pattern[j] == "]":
            j += 1  # a `]` first in the expression is one of its characters
        while j < len(pattern) and pattern[j] != "]":
            if pattern[j] == "[" and j + 1 < len(pattern) and pattern[j + 1] in ":=.":
                end = pattern.find(pattern[j + 1] + "]", j + 2)  # [:alpha:], [=a=], [.a.]
                j = end + 2 if end >= 0 else len(pattern)
            else:
                j += 1
        out.append("*" if j >= len(pattern) else "?")
        i = i + 1 if j >= len(pattern) else j + 1
    return "".join(out)


def _strsep(text: str) -> list[str]:
    """strsep(" \\t") keeping only non-empty tokens (the other whitespace stays in the token)."""
    out = []
    token: list[str] = []
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
