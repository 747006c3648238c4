"""A tiny logger for the hook: a debug log file, warnings on stderr, one record per start in the system log.

Not the `logging` package: the start path avoids its import
(docs/decisions/2026-12-07-start-costs.md), and its handlers may start threads
(setns(CLONE_NEWNS) then fails with EINVAL).  The log file is opened O_NOFOLLOW|O_APPEND and is
never inside a container rootfs.  The system log's record is `sysrecord`'s.
"""

from __future__ import annotations

import errno
import posix
import sys
import time

from pyxis_hook import sysrecord, userns

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_state: dict = {"fd": -1, "file_level": 20, "stderr_level": 30, "path": "",
                "syslog": True, "facility": sysrecord.FACILITIES["daemon"], "socket": sysrecord.SOCKET}

#: why a user other than root cannot open the admin's log file: expected, not worth a warning
_NOT_YOURS = (errno.EACCES, errno.EPERM, errno.EROFS)


def configure(log_file: str = "", level: str = "info", stderr_level: str = "warning", *,
              syslog: bool = True, facility: str = "daemon", socket: str = sysrecord.SOCKET) -> None:
    """Open the log file (if any), set the thresholds and the system log's channel (`start_record`).

    A log file that cannot be opened is a warning on stderr once, except
    for a process that is not root (another uid, or root of a user
    namespace) denied it: the file is root's, that start's record goes to
    the system log, and the reason only to stderr at debug level.
    """
    close()
    _state["file_level"] = LEVELS.get(level, 20)
    _state["stderr_level"] = LEVELS.get(stderr_level, 30)
    _state["path"] = log_file
    _state["syslog"] = syslog
    _state["facility"] = sysrecord.FACILITIES.get(facility, sysrecord.FACILITIES["daemon"])
    _state["socket"] = socket
    if log_file:
        try:
            _state["fd"] = posix.open(
                log_file, posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT | posix.O_NOFOLLOW | posix.O_CLOEXEC, 0o640
            )
        except OSError as e:
            level = "debug" if e.errno in _NOT_YOURS and not privileged() else "warning"
            _emit(level, f"cannot open log file {log_file}: {e.strerror}")


def privileged() -> bool:
    """Whether this process is root of the initial user namespace (the one that may write the admin's files)."""
    return posix.geteuid() == 0 and not userns.in_user_namespace()


def start_record(outcome: str, fields: dict[str, object], environ: dict[bytes, bytes] | None = None) -> None:
    """Send the system log this container start's one record; never raises.

    `outcome`: "ok" for a start that gave its GPUs, else the one-line
    error the runtime was given.  `fields`: what identifies the start and
    what it gave, in the record's order (`container`, `gpus`, `mounts`...;
    keys are identifiers).  The record adds the real uid (and `ns_uid` in a
    user namespace) and the batch job's ids from `environ` (default: the
    process's; `sysrecord.JOB_VARIABLES`).  Also written to the log file, at
    info (ok) or error.  Not sent when `configure` turned the channel off; a
    socket nobody listens on is a debug line.
    """
    try:
        words: dict[str, object] = {}
        if "container" in fields:
            words["container"] = fields["container"]
        words.update(sysrecord.user_ids())
        words.update(sysrecord.job_fields(environ))
        words.update(fields)
        if outcome == "ok":
            words["result"] = "ok"
        else:
            words["result"] = "error"
            words["error"] = outcome
        text = "start " + sysrecord.message(words)
        ok = outcome == "ok"
        _emit("info" if ok else "error", text)
        if _state["syslog"]:
            data = sysrecord.frame(text, _state["facility"], sysrecord.INFO if ok else sysrecord.ERR)
            why = sysrecord.send(data, _state["socket"])
            if why is not None:
                _emit("debug", f"system log: record not sent: {why}")
    except Exception as e:  # noqa: BLE001 — the record is a report: it never fails the start it reports
        _emit("debug", f"system log: record not made: {type(e).__name__}: {e}")


def log_path() -> str:
    """The log file in use ("" when none is open)."""
    return _state["path"] if _state["fd"] >= 0 else ""


def close() -> None:
    if _state["fd"] >= 0:
        posix.close(_state["fd"])
        _state["fd"] = -1


def _emit(level: str, msg: str) -> None:
    n = LEVELS[level]
    if _state["fd"] >= 0 and n >= _state["file_level"]:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        line = f"{stamp} pyxis-hook[{posix.getpid()}] {level}: {msg}\n"
        try:
            posix.write(_state["fd"], line.encode("utf-8", "replace"))
        except OSError:
            pass
    if n >= _state["stderr_level"] and level != "error":
        sys.stderr.write(f"pyxis-hook: {level}: {msg}\n")


def debug(msg: str) -> None:
    _emit("debug", msg)


def info(msg: str) -> None:
    _emit("info", msg)


def warning(msg: str) -> None:
    _emit("warning", msg)


def error(msg: str) -> None:
    """Errors go to the file only; the CLI prints the one user-facing line itself."""
    _emit("error", msg)


def exception(msg: str) -> None:
    """Log `msg` and the current traceback to the log file (never to the user)."""
    import traceback

    _emit("error", msg + "\n" + traceback.format_exc())


def frames(exc: BaseException) -> str:
    """The traceback of `exc` as file:line:function lines, reading no file.

    For code running inside a container's mount namespace (apply's child):
    `traceback` would import modules there and linecache would open source
    paths that now name the image's files.  The lines are in the order
    `traceback` prints them, without the source text.
    """
    lines = ["Traceback (most recent call last, source lines not read):"]
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        lines.append(f'  File "{code.co_filename}", line {tb.tb_lineno}, in {code.co_name}')
        tb = tb.tb_next
    lines.append(f"{type(exc).__qualname__}: {exc}")
    return "\n".join(lines)
