"""The runner's libc calls give what the stdlib's fcntl, resource and select give, on this machine."""

from __future__ import annotations

import ast
import fcntl
import os
import resource
import select
import subprocess
import sys
import time

import pytest

from pyxis_hook.kernel import process


def test_constants_are_the_stdlib_modules_values():
    for name in ("F_ADD_SEALS", "F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE"):
        assert getattr(process, name) == getattr(fcntl, name), name
    for name in ("RLIMIT_CPU", "RLIMIT_FSIZE", "RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_AS", "RLIM_INFINITY"):
        assert getattr(process, name) == getattr(resource, name) % (1 << 64), name
    assert process.POLLIN == select.POLLIN


def test_seals_stop_writes_and_resizes():
    fd = os.memfd_create("t", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.write(fd, b"x" * 10)
        process.add_seals(fd, process.F_SEAL_WRITE | process.F_SEAL_GROW | process.F_SEAL_SHRINK)
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) == (fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK)
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"y", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1)
    finally:
        os.close(fd)


def test_sealing_a_file_that_allows_none_is_an_oserror(tmp_path):
    fd = os.memfd_create("t", os.MFD_CLOEXEC)  # no MFD_ALLOW_SEALING: F_SEAL_SEAL is preset
    try:
        with pytest.raises(OSError) as e:
            process.add_seals(fd, process.F_SEAL_WRITE)
        assert e.value.errno == 1  # EPERM
    finally:
        os.close(fd)


def test_rlimits_read_and_set_as_resource_does():
    """In a child process: a lowered limit cannot be raised back by a non-root test run."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reported through the pipe
        try:
            before = process.getrlimit(process.RLIMIT_NOFILE)
            same = before == resource.getrlimit(resource.RLIMIT_NOFILE)
            process.setrlimit(process.RLIMIT_NOFILE, 50, 60)
            after = resource.getrlimit(resource.RLIMIT_NOFILE)
            inf = process.getrlimit(process.RLIMIT_CPU)[1] == resource.getrlimit(resource.RLIMIT_CPU)[1] % (1 << 64)
            try:
                process.setrlimit(process.RLIMIT_NOFILE, 70, 50)  # soft above hard: EINVAL
                bad = "accepted"
            except OSError as e:
                bad = str(e.errno)
            os.write(w, repr((same, after, inf, bad)).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 4096)
    os.close(r)
    os.waitpid(pid, 0)
    same, after, inf, bad = ast.literal_eval(data.decode())
    assert same and after == (50, 60) and inf and bad == "22"


def test_poll_reports_readable_fds_and_times_out():
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        t = time.monotonic()
        assert process.poll([r1, r2], 50) == []
        assert time.monotonic() - t >= 0.04
        os.write(w2, b"x")
        assert process.poll([r1, r2], 1000) == [(r2, select.POLLIN)]
        os.close(w1)  # a closed writer: POLLHUP, as select.poll reports it
        p = select.poll()
        p.register(r1, select.POLLIN)
        p.register(r2, select.POLLIN)
        assert sorted(process.poll([r1, r2], 1000)) == sorted(p.poll(1000))
        assert process.poll([], 10) == []
    finally:
        for fd in (r1, r2, w2):
            os.close(fd)


def test_the_structures_are_made_when_first_used():
    """Importing the module (every GPU start does) makes no ctypes class; the first rlimit call makes its one."""
    code = ("from pyxis_hook import cabi\nfrom pyxis_hook.kernel import process as r\n"
            "before = sorted(cabi._MADE)\n"
            "r.getrlimit(r.RLIMIT_NOFILE)\n"
            "print(before, sorted(cabi._MADE))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] ['_Rlimit']"
