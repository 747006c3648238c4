"""The one way the hook calls a Linux syscall that CPython 3.11 and older glibc lack: `syscall(2)` by number.

Python 3.11 has no `os.setns`/`os.unshare` and no wrapper for any mount
syscall, and the ones that matter for safety (openat2, open_tree,
move_mount, mount_setattr, fsopen/fsmount) have no glibc wrapper on older
glibc, so everything goes through `syscall(2)` with the generic numbers
(identical on every architecture from 424 on).  The wrappers
(`lookup`, `mountapi`, `namespaces` beside this module) raise
`SyscallError` (an `InternalSignal` carrying `errno`) with one line naming the
operation, the path and the errno text, so callers can both branch on the
errno (ENOSYS -> fallback, ENOENT -> create) and show the message as is
(apply's child reports it as an `ApplyError`, RootFS as a `RootPathError`).
"""

from __future__ import annotations

import posix

from pyxis_hook import cabi, pathnames
from pyxis_hook.errors import ApplyError, InternalSignal

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000

#: syscall numbers that differ per architecture (the 4xx ones are generic)
ARCH_NR = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "statx": 332},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "statx": 291},
    # arch/powerpc/kernel/syscalls/syscall.tbl (the i386-derived numbers for mount/umount2)
    "ppc64le": {"unshare": 282, "setns": 350, "mount": 21, "umount2": 52, "statx": 383},
}
GENERIC_NR = {
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "openat2": 437,
    "mount_setattr": 442,
}


class SyscallError(InternalSignal):
    """A syscall failed; `errno` is kept so callers can pick a fallback."""

    def __init__(self, message: str, err: int):
        super().__init__(message)
        self.errno = err


_syscall = cabi.libc_function("syscall", cabi.c_long)


def nr(name: str) -> int:
    """The number of syscall `name` on this machine's architecture; ApplyError on one the hook does not know."""
    if name in GENERIC_NR:
        return GENERIC_NR[name]
    table = ARCH_NR.get(posix.uname().machine)  # not `platform`: 1+ ms of imports on the hook path
    if table is None:
        raise ApplyError(f"{name}: unsupported architecture {posix.uname().machine}")
    return table[name]


def syscall_error(what: str, path: str | None = None) -> SyscallError:
    """The SyscallError for the call that just failed (errno as `cabi.get_errno` has it), naming `what` and `path`."""
    err = cabi.get_errno()
    where = f" {path}" if path else ""
    return SyscallError(f"{what}{where}: {posix.strerror(err)}", err)


_ENCODING, _ERRORS = pathnames.FS_CODEC


def encode_path(p: str | None) -> bytes | None:
    """A path argument in the filesystem encoding (`pathnames.fsencode`, without its call for a str)."""
    if p is None:
        return None
    return p.encode(_ENCODING, _ERRORS) if p.__class__ is str else pathnames.fsencode(p)


#: the empty path of the *_EMPTY_PATH / AT_EMPTY_PATH calls (every bind's move_mount passes two)
EMPTY = cabi.c_char_p(b"")


def path_arg(p: str):
    """`p` as a C string argument; the empty one made once."""
    return EMPTY if p == "" else cabi.c_char_p(encode_path(p))


#: each syscall's number as the C argument `call` passes, made once (a 64-GPU start makes ~300 calls)
_NR_ARGS: dict = {}


def call(name: str, *args) -> int:
    """syscall(2) `name` with the C arguments `args`; its result (-1 with errno for `cabi.get_errno` on failure)."""
    number = _NR_ARGS.get(name)
    if number is None:
        number = _NR_ARGS[name] = cabi.c_long(nr(name))
    cabi.set_errno(0)
    return _syscall(number, *args)
