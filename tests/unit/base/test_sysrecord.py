"""A start's record in the system log: framed as syslog(3) frames it, carrying the job's identity, never loud."""

from __future__ import annotations

import os
import posix
import re
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxis_hook import log, sysrecord

#: `<PRI>Mmm dd hh:mm:ss pyxis-hook[PID]: MSG`, glibc's RFC 3164 form
FRAME = re.compile(rb"^<(\d+)>([A-Z][a-z]{2} [ 1-3]\d \d\d:\d\d:\d\d) pyxis-hook\[(\d+)\]: (.*)$", re.S)


@pytest.fixture
def listener(tmp_path):
    """A syslog daemon stand-in: a datagram socket bound in tmp_path; yields (its path, the socket)."""
    path = str(tmp_path / "log")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield path, sock
    sock.close()
    log.configure()


@pytest.fixture
def slurm_env(monkeypatch):
    """The hook's own environment as Pyxis gives it (and no other scheduler's ids)."""
    for name, _ in sysrecord.JOB_VARIABLES:
        monkeypatch.delitem(posix.environ, name, raising=False)
    monkeypatch.setitem(posix.environ, b"SLURM_JOB_ID", b"4242")
    monkeypatch.setitem(posix.environ, b"SLURM_STEP_ID", b"7")


def test_a_start_is_one_datagram_with_the_job_identity(listener, slurm_env):
    path, sock = listener
    log.configure("", "info", "warning", socket=path)
    log.start_record("ok", {"container": "c0ffee", "gpus": "0,1", "mounts": 42})
    m = FRAME.match(sock.recv(65536))
    assert m, "not syslog(3)'s framing"
    assert int(m.group(1)) == 3 * 8 + 6  # daemon.info
    assert int(m.group(3)) == os.getpid()
    assert m.group(4).decode() == (f"start container=c0ffee uid={os.getuid()} slurm_job=4242 slurm_step=7 "
                                   "gpus=0,1 mounts=42 result=ok")


def test_a_failed_start_is_an_error_record_on_one_line(listener, slurm_env):
    path, sock = listener
    log.configure("", "info", "warning", facility="local3", socket=path)
    log.start_record('cannot read "/x"\nforged line', {"container": "c0ffee"})
    m = FRAME.match(sock.recv(65536))
    assert int(m.group(1)) == 19 * 8 + 3  # local3.err
    text = m.group(4).decode()
    assert "\n" not in text
    assert text.startswith("start container=c0ffee ") and " slurm_job=4242 " in text
    assert text.endswith(r' result=error error="cannot read \"/x\"\nforged line"')


def test_other_schedulers_ids():
    env = {b"LSB_JOBID": b"88", b"LSB_JOBINDEX": b"3", b"PBS_JOBID": b"12.server", b"FLUX_JOB_ID": b"f2Ac",
           b"SLURM_JOB_ID": b""}
    assert sysrecord.job_fields(env) == {"lsf_job": "88", "lsf_index": "3", "pbs_job": "12.server", "flux_job": "f2Ac"}


def test_no_listener_is_silent_and_a_debug_line(tmp_path, capsys):
    try:
        log.configure("", "info", "warning", socket=str(tmp_path / "absent"))
        log.start_record("ok", {"container": "c"})
        assert capsys.readouterr().err == ""
        log.configure("", "info", "debug", socket=str(tmp_path / "absent"))
        log.start_record("ok", {"container": "c"})
        assert "system log: record not sent: " in capsys.readouterr().err
    finally:
        log.configure()


def test_syslog_off_sends_nothing(listener):
    path, sock = listener
    log.configure("", "info", "warning", syslog=False, socket=path)
    log.start_record("ok", {"container": "c"})
    sock.settimeout(0)
    with pytest.raises(BlockingIOError):
        sock.recv(65536)


def test_the_record_is_in_the_log_file_too(tmp_path):
    path = tmp_path / "hook.log"
    try:
        log.configure(str(path), "info", "error", socket=str(tmp_path / "absent"))
        log.start_record("ok", {"container": "c1"})
        log.start_record("no GPU 9", {"container": "c2"})
    finally:
        log.configure()
    text = path.read_text()
    assert " info: start container=c1 " in text and " error: start container=c2 " in text
    assert 'error="no GPU 9"' in text


def test_a_stream_listener_gets_it_nul_terminated(tmp_path):
    path = str(tmp_path / "log")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    try:
        assert sysrecord.send(b"<30>hello", path) is None
        conn, _ = server.accept()
        conn.settimeout(5)
        assert conn.recv(100) == b"<30>hello\0"
        conn.close()
    finally:
        server.close()


def test_frame_is_rfc3164_local_time():
    now = 1700000000.0  # 2023-11-14 22:13:20 UTC
    t = __import__("time").localtime(now)
    data = sysrecord.frame("x=1", 1, 6, now=now, pid=99)
    month = "Jan Feb Mar Apr May Jun Jul Aug Sep Oct Nov Dec".split()[t.tm_mon - 1]
    assert data == f"<14>{month} {t.tm_mday:2d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} pyxis-hook[99]: x=1".encode()


def _unquote(word: str) -> str:
    if not word.startswith('"'):
        return word
    return word[1:-1].encode("ascii", "backslashreplace").decode("unicode_escape")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_value_is_one_printable_word_that_reads_back(value):
    """No value (an error quoting a user's path, an environment value) can break the line or forge a key."""
    text = sysrecord.message({"a": value, "b": "1"})
    assert text.isprintable()
    assert text.startswith("a=") and text.endswith(" b=1")
    assert _unquote(text[2:-4]) == value


def test_a_long_value_is_cut():
    assert len(sysrecord.quote("x" * 10000)) == sysrecord.MAX_VALUE + 3
