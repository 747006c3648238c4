"""POSIX path strings without importing `os`: the `os.path` functions a GPU start uses.

Why: a GPU start (`prestart`, once per container) avoids `import os`, which
imports `_collections_abc` (its ABC classes) and runs its own body
(docs/decisions/2026-12-07-start-costs.md).  Everything else the start needs from
`os` is in `posix`, os's builtin C core that the interpreter has already imported;
what `posix` lacks are these path-string functions and fsencode/fsdecode.

The specification is CPython 3.11's `Lib/posixpath.py` (and
`Lib/genericpath.py`, `Lib/os.py` for fsencode/fsdecode): each function
here gives what its namesake gives for `str` (and path-like) arguments,
including `realpath`'s non-strict handling of nonexistent tails and symlink
loops, since the node artifact's freshness compares its `realpath` of the driver root with
the one discovery stored.  tests/unit/base/test_pathnames.py checks each
against its namesake.  Modules off the start path use `os` as usual.
"""

from __future__ import annotations

import posix
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path
    from os import PathLike
    from typing import Union

    StrPath = Union[str, PathLike[str]]  # an alias, not a hint: `|` here needs Python 3.10

_S_IFMT = 0o170000
_S_IFDIR = 0o040000
_S_IFREG = 0o100000
_S_IFLNK = 0o120000

# os.fsencode/os.fsdecode: the interpreter's filesystem encoding and its error handler
_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()
#: (encoding, errors) as `fsencode` uses them, for a caller that encodes a str itself (no call per path)
FS_CODEC = (_FS_ENCODING, _FS_ERRORS)


def fsencode(filename: str | bytes | PathLike[str] | PathLike[bytes]) -> bytes:
    """`os.fsencode`: a str in the filesystem encoding (surrogateescape), bytes unchanged."""
    name = posix.fspath(filename)
    return name.encode(_FS_ENCODING, _FS_ERRORS) if isinstance(name, str) else name


def fsdecode(filename: str | bytes | PathLike[str] | PathLike[bytes]) -> str:
    """`os.fsdecode`: bytes from the filesystem encoding (surrogateescape), a str unchanged."""
    name = posix.fspath(filename)
    return name.decode(_FS_ENCODING, _FS_ERRORS) if isinstance(name, bytes) else name


def join(a: StrPath, *p: StrPath) -> str:
    """`os.path.join`: an absolute part discards what came before; '/' inserted as needed."""
    path: str = posix.fspath(a)
    for b in p:
        b = posix.fspath(b)
        if b.startswith("/"):
            path = b
        elif not path or path.endswith("/"):
            path += b
        else:
            path += "/" + b
    return path


def split(p: StrPath) -> tuple[str, str]:
    """`os.path.split`: (head, tail) at the last '/'; the head's trailing slashes go unless all slashes."""
    p = posix.fspath(p)
    i = p.rfind("/") + 1
    head, tail = p[:i], p[i:]
    if head and head != "/" * len(head):
        head = head.rstrip("/")
    return head, tail


def basename(p: StrPath) -> str:
    """`os.path.basename`: what follows the last '/'."""
    p = posix.fspath(p)
    return p[p.rfind("/") + 1:]


def dirname(p: StrPath) -> str:
    """`os.path.dirname`: split(p)[0]."""
    return split(p)[0]


#: posixpath's own normpath on CPython >= 3.11 (C); None before, where `_normpath_str` stands in
_C_NORMPATH = getattr(posix, "_path_normpath", None)


def normpath(path: StrPath) -> str:
    """`os.path.normpath`: no '.', no 'x/..', no repeated '/' (but a leading '//' stays).

    CPython >= 3.11: posixpath's own implementation, the C `posix._path_normpath`; before, `_normpath_str`.
    """
    if _C_NORMPATH is not None:
        return _C_NORMPATH(posix.fspath(path)) or "."
    return _normpath_str(posix.fspath(path))


def _normpath_str(path: str) -> str:
    """posixpath.normpath for a str as Python code (CPython 3.10's, and 3.11+'s fallback without the C one)."""
    if not path:
        return "."
    initial_slashes = 1 if path.startswith("/") else 0
    # POSIX allows one or two initial slashes, but treats three or more as a single slash
    if initial_slashes and path.startswith("//") and not path.startswith("///"):
        initial_slashes = 2
    comps: list[str] = []
    for comp in path.split("/"):
        if comp in ("", "."):
            continue
        if comp != ".." or (not initial_slashes and not comps) or (comps and comps[-1] == ".."):
            comps.append(comp)
        elif comps:
            comps.pop()
    path = "/".join(comps)
    if initial_slashes:
        path = "/" * initial_slashes + path
    return path or "."


def abspath(path: StrPath) -> str:
    """`os.path.abspath`: normpath of the path, joined to the working directory when relative."""
    path = posix.fspath(path)
    if not path.startswith("/"):
        path = join(posix.getcwd(), path)
    return normpath(path)


def realpath(filename: StrPath) -> str:
    """`os.path.realpath` (non-strict): symlinks resolved; a missing tail or a loop is kept as written."""
    filename = posix.fspath(filename)
    path, _ = _joinrealpath("", filename, {})
    return abspath(path)


def _joinrealpath(path: str, rest: str, seen: dict[str, str | None]) -> tuple[str, bool]:
    """posixpath._joinrealpath with strict=False: `rest` resolved onto the resolved `path`."""
    if rest.startswith("/"):
        rest = rest[1:]
        path = "/"
    while rest:
        name, _, rest = rest.partition("/")
        if not name or name == ".":
            continue
        if name == "..":
            if path:
                path, name = split(path)
                if name == "..":
                    path = join(path, "..", "..")
            else:
                path = ".."
            continue
        newpath = join(path, name)
        try:
            is_link = posix.lstat(newpath).st_mode & _S_IFMT == _S_IFLNK
        except OSError:
            is_link = False
        if not is_link:
            path = newpath
            continue
        if newpath in seen:
            known = seen[newpath]
            if known is not None:
                path = known
                continue
            return join(newpath, rest), False  # a loop: the resolved part and the rest as written
        seen[newpath] = None
        path, ok = _joinrealpath(path, posix.readlink(newpath), seen)
        if not ok:
            return join(path, rest), False
        seen[newpath] = path
    return path, True


def _mode(path: StrPath, follow: bool = True) -> int:
    """The file type bits of what the path names (0 when it cannot be stat'ed: OSError, or a NUL's ValueError).

    Never 0 for something that exists, so it answers every question below.
    """
    try:
        st = posix.stat(path, follow_symlinks=follow)
    except (OSError, ValueError):
        return 0
    return st.st_mode & _S_IFMT


def exists(path: StrPath) -> bool:
    """`os.path.exists`: stat succeeds (False for a dangling symlink)."""
    return _mode(path) != 0


def lexists(path: StrPath) -> bool:
    """`os.path.lexists`: lstat succeeds (True for a dangling symlink)."""
    return _mode(path, follow=False) != 0


def isdir(path: StrPath) -> bool:
    """`os.path.isdir`: a directory, following symlinks."""
    return _mode(path) == _S_IFDIR


def isfile(path: StrPath) -> bool:
    """`os.path.isfile`: a regular file, following symlinks."""
    return _mode(path) == _S_IFREG
