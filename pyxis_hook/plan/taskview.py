"""A Slurm task's narrower view of its step's GPUs, set aside for the container Pyxis shares.

Pyxis starts one container per node for every task of a step, from
whichever task comes first, so the hook runs once in one task's context.
Under `--gpus-per-task` (or `--gpu-bind`) Slurm renumbers each task's GPU
variables to what that task alone is bound to: the task bound to GPU 1 is
told `SLURM_STEP_GPUS=0` (with `--gpu-bind=none` it is empty) while
`SLURM_GPUS_ON_NODE` still counts the step's GPUs on this node (Slurm's
`src/plugins/gres/gpu/gres_gpu.c`, `gres_p_task_set_env`, through
`src/plugins/gres/common/gres_common.c`, sets the variables per task).  Such a value is neither the step's allocation nor
in host numbering, so it must not bound what the shared container holds.
The step's device cgroup (`host.cgroup.gpu_bound`) still bounds it where it
is readable, and each task's own cgroup confines that task.
"""

from __future__ import annotations

from pyxis_hook.nogpu import split_tokens
from pyxis_hook.spec.slurmvars import GPUS_ON_NODE, SLURM_VARS

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping

__all__ = ("GPUS_ON_NODE", "step_env")


def step_env(env: Mapping[str, str], in_task: bool) -> tuple[Mapping[str, str], tuple[str, ...]]:
    """`env` without the Slurm GPU variables that hold a task's narrower view, and a note for each.

    `in_task`: the hook's process sits in a Slurm task cgroup (`task_N` of a
    step).  A variable is a task's view when it lists fewer GPUs than
    `SLURM_GPUS_ON_NODE`; a step whose tasks each see all of it is unchanged.
    """
    raw = env.get(GPUS_ON_NODE, "").strip()
    if not in_task or not raw.isdigit():
        return env, ()
    on_node = int(raw)
    out: dict[str, str] | None = None
    notes = []
    for var in SLURM_VARS:
        value = env.get(var, "")
        count = len(split_tokens(value))
        if value.strip() and count < on_node:
            out = dict(env) if out is None else out
            del out[var]
            notes.append(f"{var}={value} names {count} of the step's {on_node} GPU(s) on this node "
                         f"({GPUS_ON_NODE}={raw}): this task's renumbered view, not the step's; not read")
    return (env if out is None else out), tuple(notes)
