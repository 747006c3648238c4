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
the files are reached through `conftree.Tree`, which keeps a symlink in an
image from leading out of it, hides the root's `/proc` and `/sys` as the
confined ldconfig's view does, and never opens what is not a regular file.
The name of each directory is the resolved one (a relative include of an
included file does not grow `../../..` at every level).

glibc's ldconfig has no limits: an include loop recurses until it runs out of
descriptors or CPU, a FIFO blocks `fopen`, a device node runs its driver's
open() and `/dev/zero` never ends.  The reader stops at the first thing it
cannot read as ldconfig would, and says why in `LdSoConf.stop`, one of
`conftree`'s kinds; the kinds in `UNSAFE` are the ones where ldconfig must
not run either (`require_safe`: the hook refuses the start).  The work is
bounded: MAX_INCLUDE_DEPTH and MAX_FILES here, the bytes, entries and time
in `conftree`.

`dirs_by_inode` / `existing_dirs` are the hook's one implementation of
ldconfig's "one directory per inode, first name wins" rule (ldmerge uses it).
"""

from __future__ import annotations

import errno
import posix
import stat

from pyxis_hook import pathnames
from pyxis_hook.errors import LdCacheError, PathError
from pyxis_hook.loader.conftree import LIMIT, LOOP, UNMODELLED, UNREADABLE, UNSAFE, Stop, Tree
from pyxis_hook.record import record
from pyxis_hook.rootfs import RootFS, RootPathError, resolve_in_root

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing is never imported at run time
    from typing import Iterable, Union

    Where = Union[str, RootFS]

_SPACE = " \t\n\v\f\r"
_BLANK = " \t"
#: we stop at these so a hostile image cannot make the hook or `ldcheck` run for ever (the bytes,
#: entries and time a read may take are `conftree`'s bounds)
MAX_INCLUDE_DEPTH = 64
MAX_FILES = 1024


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
    state = _State(Tree(rfs))
    try:
        state.parse(conf, 0)
    except Stop as e:
        return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files), True, (e.reason,), e.kind)
    finally:
        state.tree.close()
    if state.unmodelled:
        return LdSoConf(tuple(state.dirs), tuple(state.unmatched), tuple(state.files), True,
                        (state.unmodelled,), UNMODELLED)
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

    A lookup the host kept racing (RootFS: EAGAIN after lookup.OPENAT2_TRIES) raises its PathError:
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
            raise  # the host kept racing the lookup (lookup.OPENAT2_TRIES): not "no such directory"
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


def _magic(part: str) -> bool:
    return "*" in part or "?" in part or "[" in part


def _join(base: str, name: str) -> str:
    return base.rstrip("/") + "/" + name


class _State:
    def __init__(self, tree: Tree) -> None:
        self.tree = tree
        #: why some pattern was matched by `_widened` (the read goes on: every file it reaches is checked)
        self.unmodelled = ""
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
            raise Stop(LIMIT, f"{filename} (in {self.tree.rfs.path}){via}: includes nested more than "
                               f"{MAX_INCLUDE_DEPTH} deep")
        if self.attempts > MAX_FILES:
            raise Stop(LIMIT, f"{filename} (in {self.tree.rfs.path}){via}: more than {MAX_FILES} "
                               "configuration files included")
        got = self.tree.read(filename, via)
        if got is None:
            return  # missing (silent in ldconfig) or a directory (read as empty)
        ident, raw = got
        if ident in self.active:
            raise Stop(LOOP, f"{filename} (in {self.tree.rfs.path}){via}: includes itself (an include loop)")
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
                for name in (self.matching(base, part) if magic else (part,)):
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

    def matching(self, base: str, pattern: str) -> list[str]:
        """Names in directory `base` (resolved) that `pattern` matches, as glob(3) matches them.

        A leading dot is matched only by a pattern that starts with one; a
        bracket expression that cannot be evaluated here is matched wider
        (`_widened`) and noted in `unmodelled`.
        """
        out = []
        for name in self.tree.entries(base):
            if name.startswith(".") and not pattern.startswith("."):
                continue
            try:
                matched = name_matches(name, pattern)
            except _Unmodelled as e:
                self.unmodelled = self.unmodelled or str(e)
                matched = name_matches(name, _widened(pattern))
            if matched:
                out.append(name)
        return out


def name_matches(name: str, pattern: str) -> bool:
    """fnmatch.fnmatchcase(name, pattern), without importing fnmatch when the pattern has no `[`.

    Debian's `include /etc/ld.so.conf.d/*.conf` is read on every container
    start, and fnmatch imports `re` and the `enum` it brings, which the start
    path otherwise avoids (docs/decisions/2026-12-07-start-costs.md).
    `*` and `?` are matched here, greedily with one backtrack point as usual;
    a bracket expression goes to fnmatch itself.
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
