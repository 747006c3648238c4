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
    from pyxis_hook.host import cgroup
    from pyxis_hook.spec.allocation import job_allocation, scheduler_of

    environ = dict(env.environ)
    which = scheduler_of(environ)
    if which is None:
        return []
    minors = [g.minor for g in host.gpus if not g.excluded]
    nv = host.majors.nvidia if host.majors.nvidia is not None else 195
    allowed = cgroup.gpu_minors_allowed(config.proc_root, env.self_pid, minors, nv, mountinfo_pid=env.self_pid)
    if allowed is not None and len(allowed) == len(minors):
        allowed = None  # not confined (as plan.prepare decides)
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
