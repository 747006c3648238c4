"""Every user's start reaches the system log, and a user the admin's log file denies is told nothing.

A user's start (Pyxis runs enroot as the job's user, enroot runs the hook
in a user namespace) cannot open the log file pyxis.conf names: that is
expected, so no warning; its record goes to the syslog socket.  Root
failing to open it still warns.  And the datagram is the one glibc's
syslog(3) sends, checked against glibc itself.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pyxis_hook import log, sysrecord

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture
def shared(tmp_path):
    """A directory every uid may enter: a syslog stand-in's socket and a root-only log file in it."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="pyxis-syslog-"))
    base.chmod(0o755)
    path = str(base / "log")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    sock.settimeout(5)
    logfile = base / "hook.log"
    logfile.write_text("")
    logfile.chmod(0o640)
    yield path, sock, str(logfile)
    sock.close()
    shutil.rmtree(base)
    log.configure()


def _as_nobody(socket_path: str, log_file: str, userns: bool = False) -> tuple[int, str]:
    """Fork, become uid 65534 (then, with `userns`, root of a user namespace mapped to it), configure the log
    as a start does (warnings on stderr) and send a record; (exit status, stderr)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns to pytest
        status = 1
        try:
            os.close(r)
            sys.stderr = os.fdopen(w, "w", buffering=1)
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            if userns:
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(4, 1, 0, 0, 0)  # PR_SET_DUMPABLE: setuid cleared it, and /proc/self/uid_map with it
                if libc.unshare(0x10000000) != 0:  # CLONE_NEWUSER
                    raise OSError(ctypes.get_errno(), "unshare")
                Path("/proc/self/uid_map").write_text(f"0 {NOBODY} 1\n")
                assert os.geteuid() == 0
            log.configure(log_file, "info", "warning", socket=socket_path)
            log.start_record("ok", {"container": "user-start"})
            sys.stderr.flush()
            status = 0
        except BaseException as e:  # noqa: BLE001 — said to the parent, which fails the test with it
            sys.stderr.write(f"child: {e!r}\n")
        finally:
            os._exit(status)
    os.close(w)
    with os.fdopen(r) as f:
        err = f.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), err


def test_a_user_denied_the_log_file_gets_no_warning_and_the_record_is_sent(shared, monkeypatch):
    path, sock, log_file = shared
    for name, _ in sysrecord.JOB_VARIABLES:
        monkeypatch.delitem(sysrecord.posix.environ, name, raising=False)
    monkeypatch.setitem(sysrecord.posix.environ, b"SLURM_JOB_ID", b"1234")
    status, err = _as_nobody(path, log_file)
    assert status == 0
    assert err == ""
    text = sock.recv(65536).decode()
    assert f"start container=user-start uid={NOBODY} slurm_job=1234 result=ok" in text
    assert Path(log_file).read_text() == ""  # nobody wrote the admin's file


def test_root_of_a_user_namespace_gets_no_warning_and_its_host_uid_is_recorded(shared):
    """enroot --root: uid 0 inside, the job's user outside."""
    path, sock, log_file = shared
    status, err = _as_nobody(path, log_file, userns=True)
    assert (status, err) == (0, "")
    text = sock.recv(65536).decode()
    assert f"start container=user-start uid={NOBODY} ns_uid=0 " in text
    assert Path(log_file).read_text() == ""


def test_root_denied_the_log_file_still_warns(tmp_path, capsys):
    try:
        log.configure(str(tmp_path / "no-such-dir" / "hook.log"), "info", "warning", socket=str(tmp_path / "absent"))
    finally:
        log.configure()
    assert log.privileged()
    assert "pyxis-hook: warning: cannot open log file" in capsys.readouterr().err


def test_the_datagram_is_the_one_glibc_syslog_sends(tmp_path):
    """In a private mount namespace with a tmpfs on /dev, glibc's syslog(3) and ours send to one /dev/log."""
    code = r"""
import socket, sys, syslog
sys.path.insert(0, sys.argv[1])
from pyxis_hook import sysrecord
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind("/dev/log")
sock.settimeout(5)
syslog.openlog("pyxis-hook", syslog.LOG_PID, syslog.LOG_DAEMON)
msg = 'start container=abc uid=0 slurm_job=9 result=error error="no \\"GPU\\" 7"'
for _ in range(3):  # a second boundary between the two sends: again
    syslog.syslog(syslog.LOG_ERR, msg)
    theirs = sock.recv(65536)
    assert sysrecord.send(sysrecord.frame(msg, sysrecord.FACILITIES["daemon"], sysrecord.ERR)) is None
    ours = sock.recv(65536)
    if ours == theirs:
        print(repr(ours))
        break
else:
    print("differ:", theirs, ours)
"""
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                        'mount -t tmpfs tmpfs /dev && exec "$0" "$@"', sys.executable, "-c", code, str(REPO)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not r.stdout.startswith("differ"), r.stdout
    assert re.match(r"^b'<27>[A-Z][a-z]{2} [ 1-3]\d \d\d:\d\d:\d\d pyxis-hook\[\d+\]: start ", r.stdout), r.stdout
