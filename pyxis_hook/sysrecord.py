"""A container start's record in the system log: whose job it ran for, what it gave, sent to /dev/log.

One datagram per start to the syslog socket, where journald or a syslog
daemon listens on every node, whatever the process's uid or user namespace
(the log file is root's to write; this channel is everyone's).  The datagram
is framed as glibc's syslog(3) frames it (RFC 3164): `<PRI>Mmm dd hh:mm:ss
TAG[PID]: MSG`.  Sending never blocks and never raises: a node or container
without a listener loses the record, and `send` says why for the debug log.
"""

from __future__ import annotations

import errno
import posix
import sys
import time

from pyxis_hook import cabi, userns

#: where syslog(3) sends (glibc's _PATH_LOG)
SOCKET = "/dev/log"
TAG = "pyxis-hook"

#: the facilities pyxis.conf's `syslog-facility` may name, by their syslog.h numbers
FACILITIES = {"daemon": 3, "user": 1, **{f"local{i}": 16 + i for i in range(8)}}
#: the severities a record is sent with: a start that gave its GPUs, one that failed
INFO = 6
ERR = 3

#: the variables of the hook's own environment that name the batch job a start belongs to, and the
#: record's key for each (HTCondor's job id is only in the file $_CONDOR_JOB_AD names: not read)
JOB_VARIABLES = (
    (b"SLURM_JOB_ID", "slurm_job"),
    (b"SLURM_STEP_ID", "slurm_step"),
    (b"LSB_JOBID", "lsf_job"),
    (b"LSB_JOBINDEX", "lsf_index"),
    (b"PBS_JOBID", "pbs_job"),
    (b"FLUX_JOB_ID", "flux_job"),
)

#: a longer value (an error line quoting a path) is cut to this many characters
MAX_VALUE = 512

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def job_fields(environ: dict[bytes, bytes] | None = None) -> dict[str, str]:
    """The batch job's ids found in `environ` (default: the process's, `posix.environ`), by record key."""
    env = posix.environ if environ is None else environ
    found = {}
    for name, key in JOB_VARIABLES:
        value = env.get(name)
        if value:
            found[key] = value.decode("utf-8", "backslashreplace")
    return found


def user_ids() -> dict[str, str]:
    """The record's `uid` (the real uid, as the parent user namespace sees it) and, in a user namespace, `ns_uid`."""
    uid = posix.getuid()
    if not userns.in_user_namespace():
        return {"uid": str(uid)}
    outside = userns.host_uid(uid)
    return {"uid": "unmapped" if outside is None else str(outside), "ns_uid": str(uid)}


def quote(value: object) -> str:
    """`value` as one word of the record: bare when it is plain, else in double quotes with `\\` escapes.

    Control characters (a newline in an environment value) are escaped as
    Python writes them, so a record is always one line that no value can forge.
    """
    text = str(value)
    if len(text) > MAX_VALUE:
        text = text[:MAX_VALUE] + "..."
    if text and text.isprintable() and not any(c in text for c in ' "=\\'):
        return text
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    if not text.isprintable():
        text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return f'"{text}"'


def message(fields: dict[str, object]) -> str:
    """`key=value` words, in `fields`' order (keys are the caller's identifiers, values quoted by `quote`)."""
    return " ".join(f"{key}={quote(value)}" for key, value in fields.items())


def frame(text: str, facility: int, severity: int, now: float | None = None, pid: int | None = None) -> bytes:
    """The datagram syslog(3) would send for `text`: `<PRI>Mmm dd hh:mm:ss pyxis-hook[PID]: text`, local time."""
    t = time.localtime(now)
    stamp = f"{_MONTHS[t.tm_mon - 1]} {t.tm_mday:2d} {t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d}"
    pid = posix.getpid() if pid is None else pid
    return f"<{facility * 8 + severity}>{stamp} {TAG}[{pid}]: {text}".encode("utf-8", "backslashreplace")


#: <sys/socket.h>: the calls' constants (the same on every architecture the hook runs on; a socket
#: type's SOCK_CLOEXEC and SOCK_NONBLOCK are O_CLOEXEC and O_NONBLOCK)
AF_UNIX = 1
SOCK_STREAM = 1
SOCK_DGRAM = 2
MSG_DONTWAIT = 0x40

_socket = cabi.libc_function("socket", cabi.c_int)
_sendto = cabi.libc_function("sendto", cabi.c_long)
_connect = cabi.libc_function("connect", cabi.c_int)
_send = cabi.libc_function("send", cabi.c_long)


def _failed(what: str) -> str:
    return f"{what}: {posix.strerror(cabi.get_errno())}"


def send(data: bytes, path: str = SOCKET) -> str | None:
    """Send one datagram to the syslog socket at `path` without blocking; None when sent, else why not.

    A socket of the stream kind (syslog-ng's `unix-stream`) gets the datagram
    NUL-terminated, as glibc sends it there.  A full queue (a stalled journald)
    drops the record rather than hold up the container's start.  The calls
    are libc's through `cabi`, which a GPU start has loaded for its syscalls:
    not the `_socket` module's (docs/decisions/2026-12-07-start-costs.md).
    """
    # struct sockaddr_un, sized as CPython's socket module sizes it (no NUL: the length bounds the path)
    address = AF_UNIX.to_bytes(2, sys.byteorder) + path.encode(sys.getfilesystemencoding(), sys.getfilesystemencodeerrors())
    fd = _socket(AF_UNIX, SOCK_DGRAM | posix.O_CLOEXEC, 0)
    if fd < 0:
        return _failed("no socket")
    try:
        if _sendto(fd, data, cabi.c_size_t(len(data)), MSG_DONTWAIT, address, len(address)) >= 0:
            return None
        if cabi.get_errno() != errno.EPROTOTYPE:  # EPROTOTYPE: the listener is a stream socket
            return _failed(path)
    finally:
        posix.close(fd)
    fd = _socket(AF_UNIX, SOCK_STREAM | posix.O_CLOEXEC | posix.O_NONBLOCK, 0)
    if fd < 0:
        return _failed("no socket")
    try:
        if _connect(fd, address, len(address)) < 0:
            return _failed(path)
        framed = data + b"\0"
        sent = _send(fd, framed, cabi.c_size_t(len(framed)), MSG_DONTWAIT)
        if sent < 0:
            return _failed(path)
        return None if sent == len(framed) else f"{path}: sent {sent} of {len(framed)} bytes"
    finally:
        posix.close(fd)
