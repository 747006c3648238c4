"""One error root for everything pyxis-hook reports to a user, and the exit codes.

Every failure a user can cause or meet (bad config, bad bundle, missing driver,
unsafe path in an image) is raised as a subclass of `PyxisHookError` whose
`str()` is one line naming the thing that is wrong.  `report` prints it as
`pyxis-hook: error: <line>` and returns its `exit_code`; anything else is a bug:
one line for the user, the traceback in the debug log, exit status 70.

Signals that one part of the hook gives another (a cache the merge cannot
model, a library the loader model refuses, a stale node artifact, a failed
syscall that its caller retries or words) are not user errors: they derive
from `InternalSignal`, never from `PyxisHookError`, and are caught by their own
callers.  One that reaches `report` is a bug and is reported as one.
"""

from __future__ import annotations

#: exit statuses a script can rely on
OK = 0
FINDINGS = 1
USAGE = 2
FAILED = 3
INTERNAL = 70  # EX_SOFTWARE of sysexits.h

#: the one table of exit statuses: `pyxis-hook --help` and docs/troubleshooting.md show it
EXIT_CODES: tuple[tuple[int, str], ...] = (
    (OK, "success (doctor, ldcheck, plan: nothing to report)"),
    (FINDINGS, "the check ran and found problems (doctor, ldcheck, plan, info, list)"),
    (USAGE, "bad command line or configuration (pyxis.conf)"),
    (FAILED, "the hook or command failed on this node or container; the error line says why"),
    (INTERNAL, "internal error (a bug); the traceback is in the debug log"),
)


def error_line(message: str) -> None:
    """Write `pyxis-hook: error: <message>` on stderr: the one form every error takes."""
    import sys

    sys.stderr.write(f"pyxis-hook: error: {message}\n")


def one_line(exc: BaseException) -> str:
    """The one line `report` writes for `exc` (without the log file's name)."""
    return str(exc) if isinstance(exc, PyxisHookError) else f"internal error: {type(exc).__name__}: {exc}"


def report(exc: BaseException, command: str) -> int:
    """The one error ladder: log `exc`, write its line, and return the exit status for it."""
    from pyxis_hook import log

    if isinstance(exc, PyxisHookError):
        log.error(str(exc))
        error_line(str(exc))
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, BrokenPipeError):  # our reader went away (`| head`): nothing to say to it
        return FAILED
    log.exception(f"internal error in {command}")
    where = f"traceback in {log.log_path()}" if log.log_path() else "set log-file in pyxis.conf for the traceback"
    error_line(f"internal error: {type(exc).__name__}: {exc} ({where})")
    return INTERNAL


class PyxisHookError(Exception):
    """Root of all user-facing errors; `exit_code` is what the process returns."""

    exit_code = FAILED

    def __str__(self) -> str:
        """One line, whatever the message quotes: a control character the input carried
        (a newline in an environment value, a path) is shown escaped, as Python writes it."""
        text = super().__str__()
        if text.isprintable():
            return text
        return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class UsageError(PyxisHookError):
    """Bad command line."""

    exit_code = USAGE


class ConfigError(PyxisHookError):
    """pyxis.conf is unreadable, not TOML, or fails its schema."""

    exit_code = USAGE


class OciError(PyxisHookError):
    """The OCI state on stdin or the bundle's config.json is unusable."""


class RequestError(PyxisHookError):
    """The container asked for something that does not exist or is not allowed."""


class RequirementError(PyxisHookError):
    """An NVIDIA_REQUIRE_* condition is not met by this host."""


class DriverError(PyxisHookError):
    """The host driver is missing, half installed, or inconsistent."""


class ElfError(PyxisHookError):
    """A file is not a usable ELF object; the message names the file and why."""


class LdCacheError(PyxisHookError):
    """An ld.so.cache or ld.so.conf cannot be read or parsed."""


class PathError(PyxisHookError):
    """A path inside a root would escape it, loops, or has an unexpected type."""


class ApplyError(PyxisHookError):
    """A kernel operation (mount, mknod, setns, cgroup write) failed while injecting."""


class InternalSignal(Exception):
    """Root of the signals one part of the hook gives another, never a user error.

    Each has its own catcher (the merge falls back to ldconfig on `CannotMerge`,
    `load_or_build` rebuilds on `ArtifactError`, ldd and ldcheck word a
    `LoadFailed`, apply's child words a `SyscallError`); a broad
    `except PyxisHookError` around user errors must not swallow one by accident.
    """


class ArtifactError(InternalSignal):
    """The node artifact is missing, untrusted, corrupt or stale (callers rebuild it or discover)."""
