"""One error root for everything pyxis-hook reports to a user.

Every failure a user can cause or meet (bad config, bad bundle, missing driver,
unsafe path in an image) is raised as a subclass of `PyxisHookError` whose
`str()` is one line naming the thing that is wrong.  `cli.main` prints it as
`pyxis-hook: error: <line>` and exits with `exit_code`; anything else is a bug
and its traceback goes to the debug log only.
"""

from __future__ import annotations


class PyxisHookError(Exception):
    """Root of all user-facing errors; `exit_code` is what the process returns."""

    exit_code = 1


class UsageError(PyxisHookError):
    """Bad command line."""

    exit_code = 2


class ConfigError(PyxisHookError):
    """pyxis.conf is unreadable, not TOML, or fails its schema."""

    exit_code = 2


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


class SnapshotError(PyxisHookError):
    """The inventory snapshot is unreadable or stale (callers rebuild it)."""
