"""doctor's scheduler line: which batch scheduler's job this is, and what it allocated here.

The same `spec.allocation.job_allocation` that bounds `all` in the hook
reads the caller's environment, inside the device cgroup the caller runs in,
so `doctor` run in a job step says what the hook will take as the job's GPUs.
"""

from __future__ import annotations

from pyxis_hook.diag.findings import Finding
from pyxis_hook.errors import PyxisHookError


def check_scheduler(host, config, env) -> list[Finding]:
    """One finding naming the scheduler and its allocation; none outside a batch job."""
    from pyxis_hook.plan.prepare import confinement
    from pyxis_hook.spec.allocation import job_allocation, scheduler_of

    which = scheduler_of(dict(env.environ))
    if which is None:
        return []
    # the hook's own decision: the device cgroup's bound and a task's renumbered view set aside
    environ, allowed = confinement(dict(env.environ), host, config.proc_root, env.self_pid)
    try:
        alloc = job_allocation(environ, host, allowed)
    except PyxisHookError as e:
        return [Finding("error", "scheduler-allocation", f"{which} job: {e}",
                        "the hook refuses GPU containers while the job's GPU variable names no GPU of this host",
                        "check the scheduler's GPU configuration for this node (docs/schedulers.md)")]
    if alloc is None:
        return [Finding("info", "scheduler", f"{which} job: its GPU variable is not set, so no allocation bounds "
                                             f"'all' (only the device cgroup does)")]
    return [Finding("ok", "scheduler", f"{which} job: {alloc.reason}")]
