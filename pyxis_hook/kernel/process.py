"""Calls on the calling process and its fds that `posix` lacks: prctl, capabilities, rlimits, memfd seals, poll.

Why not the stdlib's `fcntl`, `resource` and `select`: each is an extension
module, a shared library the loader maps and relocates
(docs/decisions/2026-12-07-start-costs.md), and a start must have them
loaded before it enters the container's mount namespace (apply's child
imports nothing there) although only a merge that cannot model the image ever runs ldconfig (the confined
runner, `apply/confined.py`, is what calls most of them).  `_ctypes`, which
the syscalls need anyway (`cabi`), calls the same libc functions.

The constants are the kernel's ABI for every architecture the hook supports
(`syscall.ARCH_NR`: x86_64, aarch64, ppc64le all take them from
include/uapi/asm-generic): <linux/fcntl.h> F_ADD_SEALS and the F_SEAL_*
bits, asm-generic/resource.h's RLIMIT_* numbers and RLIM_INFINITY,
asm-generic/poll.h's POLL* bits.  tests/unit/kernel/test_process.py
checks each against the stdlib module that names it.  The capability calls
(capget/capset, the bounding and ambient sets through prctl, no_new_privs:
linux/capability.h, linux/prctl.h) drop what the runner must not keep; they
raise `syscall.SyscallError`, as the other syscall wrappers do.  They change
this process's privileges, so only apply/ imports this module (setup.cfg's
kernel contract).
"""
from __future__ import annotations

import errno as _errno
import posix

from pyxis_hook import cabi
from pyxis_hook.kernel import syscall
from pyxis_hook.kernel.syscall import SyscallError

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only
    from typing import Any

F_ADD_SEALS = 1024 + 9  # F_LINUX_SPECIFIC_BASE + 9
F_SEAL_SEAL = 0x0001
F_SEAL_SHRINK = 0x0002
F_SEAL_GROW = 0x0004
F_SEAL_WRITE = 0x0008

RLIMIT_CPU = 0
RLIMIT_FSIZE = 1
RLIMIT_CORE = 4
RLIMIT_NOFILE = 7
RLIMIT_AS = 9
RLIM_INFINITY = (1 << 64) - 1  # (rlim_t)~0UL on LP64

POLLIN = 0x0001

PR_SET_PDEATHSIG = 1

PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4

# linux/capability.h: the bits apply/confined.py keeps, and the one needed to drop the others
CAP_CHOWN = 0
CAP_DAC_OVERRIDE = 1
CAP_DAC_READ_SEARCH = 2
CAP_FOWNER = 3
CAP_SETPCAP = 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522


_fcntl = cabi.libc_function("fcntl", cabi.c_int)
_getrlimit = cabi.libc_function("getrlimit", cabi.c_int)
_setrlimit = cabi.libc_function("setrlimit", cabi.c_int)
_poll = cabi.libc_function("poll", cabi.c_int)


def _error(what: str) -> OSError:
    err = cabi.get_errno()
    return OSError(err, f"{what}: {posix.strerror(err)}")


def add_seals(fd: int, seals: int) -> None:
    """fcntl(fd, F_ADD_SEALS, seals), as `fcntl.fcntl` would make it (OSError on failure)."""
    cabi.set_errno(0)
    if _fcntl(cabi.c_int(fd), cabi.c_int(F_ADD_SEALS), cabi.c_int(seals)) < 0:
        raise _error("fcntl(F_ADD_SEALS)")


# the structures are made on first use (`cabi.made`): only a run of ldconfig (a merge that cannot
# model the image) needs them


def _rlimit() -> Any:
    return cabi.made("_Rlimit", [("cur", cabi.c_ulong), ("max", cabi.c_ulong)])


def _pollfd() -> Any:
    short = cabi.made("c_short")
    return cabi.made("_PollFd", [("fd", cabi.c_int), ("events", short), ("revents", short)])


def getrlimit(resource: int) -> tuple[int, int]:
    """(soft, hard), as `resource.getrlimit` gives them (RLIM_INFINITY for no limit)."""
    lim = _rlimit()()
    cabi.set_errno(0)
    if _getrlimit(cabi.c_int(resource), cabi.byref(lim)) != 0:
        raise _error(f"getrlimit({resource})")
    return lim.cur, lim.max


def setrlimit(resource: int, soft: int, hard: int) -> None:
    """setrlimit(2) of this process, as `resource.setrlimit(resource, (soft, hard))`."""
    lim = _rlimit()(soft, hard)
    cabi.set_errno(0)
    if _setrlimit(cabi.c_int(resource), cabi.byref(lim)) != 0:
        raise _error(f"setrlimit({resource})")


def poll(fds: list[int], timeout_ms: int) -> list[tuple[int, int]]:
    """(fd, revents) of each fd of `fds` with an event, waiting at most `timeout_ms` for POLLIN.

    What `select.poll` with each fd registered for POLLIN returns, except
    that a signal ends the wait early with no event (the caller's loop,
    which recomputes its deadline, then calls again; PEP 475's retry).
    """
    array = (_pollfd() * len(fds))()
    for slot, fd in zip(array, fds):
        slot.fd = fd
        slot.events = POLLIN
    cabi.set_errno(0)
    n = _poll(cabi.byref(array), cabi.c_ulong(len(fds)), cabi.c_int(timeout_ms))
    if n < 0:
        if cabi.get_errno() == _errno.EINTR:
            return []
        raise _error("poll")
    return [(slot.fd, slot.revents) for slot in array if slot.revents]


#: glibc's wrapper, looked up now: a child that calls it may be chrooted into an image
_prctl = cabi.libc_function("prctl", cabi.c_int)


def prctl(option: int, arg: int = 0, arg3: int = 0) -> int:
    """prctl(2) with up to two arguments; returns its (non-negative) result."""
    cabi.set_errno(0)
    r = _prctl(cabi.c_int(option), cabi.c_ulong(arg), cabi.c_ulong(arg3), cabi.c_ulong(0), cabi.c_ulong(0))
    if r < 0:
        raise syscall.syscall_error("prctl", str(option))
    return r


# ------------------------------------------------------------------ capabilities


def no_new_privs() -> None:
    """PR_SET_NO_NEW_PRIVS: nothing exec'd after this can gain privileges (setuid, file caps)."""
    prctl(PR_SET_NO_NEW_PRIVS, 1)


def _cap_structs() -> tuple:
    """capget/capset's header and data structures, made on first use (`cabi.made`): only the confined ldconfig run needs them."""
    return (cabi.made("_CapHeader", [("version", cabi.c_uint32), ("pid", cabi.c_int)]),
            cabi.made("_CapData", [("effective", cabi.c_uint32), ("permitted", cabi.c_uint32),
                                   ("inheritable", cabi.c_uint32)]))


#: glibc's wrappers (same on every architecture), looked up now: the child that calls them may
#: be chrooted into an image, where nothing should need resolving
_capget = cabi.libc_function("capget", cabi.c_int)
_capset = cabi.libc_function("capset", cabi.c_int)


def capget(pid: int = 0) -> tuple[int, int, int]:
    """(effective, permitted, inheritable) of `pid` (0: this thread) as 64-bit masks (v3 header)."""
    header, cap_data = _cap_structs()
    head = header(_LINUX_CAPABILITY_VERSION_3, pid)
    data = (cap_data * 2)()
    cabi.set_errno(0)
    if _capget(cabi.byref(head), data) != 0:
        raise syscall.syscall_error("capget", str(pid))
    lo, hi = data[0], data[1]
    return (lo.effective | hi.effective << 32, lo.permitted | hi.permitted << 32,
            lo.inheritable | hi.inheritable << 32)


def capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set this thread's capability sets (64-bit masks, v3 header); raising any is EPERM."""
    header, cap_data = _cap_structs()
    head = header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (cap_data * 2)()
    for i in (0, 1):
        shift = 32 * i
        data[i].effective = (effective >> shift) & 0xFFFFFFFF
        data[i].permitted = (permitted >> shift) & 0xFFFFFFFF
        data[i].inheritable = (inheritable >> shift) & 0xFFFFFFFF
    cabi.set_errno(0)
    if _capset(cabi.byref(head), data) != 0:
        raise syscall.syscall_error("capset", f"effective={effective:#x} permitted={permitted:#x}")


def cap_last_cap() -> int:
    """The highest capability this kernel knows (/proc/sys/kernel/cap_last_cap), without /proc.

    PR_CAPBSET_READ fails with EINVAL past the last one, as libcap probes
    it: the chrooted child that asks has no procfs to read.
    """
    cap = 0
    while cap < 63:
        try:
            prctl(PR_CAPBSET_READ, cap + 1)
        except SyscallError as e:
            if e.errno != _errno.EINVAL:
                raise
            break
        cap += 1
    return cap


def capbset_has(cap: int) -> bool:
    """Whether `cap` is in this thread's bounding set."""
    return prctl(PR_CAPBSET_READ, cap) == 1


def capbset_drop(cap: int) -> None:
    """Remove `cap` from the bounding set for good (needs CAP_SETPCAP in the effective set)."""
    prctl(PR_CAPBSET_DROP, cap)


def clear_ambient() -> None:
    """Empty the ambient set (EINVAL before Linux 4.3, which has none: nothing to clear)."""
    try:
        prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    except SyscallError as e:
        if e.errno != _errno.EINVAL:
            raise
