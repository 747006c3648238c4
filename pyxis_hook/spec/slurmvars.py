"""Slurm's GPU variables, one table for every module that reads them.

`SLURM_STEP_GPUS`/`SLURM_JOB_GPUS` name the GPUs of the step or job on this
node and `SLURM_GPUS_ON_NODE` counts them (Slurm's
`src/plugins/gres/common/gres_common.c` sets them per task).  The
allocation parser (`spec.allocation`) and the task view (`plan.taskview`)
read them; the task view runs on every GPU start, so the names live here
rather than in the parser's module.
"""

SLURM_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
#: the step's GPU count on this node, kept whole when a task's SLURM_*_GPUS are renumbered (plan.taskview)
GPUS_ON_NODE = "SLURM_GPUS_ON_NODE"
