"""The read side of the syscall wrappers: open a path without following it out of a root, tell an fd's mount.

Nothing here changes the system's state: `openat2` (RESOLVE_IN_ROOT and
friends) with its probe `have_openat2`, the mount id of an fd (`mount_id`:
statx or the fd's fdinfo), and the `/proc/self` names of this process's fds.
So the base (`rootfs`), host/ and diag/ may call them; the calls with effects
(`mountapi`, `namespaces`, `process` beside this module) are apply/'s.
Each raises `syscall.SyscallError` as the other wrappers do.
"""

from __future__ import annotations

import errno as _errno
import posix

from pyxis_hook.errors import ApplyError
from pyxis_hook import cabi
from pyxis_hook.kernel import syscall
from pyxis_hook.kernel.syscall import AT_EMPTY_PATH, AT_FDCWD, SyscallError

# linux/openat2.h
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

#: Feature switch: None = not probed yet; tests set False to exercise the fallbacks.
HAVE_OPENAT2: bool | None = None


class _OpenHow(cabi.Structure):
    _fields_ = [("flags", cabi.c_uint64), ("mode", cabi.c_uint64), ("resolve", cabi.c_uint64)]


#: How often openat2 is tried when the kernel answers EAGAIN.  With RESOLVE_IN_ROOT (or BENEATH)
#: every `..` step of the walk checks that no mount, unmount or rename happened anywhere on the
#: system since the walk began (fs/namei.c, mount_lock and rename_lock), and returns EAGAIN if one
#: did: "the caller may choose to retry" (openat2(2)).  On a node that starts containers that is
#: routine (measured: 3% of opens through a `../..` link failed while another process mounted and
#: unmounted a tmpfs in a loop); after OPENAT2_TRIES in a row `RootFS.open` walks the path itself,
#: one component at a time, which no such race can make fail.
OPENAT2_TRIES = 64


def openat2(dirfd: int, path: str, flags: int, mode: int = 0, resolve: int = 0) -> int:
    """openat2(2), retried on EAGAIN (`OPENAT2_TRIES`); raises SyscallError (ENOSYS on kernels < 5.6)."""
    how = _OpenHow(flags | posix.O_CLOEXEC, mode, resolve)
    arg_path = syscall.path_arg(path)
    for _ in range(OPENAT2_TRIES):
        r = syscall.call("openat2", cabi.c_int(dirfd), arg_path, cabi.byref(how), cabi.c_size_t(cabi.sizeof(how)))
        if r >= 0:
            return r
        if cabi.get_errno() != _errno.EAGAIN:
            raise syscall.syscall_error("open", path)
    raise SyscallError(f"open {path}: {BUSY}", _errno.EAGAIN)


#: what an open that stayed EAGAIN says (RootFS does not let it through: it walks the path itself then)
BUSY = (f"the kernel asked {OPENAT2_TRIES} times in a row to retry the lookup (EAGAIN: mounts, unmounts or "
        "renames elsewhere on the host kept racing its '..' steps)")


def have_openat2() -> bool:
    """Probe openat2 once (ENOSYS on kernels < 5.6, EPERM under some seccomp profiles)."""
    global HAVE_OPENAT2
    if HAVE_OPENAT2 is None:
        try:
            posix.close(openat2(AT_FDCWD, "/", posix.O_PATH, 0, 0))
            HAVE_OPENAT2 = True
        except SyscallError as e:
            HAVE_OPENAT2 = e.errno not in (_errno.ENOSYS, _errno.EPERM)
    return HAVE_OPENAT2


#: set by `anchor_proc` (`namespaces.enter_mount_ns`): the working directory is then this process's
#: own procfs (the host's), and the magic links of its fds are named relative to it
_PROC_ANCHORED = False


def anchor_proc(anchored: bool) -> None:
    """Tell `proc_self_path` whether the working directory is this process's own procfs (True) or not."""
    global _PROC_ANCHORED
    _PROC_ANCHORED = anchored


def proc_self_path(name: str) -> str:
    """`/proc/self/<name>` of this process: relative to the host's procfs once `enter_mount_ns` anchored
    the cwd there, absolute otherwise."""
    return f"self/{name}" if _PROC_ANCHORED else f"/proc/self/{name}"


def proc_fd_path(fd: int) -> str:
    """The magic-link name of an fd, for syscalls that only take paths (legacy mount, a reopen)."""
    return proc_self_path(f"fd/{fd}")


def reopen(fd: int, flags: int) -> int:
    """Open the inode an (O_PATH) fd holds again, with `flags` (O_CLOEXEC added), through its magic link."""
    return posix.open(proc_fd_path(fd), flags | posix.O_CLOEXEC)


#: statx(2) (linux/stat.h): the mask bit of `stx_mnt_id` (Linux >= 5.8), and the fd itself as the file
STATX_MNT_ID = 0x1000
_STATX_ARGS: tuple | None = None
#: None: not tried yet; False: this kernel (or a seccomp profile) gives no mount id through statx
HAVE_STATX_MNT_ID: bool | None = None


def _statx_mount_id(fd: int) -> int | None:
    """`stx_mnt_id` of `fd` in one statx(AT_EMPTY_PATH) call; None where statx cannot tell it.

    The 256 bytes of struct statx are a u64 grown in place (`cabi.resize`, ctypes'
    own way to enlarge an object's buffer), read as 32 u64 words through one
    memoryview, not a Structure type, whose creation a start would pay
    (docs/decisions/2026-12-07-start-costs.md).
    Word 0 holds `stx_mask`, word 18 `stx_mnt_id`.  Made on first use: a start
    that creates nothing in the rootfs asks nothing.
    """
    global _STATX_ARGS, HAVE_STATX_MNT_ID
    if HAVE_STATX_MNT_ID is False:
        return None
    if _STATX_ARGS is None:
        buf = cabi.c_uint64()
        cabi.resize(buf, 256)
        _STATX_ARGS = (syscall.EMPTY, cabi.c_int(AT_EMPTY_PATH), cabi.c_uint(STATX_MNT_ID), cabi.byref(buf),
                       memoryview(buf).cast("B").cast("Q"))
    empty, flags, mask, ref, words = _STATX_ARGS
    if syscall.call("statx", cabi.c_int(fd), empty, flags, mask, ref) != 0:
        if cabi.get_errno() in (_errno.ENOSYS, _errno.EPERM):  # before 4.11, or refused by seccomp
            HAVE_STATX_MNT_ID = False
        return None
    if not words[0] & STATX_MNT_ID:  # before 5.8: the kernel filled in everything but the mount id
        HAVE_STATX_MNT_ID = False
        return None
    HAVE_STATX_MNT_ID = True
    return words[18]


def mount_id(fd: int, proc_self: str | None = None) -> int:
    """The id of the mount `fd` is on, as mountinfo numbers it (`stx_mnt_id`, or `mnt_id` of the fd's fdinfo).

    One statx call (Linux >= 5.8) where it tells; else read through
    `proc_self` (a `/proc/self` path) or this process's own procfs
    (`proc_self_path`) with `posix` calls (Linux >= 3.15).  Both give the
    same id (the kernel's `mnt_id` of the mount).  Nothing is imported, so it
    also runs after setns; a start asks this for every directory it creates
    in, where statx is one syscall and the fdinfo read three.  `proc_self`
    names the procfs to read, so with it the fdinfo is always what is read.
    """
    if proc_self is None:
        got = _statx_mount_id(fd)
        if got is not None:
            return got
    path = f"{proc_self}/fdinfo/{fd}" if proc_self else proc_self_path(f"fdinfo/{fd}")
    info = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
    try:
        data = posix.read(info, 4096)
    finally:
        posix.close(info)
    for line in data.splitlines():
        if line.startswith(b"mnt_id:"):
            return int(line.split()[1])
    raise ApplyError(f"no mnt_id in {path}")
