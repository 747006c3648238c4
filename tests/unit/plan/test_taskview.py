"""plan/taskview.py and prepare.confinement: a Slurm task's narrower GPU view, widened to its step's.

Recorded from `srun -N2 -n4 --gpus-per-task=1 --container-image=...` with ConstrainDevices=yes
(cgroup/v1): Pyxis starts one container per node from the first task, so the hook runs in that
task's context.  The task bound to GPU 1 is told SLURM_STEP_GPUS=0 and CUDA_VISIBLE_DEVICES=0
(with --gpu-bind=none both are empty) while SLURM_GPUS_ON_NODE=2; its device cgroup
.../step_0/task_1 allows only 195:1, its step's 195:0 and 195:1.  The container must hold both.
"""

from __future__ import annotations

import pytest

from pyxis_hook import log
from pyxis_hook.plan.prepare import confinement
from pyxis_hook.plan.taskview import step_env
from pyxis_hook.spec.config import Config
from pyxis_hook.spec.request import resolve_request
from unit.host.test_cgroup import STEP_RULES, TASK_RULES, _slurm_tree
from unit.spec.test_request import mkhost

BASE = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "SLURM_JOB_ID": "42", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_GPUS_PER_TASK": "1"}
TASK1_BOUND = {**BASE, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_GPUS": "0",
               "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "2"}
TASK1_UNBOUND = {**BASE, "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_GPUS": "",
                 "CUDA_VISIBLE_DEVICES": "", "SLURM_GPUS_ON_NODE": "2"}
# `srun --gres=gpu:2` one task per node: the task sees its whole step
WHOLE_STEP = {**BASE, "SLURM_STEP_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1", "SLURM_GPUS_ON_NODE": "2"}


def _minors(env, tmp_path, step_rules, task_rules, task=True):
    host = mkhost(4)
    env2, allowed = confinement(env, host, _slurm_tree(tmp_path, step_rules, task_rules, task), 9)
    req = resolve_request(env2, {}, host, Config(), allowed)
    return sorted(g.minor for g in req.gpus), req


@pytest.mark.parametrize("env", [TASK1_BOUND, TASK1_UNBOUND], ids=["gpu-bind", "gpu-bind-none"])
def test_per_task_binding_gives_the_steps_gpus(env, tmp_path):
    minors, req = _minors(env, tmp_path, STEP_RULES, TASK_RULES)
    assert minors == [0, 1]
    # the task's own CUDA_VISIBLE_DEVICES=0 is its one GPU, which CUDA numbers 0 under its cgroup
    assert not [w for w in req.warnings if "disagrees" in w]


def test_the_log_says_which_source_won(tmp_path, capsys):
    log.configure(stderr_level="info")
    try:
        _minors(TASK1_BOUND, tmp_path, STEP_RULES, TASK_RULES)
    finally:
        log.configure()
    text = capsys.readouterr().err
    assert "GPUs from the step's device cgroup (step_0) over the task's (task_1)" in text
    assert "SLURM_STEP_GPUS=0 names 1 of the step's 2 GPU(s) on this node" in text


def test_step_without_task_cgroups_unchanged(tmp_path):
    env = {**BASE, "SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0", "SLURM_GPUS_ON_NODE": "1"}
    assert _minors(env, tmp_path, TASK_RULES, None, task=False)[0] == [1]


def test_task_that_sees_its_whole_step_unchanged(tmp_path):
    minors, req = _minors(WHOLE_STEP, tmp_path, STEP_RULES, STEP_RULES)
    assert minors == [0, 1] and req.allocation == (0, 1)


def test_step_env_keeps_a_view_that_counts_the_step():
    assert step_env(WHOLE_STEP, True) == (WHOLE_STEP, ())
    assert step_env(TASK1_BOUND, False) == (TASK1_BOUND, ())
    env, notes = step_env(TASK1_BOUND, True)
    assert "SLURM_STEP_GPUS" not in env and len(notes) == 1
    assert step_env({**TASK1_BOUND, "SLURM_GPUS_ON_NODE": "x"}, True)[1] == ()


def test_doctor_reads_the_job_as_the_hook_does(tmp_path):
    """doctor's scheduler line comes from the hook's own decision: a task's renumbered
    SLURM_STEP_GPUS=0 is set aside there too, not reported as the job's GPUs."""
    from pyxis_hook.diag.doctorenv import DoctorEnv
    from pyxis_hook.diag.schedcheck import check_scheduler

    proc = _slurm_tree(tmp_path, STEP_RULES, TASK_RULES, True)
    [f] = check_scheduler(mkhost(4), Config(proc_root=proc), DoctorEnv(environ=tuple(TASK1_BOUND.items()), self_pid=9))
    assert (f.severity, f.code) == ("info", "scheduler") and "not set" in f.what


def test_enroot_hook_reads_the_step_count_from_its_own_environment(tmp_path):
    """Pyxis runs enroot, and so its hook, with the task's environment; the image's file has no Slurm variables.

    Seen with real Pyxis 0.24 + enroot 4.1.2: without SLURM_GPUS_ON_NODE taken
    over from the hook's environment, task 0's SLURM_STEP_GPUS=0 bounded the
    shared container to one GPU and task 1 found no node for its own.
    """
    from pyxis_hook.engines import enroot

    image = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
    own = {k: v for k, v in TASK1_BOUND.items() if not k.startswith("NVIDIA_")}
    env = enroot.container_env(image, own)
    assert env["SLURM_GPUS_ON_NODE"] == "2"
    assert _minors(env, tmp_path, STEP_RULES, TASK_RULES)[0] == [0, 1]
