"""The three libc calls the confined ldconfig runner needs beyond `posix`: memfd seals, rlimits, poll.

Why not the stdlib's `fcntl`, `resource` and `select`: each is an extension
module, a shared library the loader maps and relocates, ~0.6 ms of every GPU
start together, and a start must have them loaded before it enters the
container's mount namespace (apply's child imports nothing there) although
only a merge that cannot model the image ever runs ldconfig.  `_ctypes`,
which the syscalls need anyway (`cabi`), calls the same libc functions.

The constants are the kernel's ABI for every architecture the hook supports
(`kernel._ARCH_NR`: x86_64, aarch64, ppc64le all take them from
include/uapi/asm-generic): <linux/fcntl.h> F_ADD_SEALS and the F_SEAL_*
bits, asm-generic/resource.h's RLIMIT_* numbers and RLIM_INFINITY,
asm-generic/poll.h's POLL* bits.  tests/unit/apply/test_runnercalls.py
checks each against the stdlib module that names it.
"""

from __future__ import annotations

import posix

from pyxis_hook.apply import cabi

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

_EINTR = 4

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
        if cabi.get_errno() == _EINTR:
            return []
        raise _error("poll")
    return [(slot.fd, slot.revents) for slot in array if slot.revents]
