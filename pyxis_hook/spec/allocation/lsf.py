"""LSF's allocation: CUDA_VISIBLE_DEVICES and the tasks' `CUDA_VISIBLE_DEVICES<N>`, together.

Indices are renumbered from 0 when the job is in a device cgroup
(`LSB_RESOURCE_ENFORCE="gpu"`), global otherwise: counted inside the
cgroup's allowed minors when that bound is known.  `read(env, host,
allowed, node)` (`spec.allocation.job_allocation`'s reader interface):
the `Allocation`, or None when no variable is set; RequestError naming
the variable for a GPU outside this host or the cgroup.
"""

from __future__ import annotations

from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import Gpu, HostGpus
from pyxis_hook.spec.allocation import CVD, is_index, is_lsf_task_var
from pyxis_hook.spec.allocation.gpuforms import Allocation, by_index, indices, parse, usable
from pyxis_hook.spec.envreads import prefixed

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Callable, Mapping


def task_vars(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """LSF's per-task `CUDA_VISIBLE_DEVICES<N>` on this host, by N (1-based host-local task number).

    LSF MPI gives the task of local rank r its `CUDA_VISIBLE_DEVICES<r+1>` as
    CUDA_VISIBLE_DEVICES and leaves every `<N>` variable in each task's
    environment (open-mpi/ompi `orte/mca/schizo/ompi/schizo_ompi.c`,
    `parse_rank_specific_launcher_settings`).
    """
    found = [(int(k[len(CVD):]), k, v) for k, v in prefixed(env, CVD).items() if is_lsf_task_var(k)]
    return [(k, v) for _, k, v in sorted(found)]


def read(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None, node: str | None) -> Allocation | None:
    """The job's GPUs here: CUDA_VISIBLE_DEVICES and every task's `CUDA_VISIBLE_DEVICES<N>`, together.

    One container per node serves all the node's tasks, while a task's own
    CUDA_VISIBLE_DEVICES is its share only; the job-level value (when LSF
    sets one) and the tasks' values together are the node's allocation.
    """
    sources = ([(CVD, env[CVD])] if CVD in env else []) + task_vars(env)
    if not sources:
        return None
    label = "; ".join(f"{k}={v}" for k, v in sources)
    job = f"LSF job {env.get('LSB_JOBID')}"
    tasks = f" (the union over {len(sources)} variables: a task's CUDA_VISIBLE_DEVICES is its share only)" \
        if len(sources) > 1 else ""
    inside = [g for g in usable(host) if g.minor in allowed] if allowed is not None else []

    def reader(var_label: str) -> Callable[[str], Gpu | None]:
        def token(tok: str) -> Gpu | None:
            if not is_index(tok):
                return None
            if allowed is None:
                return by_index(host, var_label, tok)
            if int(tok) >= len(inside):
                raise RequestError(f"{var_label}: GPU {tok} does not exist in this job's device cgroup, which "
                                   f"allows {len(inside)} GPU(s) (LSF renumbers them from 0)")
            return inside[int(tok)]
        return token

    found = {g.minor: g for k, v in sources for g in parse(host, f"{k}={v}", v, reader(f"{k}={v}"))}
    gpus = tuple(sorted(found.values(), key=lambda g: g.index or 0))
    if allowed is None:
        return Allocation("LSF", label, gpus, f"{job}: {label}: host GPUs {indices(gpus)} "
                                              f"(global indices: the job is not in a device cgroup){tasks}")
    return Allocation("LSF", label, gpus, f"{job}: {label} counts the {len(inside)} GPU(s) of its device cgroup "
                                          f"from 0: host GPUs {indices(gpus)}{tasks}")
