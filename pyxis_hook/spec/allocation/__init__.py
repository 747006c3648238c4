"""The job's GPU allocation, whatever batch scheduler made it (docs/schedulers.md).

`job_allocation` recognises the scheduler from the job's variables and
reads the GPUs it gave this node, each value in its scheduler's own form,
with that scheduler's reader (one module each beside this one, imported
only for a job of that scheduler; `gpuforms` holds what they share).
`CUDA_VISIBLE_DEVICES` alone is ambiguous (a global index, an index
renumbered inside a device cgroup, a full UUID, a UUID prefix, a
`/dev/nvidiaN` minor, HTCondor's `CUDA<N>` or `10000`, Flux's `-1`, PBS's
empty value), so the scheduler is identified first and only then is the
value parsed.  Pure like `spec.request`: the environment, the host's GPUs
and the device cgroup's allowed minors in, an `Allocation` out; the one file
read is Torque's GPU file, for a Torque job without CUDA_VISIBLE_DEVICES.

The scheduler's variables are the scheduler's, never the image's:
`SCHEDULER_VARS` (and LSF's `CUDA_VISIBLE_DEVICES<N>`) is the one table of
them, and `request_env` builds the env a request reads from the container's
env and the scheduler's, each name from its owner (docs/schedulers.md, "The
allocation rule").

Which scheduler, first match wins: Slurm, HTCondor, LSF, Torque, OpenPBS, Flux
(`job_allocation`); what each one's variables mean is its reader's docstring
and docs/schedulers.md, "Per scheduler".
"""

from __future__ import annotations

from pyxis_hook import log
from pyxis_hook.spec.slurmvars import GPUS_ON_NODE, SLURM_VARS

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping

    from pyxis_hook.host.gpus import HostGpus
    from pyxis_hook.spec.allocation.gpuforms import Allocation

CVD = "CUDA_VISIBLE_DEVICES"
CONDOR_ASSIGNED = "_CONDOR_AssignedGPUs"
GPUFILE = "PBS_GPUFILE"
#: the scheduler-owned variables: every variable a scheduler decision reads (`scheduler_of`, the readers beside it,
#: `plan.taskview`), and LSF's `CUDA_VISIBLE_DEVICES<N>` (`is_scheduler_var`).  Only the scheduler sets them:
#: `request_env` takes them from the scheduler's env, never from the container's
SCHEDULER_VARS = frozenset((*SLURM_VARS, GPUS_ON_NODE, CVD, "LSB_JOBID", "PBS_JOBID", GPUFILE, "PBS_VERSION",
                            CONDOR_ASSIGNED, "BATCH_SYSTEM", "GPU_DEVICE_ORDINAL", "FLUX_JOB_ID"))

_DIGITS = frozenset("0123456789")


def is_index(tok: str) -> bool:
    """A GPU index as the schedulers and NVIDIA_VISIBLE_DEVICES write one: 1-9 ASCII digits.

    Bounded: int() of a 5,000-digit token would raise, and nothing is that
    big.  Plain string code, not `re`, which the start path avoids
    (tests/unit/spec/test_parsers_vs_regex.py checks it against the regular
    expression it replaces).
    """
    return 0 < len(tok) <= 9 and _DIGITS.issuperset(tok)


def is_lsf_task_var(name: str) -> bool:
    """LSF's per-task `CUDA_VISIBLE_DEVICES<N>` (`allocation.lsf.task_vars`)."""
    return name.startswith(CVD) and is_index(name[len(CVD):])


def is_scheduler_var(name: str) -> bool:
    """A scheduler-owned variable (`SCHEDULER_VARS`, LSF's `CUDA_VISIBLE_DEVICES<N>`)."""
    return name in SCHEDULER_VARS or is_lsf_task_var(name)


def request_env(container: Mapping[str, str], scheduler: Mapping[str, str]) -> dict[str, str]:
    """The env a request is resolved from: the container's choices, the scheduler's allocation.

    `container`: the container's env (the image's, the user's); its
    scheduler-owned variables are dropped, each logged at debug.
    `scheduler`: the env the scheduler gave the job (the hook's own, in the
    enroot mode); only its scheduler-owned variables are taken.  Nothing
    else is read or changed.
    """
    env = {}
    for key, value in container.items():
        if is_scheduler_var(key):
            log.debug(f"{key}={value} in the container's environment is not read: the allocation is the "
                      f"scheduler's, never the image's")
        else:
            env[key] = value
    env.update((k, v) for k, v in scheduler.items() if is_scheduler_var(k))
    return env


def scheduler_of(env: Mapping[str, str]) -> str | None:
    """The scheduler whose job this environment belongs to, by the variables each one always sets."""
    if any(env.get(v, "").strip() for v in SLURM_VARS):
        return "Slurm"
    if CONDOR_ASSIGNED in env or env.get("BATCH_SYSTEM") == "HTCondor":
        return "HTCondor"
    if env.get("LSB_JOBID"):
        return "LSF"
    if env.get("PBS_JOBID"):
        if env.get("PBS_GPUFILE") or env.get("PBS_VERSION", "").upper().startswith("TORQUE"):
            return "Torque"
        return "OpenPBS"
    if env.get("FLUX_JOB_ID"):
        return "Flux"
    return None


def job_allocation(env: Mapping[str, str], host: HostGpus,
                   allowed_minors: frozenset[int] | None = None, *, node: str | None = None) -> Allocation | None:
    """The job's GPUs on this node; None outside a job or when its scheduler set no GPU variable.

    `allowed_minors`: the GPU minors the device cgroup this process runs in
    allows (None: not confined, or cannot tell); LSF's renumbered ids are
    read inside it.  `node`: the host name Torque's GPU file is matched by
    (None: this machine's).  Raises RequestError (one line, naming the
    variable) for a value that names no GPU of this host, or a GPU file
    that cannot be read.
    """
    which = scheduler_of(env)
    if which is None:
        return None
    # each scheduler's reader is imported only for a job of that scheduler
    if which == "Slurm":
        from pyxis_hook.spec.allocation import slurm
        return slurm.read(env, host, allowed_minors, node)
    if which == "HTCondor":
        from pyxis_hook.spec.allocation import htcondor
        return htcondor.read(env, host, allowed_minors, node)
    if which == "LSF":
        from pyxis_hook.spec.allocation import lsf
        return lsf.read(env, host, allowed_minors, node)
    if which == "Torque":
        from pyxis_hook.spec.allocation import torque
        return torque.read(env, host, allowed_minors, node)
    if which == "OpenPBS":
        from pyxis_hook.spec.allocation import openpbs
        return openpbs.read(env, host, allowed_minors, node)
    from pyxis_hook.spec.allocation import flux
    return flux.read(env, host, allowed_minors, node)
