"""Thin ctypes-style wrappers for the Linux syscalls the hook needs and CPython 3.11 lacks.

Python 3.11 has no `os.setns`/`os.unshare` and no wrapper for any mount
syscall, and the ones that matter for safety (openat2, open_tree,
move_mount, mount_setattr, fsopen/fsmount) have no glibc wrapper on older
glibc, so everything goes through `syscall(2)` with the generic numbers
(identical on every architecture from 424 on).  Each wrapper raises
`SyscallError` (an `InternalSignal` carrying `errno`) with one line naming the
operation, the path and the errno text, so callers can both branch on the
errno (ENOSYS -> fallback, ENOENT -> create) and show the message as is
(apply's child reports it as an `ApplyError`, RootFS as a `RootPathError`).
"""

from __future__ import annotations

import errno as _errno
import posix

from pyxis_hook import pathnames
from pyxis_hook.apply import cabi
from pyxis_hook.errors import ApplyError, InternalSignal

# --- constants (linux/sched.h, linux/mount.h, linux/openat2.h, linux/prctl.h) ---
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
AT_RECURSIVE = 0x8000  # open_tree/mount_setattr: the whole subtree of mounts

OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = posix.O_CLOEXEC

MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

FSOPEN_CLOEXEC = 0x1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 0x1

RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_BENEATH = 0x08
RESOLVE_IN_ROOT = 0x10

PR_SET_PDEATHSIG = 1

#: syscall numbers that differ per architecture (the 4xx ones are generic)
_ARCH_NR = {
    "x86_64": {"unshare": 272, "setns": 308, "mount": 165, "umount2": 166, "statx": 332},
    "aarch64": {"unshare": 97, "setns": 268, "mount": 40, "umount2": 39, "statx": 291},
    # arch/powerpc/kernel/syscalls/syscall.tbl (the i386-derived numbers for mount/umount2)
    "ppc64le": {"unshare": 282, "setns": 350, "mount": 21, "umount2": 52, "statx": 383},
}
_GENERIC_NR = {
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "openat2": 437,
    "mount_setattr": 442,
}

#: Feature switches: None = not probed yet; tests set False to exercise the fallbacks.
HAVE_OPENAT2: bool | None = None
HAVE_NEW_MOUNT_API: bool | None = None


class SyscallError(InternalSignal):
    """A syscall failed; `errno` is kept so callers can pick a fallback."""

    def __init__(self, message: str, err: int):
        super().__init__(message)
        self.errno = err


_syscall = cabi.libc_function("syscall", cabi.c_long)


def _nr(name: str) -> int:
    if name in _GENERIC_NR:
        return _GENERIC_NR[name]
    table = _ARCH_NR.get(posix.uname().machine)  # not `platform`: 1+ ms of imports on the hook path
    if table is None:
        raise ApplyError(f"{name}: unsupported architecture {posix.uname().machine}")
    return table[name]


def syscall_error(what: str, path: str | None = None) -> SyscallError:
    """The SyscallError for the call that just failed (errno as `cabi.get_errno` has it), naming `what` and `path`."""
    err = cabi.get_errno()
    where = f" {path}" if path else ""
    return SyscallError(f"{what}{where}: {posix.strerror(err)}", err)


_ENCODING, _ERRORS = pathnames.FS_CODEC


def _path(p: str | None) -> bytes | None:
    """A path argument in the filesystem encoding (`pathnames.fsencode`, without its call for a str)."""
    if p is None:
        return None
    return p.encode(_ENCODING, _ERRORS) if p.__class__ is str else pathnames.fsencode(p)


#: the empty path of the *_EMPTY_PATH / AT_EMPTY_PATH calls (every bind's move_mount passes two)
_EMPTY = cabi.c_char_p(b"")


def _path_arg(p: str):
    """`p` as a C string argument; the empty one made once."""
    return _EMPTY if p == "" else cabi.c_char_p(_path(p))


#: each syscall's number as the C argument `_call` passes, made once (a 64-GPU start makes ~300 calls)
_NR_ARGS: dict = {}


def _call(name: str, *args) -> int:
    nr = _NR_ARGS.get(name)
    if nr is None:
        nr = _NR_ARGS[name] = cabi.c_long(_nr(name))
    cabi.set_errno(0)
    return _syscall(nr, *args)


def setns(fd: int, nstype: int, what: str = "") -> None:
    """Join the namespace `fd` refers to (must be single-threaded for CLONE_NEWNS)."""
    if _call("setns", cabi.c_int(fd), cabi.c_int(nstype)) != 0:
        raise syscall_error("setns", what or f"fd {fd}")


def unshare(flags: int) -> None:
    if _call("unshare", cabi.c_int(flags)) != 0:
        raise syscall_error("unshare", hex(flags))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None,
          what: str = "") -> None:
    r = _call("mount", cabi.c_char_p(_path(source)), cabi.c_char_p(_path(target)),
              cabi.c_char_p(_path(fstype)), cabi.c_ulong(flags), cabi.c_char_p(_path(data)))
    if r != 0:
        raise syscall_error("mount", what or target)


def umount2(target: str, flags: int = MNT_DETACH, what: str = "") -> None:
    if _call("umount2", cabi.c_char_p(_path(target)), cabi.c_int(flags)) != 0:
        raise syscall_error("umount", what or target)


def open_tree(dirfd: int, path: str, flags: int, what: str = "") -> int:
    r = _call("open_tree", cabi.c_int(dirfd), _path_arg(path), cabi.c_uint(flags))
    if r < 0:
        raise syscall_error("open_tree", what or path)
    return r


def move_mount(from_dirfd: int, from_path: str, to_dirfd: int, to_path: str, flags: int,
               what: str = "") -> None:
    r = _call("move_mount", cabi.c_int(from_dirfd), _path_arg(from_path),
              cabi.c_int(to_dirfd), _path_arg(to_path), cabi.c_uint(flags))
    if r != 0:
        raise syscall_error("move_mount", what or to_path)


class _MountAttr(cabi.Structure):
    _fields_ = [("attr_set", cabi.c_uint64), ("attr_clr", cabi.c_uint64),
                ("propagation", cabi.c_uint64), ("userns_fd", cabi.c_uint64)]


def mount_setattr(dirfd: int, path: str, flags: int, attr_set: int = 0, attr_clr: int = 0,
                  propagation: int = 0, what: str = "") -> None:
    attr = _MountAttr(attr_set, attr_clr, propagation, 0)
    r = _call("mount_setattr", cabi.c_int(dirfd), _path_arg(path), cabi.c_uint(flags),
              cabi.byref(attr), cabi.c_size_t(cabi.sizeof(attr)))
    if r != 0:
        raise syscall_error("mount_setattr", what or path)


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
    arg_path = _path_arg(path)
    for _ in range(OPENAT2_TRIES):
        r = _call("openat2", cabi.c_int(dirfd), arg_path, cabi.byref(how), cabi.c_size_t(cabi.sizeof(how)))
        if r >= 0:
            return r
        if cabi.get_errno() != _errno.EAGAIN:
            raise syscall_error("open", path)
    raise SyscallError(f"open {path}: {BUSY}", _errno.EAGAIN)


#: what an open that stayed EAGAIN says (RootFS does not let it through: it walks the path itself then)
BUSY = (f"the kernel asked {OPENAT2_TRIES} times in a row to retry the lookup (EAGAIN: mounts, unmounts or "
        "renames elsewhere on the host kept racing its '..' steps)")


def fsopen(fstype: str) -> int:
    r = _call("fsopen", cabi.c_char_p(_path(fstype)), cabi.c_uint(FSOPEN_CLOEXEC))
    if r < 0:
        raise syscall_error("fsopen", fstype)
    return r


def fsconfig_string(fsfd: int, key: str, value: str) -> None:
    r = _call("fsconfig", cabi.c_int(fsfd), cabi.c_uint(FSCONFIG_SET_STRING),
              cabi.c_char_p(_path(key)), cabi.c_char_p(_path(value)), cabi.c_int(0))
    if r != 0:
        raise syscall_error("fsconfig", f"{key}={value}")


def fsconfig_create(fsfd: int) -> None:
    r = _call("fsconfig", cabi.c_int(fsfd), cabi.c_uint(FSCONFIG_CMD_CREATE),
              cabi.c_char_p(None), cabi.c_char_p(None), cabi.c_int(0))
    if r != 0:
        raise syscall_error("fsconfig", "create")


def fsmount(fsfd: int, attr_flags: int) -> int:
    r = _call("fsmount", cabi.c_int(fsfd), cabi.c_uint(FSMOUNT_CLOEXEC), cabi.c_uint(attr_flags))
    if r < 0:
        raise syscall_error("fsmount", "")
    return r


#: glibc's wrapper, looked up now: a child that calls it may be chrooted into an image
_prctl = cabi.libc_function("prctl", cabi.c_int)


def prctl(option: int, arg: int = 0, arg3: int = 0) -> int:
    """prctl(2) with up to two arguments; returns its (non-negative) result."""
    cabi.set_errno(0)
    r = _prctl(cabi.c_int(option), cabi.c_ulong(arg), cabi.c_ulong(arg3), cabi.c_ulong(0), cabi.c_ulong(0))
    if r < 0:
        raise syscall_error("prctl", str(option))
    return r


#: set by `enter_mount_ns`: the working directory is then this process's own procfs (the host's),
#: and the magic links of its fds are named relative to it
_PROC_ANCHORED = False


def enter_mount_ns(ns_fd: int, what: str = "container mount namespace") -> None:
    """setns(CLONE_NEWNS) into `ns_fd`, keeping this process's own procfs as the working directory.

    Why: after setns, `/proc` is whatever the container's namespace has there.
    A runtime that runs hooks after pivot_root (Apptainer's OCI engine runs
    createRuntime there) leaves the container's own procfs there, of the
    container's PID namespace, where `/proc/self` of a host process names
    nothing: every reopen through `/proc/self/fd` would fail with ENOENT.
    The host's procfs, opened before the switch, stays usable as the cwd
    (setns resets the cwd to the namespace's root; fchdir takes it back).
    """
    global _PROC_ANCHORED, _ENTERED
    proc = posix.open("/proc", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    try:
        setns(ns_fd, CLONE_NEWNS, what)
        _ENTERED = True
        posix.fchdir(proc)
    finally:
        posix.close(proc)
    _PROC_ANCHORED = True


#: set by `enter_mount_ns` once setns succeeded, cleared by `leave_mount_ns`
_ENTERED = False

#: ioctl(2) on a namespace fd: an fd of the user namespace that owns it (Linux >= 4.9)
NS_GET_USERNS = 0xB701

_ioctl = cabi.libc_function("ioctl", cabi.c_int)


def owned_by_own_userns(ns_fd: int) -> bool:
    """Whether the namespace `ns_fd` belongs to this process's own user namespace.

    setns(2) needs CAP_SYS_ADMIN in the user namespace that owns the target:
    a process may enter a container's mount namespace (owned by a user
    namespace it has that capability in) and still be refused its way back
    into its own when that one belongs to an ancestor user namespace.  False
    when the kernel cannot tell (before 4.9).
    """
    cabi.set_errno(0)
    owner = _ioctl(cabi.c_int(ns_fd), cabi.c_ulong(NS_GET_USERNS))
    if owner < 0:
        return False
    try:
        a, b = posix.fstat(owner), posix.stat("/proc/self/ns/user")
    except OSError:
        return False
    finally:
        posix.close(owner)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def leave_mount_ns(home_ns: int, root_fd: int, cwd_fd: int) -> None:
    """Undo `enter_mount_ns`: back into `home_ns`, with the root and working directory held as fds.

    setns(CLONE_NEWNS) sets the root and the working directory to the
    namespace's root; a hook that ran chrooted is put back into its own root
    (fchdir + chroot("."), as nsenter(1) does), then into its directory.
    Nothing when `enter_mount_ns` did not get as far as setns.
    """
    global _PROC_ANCHORED, _ENTERED
    if not _ENTERED:
        return
    setns(home_ns, CLONE_NEWNS, "the hook's own mount namespace")
    _ENTERED = _PROC_ANCHORED = False
    here, want = posix.stat("/"), posix.fstat(root_fd)
    if (here.st_dev, here.st_ino) != (want.st_dev, want.st_ino):
        posix.fchdir(root_fd)
        posix.chroot(".")
    posix.fchdir(cwd_fd)


def proc_self_path(name: str) -> str:
    """`/proc/self/<name>` of this process: relative to the host's procfs once `enter_mount_ns` anchored
    the cwd there, absolute otherwise."""
    return f"self/{name}" if _PROC_ANCHORED else f"/proc/self/{name}"


#: statx(2) (linux/stat.h): the mask bit of `stx_mnt_id` (Linux >= 5.8), and the fd itself as the file
STATX_MNT_ID = 0x1000
_STATX_ARGS: tuple | None = None
#: None: not tried yet; False: this kernel (or a seccomp profile) gives no mount id through statx
HAVE_STATX_MNT_ID: bool | None = None


def _statx_mount_id(fd: int) -> int | None:
    """`stx_mnt_id` of `fd` in one statx(AT_EMPTY_PATH) call; None where statx cannot tell it.

    The 256 bytes of struct statx are a u64 grown in place (`cabi.resize`, ctypes'
    own way to enlarge an object's buffer), read as 32 u64 words through one
    memoryview: a Structure type for it would cost ~150,000 instructions to make.
    Word 0 holds `stx_mask`, word 18 `stx_mnt_id`.  Made on first use: a start
    that creates nothing in the rootfs asks nothing.
    """
    global _STATX_ARGS, HAVE_STATX_MNT_ID
    if HAVE_STATX_MNT_ID is False:
        return None
    if _STATX_ARGS is None:
        buf = cabi.c_uint64()
        cabi.resize(buf, 256)
        _STATX_ARGS = (_EMPTY, cabi.c_int(AT_EMPTY_PATH), cabi.c_uint(STATX_MNT_ID), cabi.byref(buf),
                       memoryview(buf).cast("B").cast("Q"))
    empty, flags, mask, ref, words = _STATX_ARGS
    if _call("statx", cabi.c_int(fd), empty, flags, mask, ref) != 0:
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


def proc_fd_path(fd: int) -> str:
    """The magic-link name of an fd, for syscalls that only take paths (legacy mount, a reopen)."""
    return proc_self_path(f"fd/{fd}")


def reopen(fd: int, flags: int) -> int:
    """Open the inode an (O_PATH) fd holds again, with `flags` (O_CLOEXEC added), through its magic link."""
    return posix.open(proc_fd_path(fd), flags | posix.O_CLOEXEC)


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


def have_new_mount_api() -> bool:
    """Probe open_tree/move_mount/mount_setattr (kernel >= 5.12 for mount_setattr)."""
    global HAVE_NEW_MOUNT_API
    if HAVE_NEW_MOUNT_API is None:
        ok = True
        for name, args in (("open_tree", (cabi.c_int(-1), cabi.c_char_p(b""), cabi.c_uint(0))),
                           ("mount_setattr", (cabi.c_int(-1), cabi.c_char_p(b""), cabi.c_uint(0),
                                              cabi.c_char_p(None), cabi.c_size_t(0)))):
            if _call(name, *args) < 0 and cabi.get_errno() in (_errno.ENOSYS, _errno.EPERM):
                ok = False
        HAVE_NEW_MOUNT_API = ok
    return HAVE_NEW_MOUNT_API
