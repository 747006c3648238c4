"""One fault armed in the hook that real runc runs: the n-th call of one apply step fails, kills the hook, or stalls.

Nothing of this is in the product: `hook.py` (this directory) imports this
module, arms the fault named by `PYXIS_FAULT` (set in the hook's `env` in
config.json, which only a test writes) and then runs pyxis_hook/__main__.py
as the runtime would.  The patches are module attributes (`mountapi.mount`,
`posix.symlink`, ...) set before the hook starts, so apply's forked child and the
confined ldconfig's runner inherit them.  Everything a patch calls is
imported here, on the host: the child refuses imports after setns.

PYXIS_FAULT = "STEP[=ARG]:N:ACTION"

STEP: mount (mountapi.move_mount/mount: each bind, the /proc view), link
(posix.symlink: a SONAME or dev link, made under a temp name), cgroup (the
write of a rule to devices.allow), cache (the rename that puts the new
ld.so.cache in place), ldconfig (the confined run of the host ldconfig:
its exec fails; `kill` kills the hook once its runner is forked),
read=SUBSTR (builtins.open/posix.open of a path containing SUBSTR, for reading).

ACTION: fail (the call raises EIO, or EACCES for `read`), kill (SIGKILL to
the hook's own process and the caller: what a kill -9 or the OOM killer
does to the hook at that point), sleep (stall 60 s there: runc's hook
timeout).
"""

from __future__ import annotations

import builtins
import errno
import os
import posix  # what the hook's modules call (they do not import os): the patches go here
import signal
import time

from pyxis_hook.apply import confined
from pyxis_hook.kernel import mountapi, syscall

HOOK_PID = os.getpid()
SLEEP_S = 60


class Fault:
    """The armed fault and its call count (per process: a forked child counts on from the fork)."""

    def __init__(self, spec: str) -> None:
        step, n, self.action = spec.split(":")
        self.step, _, self.arg = step.partition("=")
        self.n = int(n)
        self.seen = 0
        if self.action not in ("fail", "kill", "sleep"):
            raise ValueError(f"PYXIS_FAULT: unknown action {self.action!r}")

    def hit(self) -> bool:
        """Count one call of the step; True when this is the one to fault (N = 0: every one)."""
        self.seen += 1
        return self.seen == self.n or self.n == 0

    def act(self, err: int = errno.EIO) -> None:
        if self.action == "kill":
            kill_hook()
        elif self.action == "sleep":
            time.sleep(SLEEP_S)
        else:
            raise OSError(err, os.strerror(err) + " (injected)")


def kill_hook() -> None:
    """SIGKILL the hook's process (runc's child), then the caller (apply's child) if that is another."""
    os.kill(HOOK_PID, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _syscall_error(fault: Fault, what: str):
    """A kernel.* call that fails as the real wrapper does: SyscallError, one line."""
    try:
        fault.act()
    except OSError as e:
        raise syscall.SyscallError(f"{what}: {e.strerror}", e.errno) from None


def arm(spec: str) -> None:
    """Install the patches for `spec` ("" arms nothing)."""
    if not spec:
        return
    fault = Fault(spec)
    if fault.step == "mount":
        for name in ("mount", "move_mount"):
            real = getattr(mountapi, name)

            def call(*args, _real=real, _name=name, **kwargs):
                if fault.hit():
                    _syscall_error(fault, f"{_name} {kwargs.get('what', '')}")
                return _real(*args, **kwargs)

            setattr(mountapi, name, call)
    elif fault.step == "link":
        real_symlink = posix.symlink

        def symlink(*args, **kwargs):
            if fault.hit():
                fault.act()
            return real_symlink(*args, **kwargs)

        posix.symlink = symlink
    elif fault.step == "cgroup":
        _arm_cgroup(fault)
    elif fault.step == "cache":
        real_rename = posix.rename

        def rename(src, dst, *args, **kwargs):
            if dst == "ld.so.cache" and fault.hit():
                fault.act()
            return real_rename(src, dst, *args, **kwargs)

        posix.rename = rename
    elif fault.step == "ldconfig":
        _arm_ldconfig(fault)
    elif fault.step == "read":
        _arm_read(fault)
    else:
        raise ValueError(f"PYXIS_FAULT: unknown step {fault.step!r}")


def _arm_cgroup(fault: Fault) -> None:
    real_open, real_write, allow_fds = posix.open, posix.write, set()

    def open_(path, flags, *args, **kwargs):
        fd = real_open(path, flags, *args, **kwargs)
        if isinstance(path, str) and path.endswith("/devices.allow"):
            allow_fds.add(fd)
        return fd

    def write(fd, data):
        if fd in allow_fds and fault.hit():
            fault.act()
        return real_write(fd, data)

    posix.open, posix.write = open_, write


def _arm_ldconfig(fault: Fault) -> None:
    """The runner's exec of the sealed host ldconfig fails, or the hook is killed once the runner is forked."""
    real_run, real_fork, real_execve = confined.run_ldconfig, posix.fork, posix.execve
    inside = []

    def run_ldconfig(*args, **kwargs):
        inside.append(fault.hit())
        try:
            return real_run(*args, **kwargs)
        finally:
            inside.pop()

    def fork():
        pid = real_fork()
        if pid and inside and inside[-1] and fault.action != "fail":
            fault.act()
        return pid

    def execve(*args, **kwargs):
        if inside and inside[-1] and fault.action == "fail":
            fault.act(errno.ENOEXEC)
        return real_execve(*args, **kwargs)

    confined.run_ldconfig, posix.fork, posix.execve = run_ldconfig, fork, execve


def _arm_read(fault: Fault) -> None:
    """Opening a path that contains ARG for reading fails with EACCES (an unreadable file)."""
    real_open, real_os_open = builtins.open, posix.open

    def matches(path, flags_or_mode) -> bool:
        return isinstance(path, str) and fault.arg in path and flags_or_mode and fault.hit()

    def open_(file, mode="r", *args, **kwargs):
        if matches(file, "r" in mode):
            fault.act(errno.EACCES)
        return real_open(file, mode, *args, **kwargs)

    def os_open(path, flags, *args, **kwargs):
        if matches(path, not flags & (os.O_WRONLY | os.O_RDWR)):
            fault.act(errno.EACCES)
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open, posix.open = open_, os_open
