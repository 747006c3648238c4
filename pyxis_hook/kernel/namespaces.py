"""Namespace syscalls: setns/unshare, and entering a container's mount namespace and coming back.

They change which namespaces the calling process is in, so only apply/
imports this module (setup.cfg's kernel contract).  Each raises
`syscall.SyscallError` naming the call and its target.
"""

from __future__ import annotations

import posix

from pyxis_hook import cabi
from pyxis_hook.kernel import lookup, syscall

# --- constants (linux/sched.h) ---
CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000


def setns(fd: int, nstype: int, what: str = "") -> None:
    """Join the namespace `fd` refers to (must be single-threaded for CLONE_NEWNS)."""
    if syscall.call("setns", cabi.c_int(fd), cabi.c_int(nstype)) != 0:
        raise syscall.syscall_error("setns", what or f"fd {fd}")


def unshare(flags: int) -> None:
    if syscall.call("unshare", cabi.c_int(flags)) != 0:
        raise syscall.syscall_error("unshare", hex(flags))


def enter_mount_ns(ns_fd: int, what: str = "container mount namespace") -> None:
    """setns(CLONE_NEWNS) into `ns_fd`, keeping this process's own procfs as the working directory.

    Why: after setns, `/proc` is whatever the container's namespace has there.
    A runtime that runs hooks after pivot_root (Apptainer's OCI engine runs
    createRuntime there) leaves the container's own procfs there, of the
    container's PID namespace, where `/proc/self` of a host process names
    nothing: every reopen through `/proc/self/fd` would fail with ENOENT.
    The host's procfs, opened before the switch, stays usable as the cwd
    (setns resets the cwd to the namespace's root; fchdir takes it back),
    and `lookup.proc_self_path` names `/proc/self` relative to it.
    """
    global _ENTERED
    proc = posix.open("/proc", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    try:
        setns(ns_fd, CLONE_NEWNS, what)
        _ENTERED = True
        posix.fchdir(proc)
    finally:
        posix.close(proc)
    lookup.anchor_proc(True)


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
    global _ENTERED
    if not _ENTERED:
        return
    setns(home_ns, CLONE_NEWNS, "the hook's own mount namespace")
    _ENTERED = False
    lookup.anchor_proc(False)
    here, want = posix.stat("/"), posix.fstat(root_fd)
    if (here.st_dev, here.st_ino) != (want.st_dev, want.st_ino):
        posix.fchdir(root_fd)
        posix.chroot(".")
    posix.fchdir(cwd_fd)
