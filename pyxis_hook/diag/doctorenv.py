"""What doctor's checks read besides the configured roots: the `DoctorEnv` record.

Its own module so that `doctor` (the host checks) and `installcheck` (the
install checks) both take it without importing each other.
"""

from __future__ import annotations

from pyxis_hook.record import record

DEFAULT_HOOKS_DIRS = ("/usr/share/containers/oci/hooks.d", "/etc/containers/oci/hooks.d")


@record
class DoctorEnv:
    """What the checks read besides the configured roots.

    `environ`: the caller's environment (Slurm variables).  `hooks_dirs`: where
    podman/CRI-O read oci-hooks files.  `search_path`: dirs searched for
    runc/crun (None: pyxis.conf's `path`).  `self_pid`: the process whose
    cgroup is examined under proc-root.  `python`: the interpreter the hooks.d
    file must name (None: this install's, `hookd.interpreter()`).  `command`:
    the `pyxis-hook` script running doctor, when it is one.  `package`: the
    directory holding the package the commands are checked against (None:
    this process's).
    """

    environ: tuple[tuple[str, str], ...] = ()
    hooks_dirs: tuple[str, ...] = DEFAULT_HOOKS_DIRS
    search_path: tuple[str, ...] | None = None
    self_pid: str = "self"
    python: str | None = None
    run_runtimes: bool = True
    command: str | None = None
    package: str | None = None
