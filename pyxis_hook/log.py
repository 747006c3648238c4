"""A tiny logger for the hook: a debug log file plus warnings on stderr.

Not the `logging` package: it costs ~10 ms of import on a path that must
cost almost nothing, and its handlers may start threads (setns(CLONE_NEWNS)
then fails with EINVAL).  The log file is opened O_NOFOLLOW|O_APPEND and is
never inside a container rootfs.
"""

from __future__ import annotations

import posix
import sys
import time

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40}

_state: dict = {"fd": -1, "file_level": 20, "stderr_level": 30, "path": ""}


def configure(log_file: str = "", level: str = "info", stderr_level: str = "warning") -> None:
    """Open the log file (if any) and set the thresholds; failures to open are reported once."""
    close()
    _state["file_level"] = LEVELS.get(level, 20)
    _state["stderr_level"] = LEVELS.get(stderr_level, 30)
    _state["path"] = log_file
    if log_file:
        try:
            _state["fd"] = posix.open(
                log_file, posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT | posix.O_NOFOLLOW | posix.O_CLOEXEC, 0o640
            )
        except OSError as e:
            sys.stderr.write(f"pyxis-hook: warning: cannot open log file {log_file}: {e.strerror}\n")


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
