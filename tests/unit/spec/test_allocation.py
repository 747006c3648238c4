"""spec/allocation/: the job's GPUs from each batch scheduler's own variables, each in its own form.

Every value below is one a real job gets; the comment on each test says which
scheduler code writes it (docs/schedulers.md cites the sources).
"""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import DeviceMajors, Gpu, HostGpus
from pyxis_hook.spec.allocation import job_allocation, scheduler_of
from pyxis_hook.spec.config import Config
from pyxis_hook.spec.request import resolve_request

#: four GPUs in PCI order whose minors are not their indices (host index 0 is /dev/nvidia2)
UUIDS = ("GPU-3a1b2c4d-1111-2222-3333-444455556666", "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
         "GPU-b6c5d4e3-aaaa-bbbb-cccc-ddddeeeeffff", "GPU-0f1e2d3c-9999-8888-7777-666655554444")
MINORS = (2, 0, 3, 1)
HOST = HostGpus(driver_version="550.127.05", majors=DeviceMajors(195, 511, 510, 509), gpus=tuple(
    Gpu(index=i, minor=m, uuid=u, bus_id=f"0000:{0x17 + i:02x}:00.0", model="NVIDIA A100-SXM4-80GB",
        proc_name=f"0000:{0x17 + i:02x}:00.0") for i, (m, u) in enumerate(zip(MINORS, UUIDS))))


def indices(alloc) -> list[int]:
    return [g.index for g in alloc.gpus]


def resolve(env, allowed=None, config=None):
    return resolve_request({"NVIDIA_VISIBLE_DEVICES": "all", **env}, {}, HOST, config or Config(), allowed)


def test_no_scheduler():
    assert job_allocation({"CUDA_VISIBLE_DEVICES": "0"}, HOST) is None
    assert scheduler_of({"CUDA_VISIBLE_DEVICES": "0"}) is None


# --------------------------------------------------------------------- no-GPU values


@pytest.mark.parametrize("env, scheduler", [
    # Flux's gpu-affinity shell plugin (src/shell/gpubind.c) writes -1 for a job without GPUs
    ({"FLUX_JOB_ID": "f3Lv2CcRsQ3", "CUDA_VISIBLE_DEVICES": "-1"}, "Flux"),
    # OpenPBS pbs_cgroups hook: a job without GPUs gets an empty value
    ({"PBS_JOBID": "1234.pbs01", "CUDA_VISIBLE_DEVICES": ""}, "OpenPBS"),
    # HTCondor: a slot without GPUs gets the ordinal 10000 in every GPU variable
    ({"_CONDOR_AssignedGPUs": "10000", "CUDA_VISIBLE_DEVICES": "10000", "GPU_DEVICE_ORDINAL": "10000",
      "BATCH_SYSTEM": "HTCondor"}, "HTCondor"),
])
def test_no_gpu_values_mean_no_gpu(env, scheduler):
    alloc = job_allocation(env, HOST)
    assert alloc is not None and alloc.scheduler == scheduler and alloc.gpus == ()
    req = resolve(env)
    assert req.gpus == () and req.scheduler == scheduler  # 'all' is the allocation: nothing, not every GPU
    assert any("selected no GPU" in w for w in req.warnings)
    # the scheduler's no-GPU value is right for a container without GPUs: no "disagrees" warning
    assert not [w for w in req.warnings if "CUDA_VISIBLE_DEVICES" in w], req.warnings
    assert any("the container gets no GPU, CUDA will see none" in r for r in req.reasons)


def test_gpu_outside_a_no_gpu_allocation_names_the_variable():
    with pytest.raises(RequestError) as e:
        resolve_request({"NVIDIA_VISIBLE_DEVICES": "0", "FLUX_JOB_ID": "f3Lv2CcRsQ3",
                         "CUDA_VISIBLE_DEVICES": "-1"}, {}, HOST, Config())
    assert str(e.value) == "GPU 0 is not in this job's allocation (CUDA_VISIBLE_DEVICES=-1)"


# --------------------------------------------------------------------- HTCondor


def test_condor_uuid_prefix():
    # HTCondor >= 9.0 default: _CONDOR_AssignedGPUs holds GPU-<first 8 hex of the UUID>
    env = {"_CONDOR_AssignedGPUs": "GPU-8932f937,GPU-0f1e2d3c", "CUDA_VISIBLE_DEVICES": "GPU-8932f937,GPU-0f1e2d3c",
           "BATCH_SYSTEM": "HTCondor"}
    alloc = job_allocation(env, HOST)
    assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("HTCondor", [1, 3])
    assert alloc.source == "_CONDOR_AssignedGPUs=GPU-8932f937,GPU-0f1e2d3c"
    req = resolve(env)
    assert [g.index for g in req.gpus] == [1, 3]
    assert not any("disagrees" in w for w in req.warnings)  # CUDA takes a unique UUID prefix


def test_condor_by_index_job():
    # condor_gpu_discovery -by-index: _CONDOR_AssignedGPUs=CUDA1,CUDA3; 9.10 to 24.0.13 left the prefix in
    # CUDA_VISIBLE_DEVICES and GPU_DEVICE_ORDINAL too (the bug form: trixie's 23.9.6 wrote CUDA0,CUDA1 into
    # both, tests/e2e/test_htcondor.py), later versions strip it
    for cvd in ("CUDA1,CUDA3", "1,3"):
        env = {"_CONDOR_AssignedGPUs": "CUDA1,CUDA3", "CUDA_VISIBLE_DEVICES": cvd, "GPU_DEVICE_ORDINAL": cvd}
        assert indices(job_allocation(env, HOST)) == [1, 3]
    # without _CONDOR_AssignedGPUs (not passed into the container) the bug form is read from CUDA_VISIBLE_DEVICES
    alloc = job_allocation({"BATCH_SYSTEM": "HTCondor", "CUDA_VISIBLE_DEVICES": "CUDA1,CUDA3"}, HOST)
    assert alloc is not None and indices(alloc) == [1, 3] and alloc.source == "CUDA_VISIBLE_DEVICES=CUDA1,CUDA3"


def test_condor_full_uuid_and_unknown():
    # HTCondor >= 23.0.4 also writes full UUIDs (into NVIDIA_VISIBLE_DEVICES); a full UUID is accepted too
    assert indices(job_allocation({"_CONDOR_AssignedGPUs": UUIDS[2]}, HOST)) == [2]
    with pytest.raises(RequestError, match=r"^_CONDOR_AssignedGPUs=GPU-deadbeef: GPU GPU-deadbeef does not exist"):
        job_allocation({"_CONDOR_AssignedGPUs": "GPU-deadbeef"}, HOST)


def test_condor_23_job_environment():
    # what trixie's HTCondor 23.9.6 wrote for a request_gpus = 2 job and a job without GPUs
    # (tests/e2e/test_htcondor.py runs it): the ids sorted, not in PCI order, and since 23.0.4 also the
    # full UUIDs in NVIDIA_VISIBLE_DEVICES (`none` without GPUs), from the inventory's DeviceUuid
    gpu = {"BATCH_SYSTEM": "HTCondor", "_CONDOR_AssignedGPUs": "GPU-0f1e2d3c,GPU-8932f937",
           "CUDA_VISIBLE_DEVICES": "GPU-0f1e2d3c,GPU-8932f937", "GPU_DEVICE_ORDINAL": "GPU-0f1e2d3c,GPU-8932f937",
           "NVIDIA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[1]}", "_CONDOR_SLOT": "slot1_1"}
    nogpu = {"BATCH_SYSTEM": "HTCondor", "_CONDOR_AssignedGPUs": "10000", "CUDA_VISIBLE_DEVICES": "10000",
             "GPU_DEVICE_ORDINAL": "10000", "NVIDIA_VISIBLE_DEVICES": "none", "_CONDOR_SLOT": "slot1_2"}
    assert indices(job_allocation(gpu, HOST)) == [1, 3]
    # the job's own NVIDIA_VISIBLE_DEVICES as the request, and the image's `all` bounded by the slot
    assert [g.index for g in resolve_request(gpu, {}, HOST, Config()).gpus] == [1, 3]
    assert [g.index for g in resolve({k: v for k, v in gpu.items() if k != "NVIDIA_VISIBLE_DEVICES"}).gpus] == [1, 3]
    assert resolve_request(nogpu, {}, HOST, Config()).gpus == ()
    assert resolve({k: v for k, v in nogpu.items() if k != "NVIDIA_VISIBLE_DEVICES"}).gpus == ()


# --------------------------------------------------------------------- LSF


def test_lsf_renumbered_inside_device_cgroup():
    # bsub -gpu with LSB_RESOURCE_ENFORCE="gpu": the job's device cgroup allows host GPUs 2 and 3
    # (/dev/nvidia3, /dev/nvidia1) and LSF renumbers them from 0: CUDA_VISIBLE_DEVICES=0,1
    env = {"LSB_JOBID": "4711", "CUDA_VISIBLE_DEVICES": "0,1"}
    allowed = frozenset({3, 1})
    alloc = job_allocation(env, HOST, allowed)
    assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("LSF", [2, 3])
    req = resolve(env, allowed)
    assert [g.index for g in req.gpus] == [2, 3] and req.allocation == (2, 3)
    # one renumbered id: the first GPU of the cgroup, not host GPU 1
    assert indices(job_allocation({**env, "CUDA_VISIBLE_DEVICES": "1"}, HOST, allowed)) == [3]
    with pytest.raises(RequestError, match=r"^CUDA_VISIBLE_DEVICES=0,2: GPU 2 does not exist in this job's device "
                                           r"cgroup, which allows 2 GPU\(s\)"):
        job_allocation({**env, "CUDA_VISIBLE_DEVICES": "0,2"}, HOST, allowed)


def test_lsf_global_without_device_cgroup():
    # bsub -gpu without enforcement: LSF writes the GPUs' global ids
    alloc = job_allocation({"LSB_JOBID": "4711", "CUDA_VISIBLE_DEVICES": "1,2"}, HOST)
    assert alloc is not None and indices(alloc) == [1, 2]
    with pytest.raises(RequestError, match=r"GPU 3 is not in this job's allocation \(CUDA_VISIBLE_DEVICES=1,2\)"):
        resolve_request({"NVIDIA_VISIBLE_DEVICES": "3", "LSB_JOBID": "4711", "CUDA_VISIBLE_DEVICES": "1,2"}, {},
                        HOST, Config())


# LSF per task.  IBM Spectrum LSF 10.1.0.10 release notes, "GPU enhancements": LSF sets
# CUDA_VISIBLE_DEVICES<number> for the tasks and LSF MPI converts them into each task's
# CUDA_VISIBLE_DEVICES.  <number> is the task's 1-based host-local rank and every <N> stays in each
# task's environment (IBM's change to Open MPI, "adding OMP_PLACES%d and basic CUDA_VISIBLE_DEVICES
# for LSF", orte/mca/schizo/ompi/schizo_ompi.c: "CUDA_VISIBLE_DEVICES4 - is for rank 3").
# The job below: `bsub -n 2 -gpu "num=1/task"`, both tasks on this host, given host GPUs 1 and 3.


def test_lsf_per_task_variables_alone_are_the_nodes_allocation():
    # the batch script's environment: the per-task variables only (no job-level CUDA_VISIBLE_DEVICES)
    env = {"LSB_JOBID": "4712", "CUDA_VISIBLE_DEVICES1": "1", "CUDA_VISIBLE_DEVICES2": "3"}
    alloc = job_allocation(env, HOST)
    assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("LSF", [1, 3])
    assert alloc.source == "CUDA_VISIBLE_DEVICES1=1; CUDA_VISIBLE_DEVICES2=3"
    req = resolve(env)
    assert [g.index for g in req.gpus] == [1, 3]  # not every GPU of the host
    with pytest.raises(RequestError, match=r"^GPU 0 is not in this job's allocation \(CUDA_VISIBLE_DEVICES1=1; "):
        resolve_request({**env, "NVIDIA_VISIBLE_DEVICES": "0"}, {}, HOST, Config())


def test_lsf_task_share_does_not_bound_the_shared_container():
    # the second task's environment after LSF MPI: its own CUDA_VISIBLE_DEVICES=3, both <N> kept;
    # one container per node serves both tasks, so it must hold both tasks' GPUs
    env = {"LSB_JOBID": "4712", "CUDA_VISIBLE_DEVICES": "3", "CUDA_VISIBLE_DEVICES1": "1",
           "CUDA_VISIBLE_DEVICES2": "3"}
    alloc = job_allocation(env, HOST)
    assert alloc is not None and indices(alloc) == [1, 3]
    assert "a task's CUDA_VISIBLE_DEVICES is its share only" in alloc.reason


def test_lsf_per_task_renumbered_inside_device_cgroup():
    # the same job with LSB_RESOURCE_ENFORCE="gpu": the job's device cgroup allows host GPUs 1 and 3
    # (/dev/nvidia0, /dev/nvidia1) and LSF renumbers them from 0: task 1 gets 0, task 2 gets 1
    allowed = frozenset({0, 1})
    env = {"LSB_JOBID": "4712", "CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES1": "0",
           "CUDA_VISIBLE_DEVICES2": "1"}
    alloc = job_allocation(env, HOST, allowed)
    assert alloc is not None and indices(alloc) == [1, 3]
    req = resolve(env, allowed)
    assert [g.index for g in req.gpus] == [1, 3] and req.allocation == (1, 3)
    with pytest.raises(RequestError, match=r"^CUDA_VISIBLE_DEVICES2=2: GPU 2 does not exist in this job's device"):
        job_allocation({**env, "CUDA_VISIBLE_DEVICES2": "2"}, HOST, allowed)


def test_lsf_per_task_variables_are_scheduler_variables():
    from pyxis_hook.engines.enroot import container_env
    from pyxis_hook.spec.allocation import is_scheduler_var

    assert is_scheduler_var("CUDA_VISIBLE_DEVICES12") and is_scheduler_var("LSB_JOBID")
    assert not is_scheduler_var("CUDA_VISIBLE_DEVICES_X") and not is_scheduler_var("CUDA_VISIBLE_DEVICESX1")
    # under enroot the job's per-task variables come from the hook's own environment, as LSB_JOBID does
    env = container_env((("PATH", "/bin"),), {"LSB_JOBID": "4712", "CUDA_VISIBLE_DEVICES1": "1", "HOME": "/root"})
    assert env["CUDA_VISIBLE_DEVICES1"] == "1" and "HOME" not in env


# --------------------------------------------------------------------- PBS and Torque


def test_openpbs_uuids():
    # OpenPBS >= 20 pbs_cgroups hook: full UUIDs plus CUDA_DEVICE_ORDER=PCI_BUS_ID
    env = {"PBS_JOBID": "1234.pbs01", "CUDA_VISIBLE_DEVICES": f"{UUIDS[3]},{UUIDS[0]}",
           "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    alloc = job_allocation(env, HOST)
    assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("OpenPBS", [0, 3])
    req = resolve(env)
    assert [g.index for g in req.gpus] == [0, 3]
    assert any(r.startswith("OpenPBS job 1234.pbs01") for r in req.reasons)


def test_pbs_pro_19_minors():
    # PBS Pro <= 19 pbs_cgroups hook: /dev/nvidiaN minor numbers; minors 0 and 1 are host GPUs 1 and 3 here
    alloc = job_allocation({"PBS_JOBID": "99.pbs", "CUDA_VISIBLE_DEVICES": "0,1"}, HOST)
    assert alloc is not None and indices(alloc) == [1, 3]


def test_torque_multi_node_gpu_file(tmp_path):
    # Torque >= 4.2.8, one job on two nodes of 4 GPUs, exec_gpus "node01-gpu/2+node01-gpu/3+node02-gpu/0+
    # node02-gpu/1".  adaptivecomputing/torque src/resmom/start_exec.c: every MoM sets PBS_VERSION=TORQUE-<v>
    # and CUDA_VISIBLE_DEVICES to the indices of its own entries; only the mother superior (the MoM with the
    # node file) sets PBS_GPUFILE, a file with one "<host>-gpu<index>" line per entry of every node
    gpufile = tmp_path / "77.torquegpu"
    gpufile.write_text("node01-gpu2\nnode01-gpu3\nnode02-gpu0\nnode02-gpu1\n")
    node01 = {"PBS_JOBID": "77.torque", "PBS_GPUFILE": str(gpufile), "PBS_VERSION": "TORQUE-6.1.3",
              "PBS_NODENUM": "0", "CUDA_VISIBLE_DEVICES": "2,3"}
    node02 = {"PBS_JOBID": "77.torque", "PBS_VERSION": "TORQUE-6.1.3", "PBS_NODENUM": "1",
              "CUDA_VISIBLE_DEVICES": "0,1"}
    for env, want in ((node01, [2, 3]), (node02, [0, 1])):
        alloc = job_allocation(env, HOST)
        # each node's own share, never the file's four entries (which name another node's indices too)
        assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("Torque", want)
        assert [g.index for g in resolve(env).gpus] == want
    assert "PBS_GPUFILE" in job_allocation(node01, HOST).reason


# --------------------------------------------------------------------- Flux, Slurm, policy


def test_flux_global_indices():
    # Flux gpu-affinity plugin: Flux GPU ids = PCI order, not renumbered
    alloc = job_allocation({"FLUX_JOB_ID": "f3Lv2CcRsQ3", "CUDA_VISIBLE_DEVICES": "0,2"}, HOST)
    assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("Flux", [0, 2])


def test_slurm_is_one_source():
    alloc = job_allocation({"SLURM_JOB_ID": "9", "SLURM_STEP_GPUS": "1", "CUDA_VISIBLE_DEVICES": "0"}, HOST)
    assert alloc is not None and (alloc.scheduler, alloc.source, indices(alloc)) == ("Slurm", "SLURM_STEP_GPUS=1",
                                                                                       [1])


def test_scheduler_variable_without_gpu_variable():
    # PBS without the cgroup hook's devices subsystem sets no CUDA_VISIBLE_DEVICES: no bound known
    assert scheduler_of({"PBS_JOBID": "1.pbs"}) == "OpenPBS"
    assert job_allocation({"PBS_JOBID": "1.pbs"}, HOST) is None


def test_policy_ignore_reads_no_scheduler():
    req = resolve({"FLUX_JOB_ID": "f1", "CUDA_VISIBLE_DEVICES": "-1"}, config=Config(slurm_policy="ignore"))
    assert len(req.gpus) == 4 and req.allocation is None
    assert any("slurm-policy is 'ignore'" in r for r in req.reasons)


@pytest.mark.parametrize("env, words", [
    ({"FLUX_JOB_ID": "f1", "CUDA_VISIBLE_DEVICES": "7"}, "CUDA_VISIBLE_DEVICES=7: GPU 7 does not exist on this host"),
    ({"PBS_JOBID": "1.pbs", "CUDA_VISIBLE_DEVICES": "9"}, "CUDA_VISIBLE_DEVICES=9: /dev/nvidia9 is not a GPU"),
    ({"LSB_JOBID": "1", "CUDA_VISIBLE_DEVICES": "GPU-x"}, "CUDA_VISIBLE_DEVICES=GPU-x: 'GPU-x' is not a GPU"),
])
def test_bad_values_are_one_line_errors(env, words):
    with pytest.raises(RequestError) as e:
        job_allocation(env, HOST)
    assert str(e.value).startswith(words) and "\n" not in str(e.value)


# --------------------------------------------------------------------- the allocation rule: never from the image

ALL_FOUR = "0,1,2,3"
#: (the job given host GPU 2, as its scheduler writes it; an image naming all four GPUs; whether the image's
#: variables widened the allocation when the scheduler's variables the job lacked were taken from the image)
IMAGE_CASES = {
    # a batch step has SLURM_JOB_GPUS only, and SLURM_STEP_GPUS is read first
    "slurm batch step": ({"SLURM_JOB_ID": "9", "SLURM_JOB_GPUS": "2", "SLURM_GPUS_ON_NODE": "1"},
                         {"SLURM_STEP_GPUS": ALL_FOUR, "SLURM_JOB_GPUS": ALL_FOUR, "SLURM_GPUS_ON_NODE": "4"}, True),
    "slurm step": ({"SLURM_JOB_ID": "9", "SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": "0"},
                   {"SLURM_STEP_GPUS": ALL_FOUR, "SLURM_JOB_GPUS": ALL_FOUR, "CUDA_VISIBLE_DEVICES": ALL_FOUR},
                   False),
    # LSF's per-task variables are read together with CUDA_VISIBLE_DEVICES: an extra one widens the union
    "lsf": ({"LSB_JOBID": "4711", "CUDA_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES1": "2"},
            {"CUDA_VISIBLE_DEVICES": ALL_FOUR, "CUDA_VISIBLE_DEVICES2": ALL_FOUR, "LSB_JOBID": "1"}, True),
    # another scheduler's variable: Slurm is recognised first
    "openpbs": ({"PBS_JOBID": "1234.pbs01", "CUDA_VISIBLE_DEVICES": UUIDS[2]},
                {"CUDA_VISIBLE_DEVICES": ",".join(UUIDS), "SLURM_JOB_GPUS": ALL_FOUR}, True),
    "torque": ({"PBS_JOBID": "77.torque", "PBS_VERSION": "TORQUE-6.1.3", "CUDA_VISIBLE_DEVICES": "2"},
               {"CUDA_VISIBLE_DEVICES": ALL_FOUR, "_CONDOR_AssignedGPUs": ALL_FOUR, "PBS_GPUFILE": "/nonexistent"},
               True),
    "htcondor": ({"_CONDOR_AssignedGPUs": "GPU-b6c5d4e3", "CUDA_VISIBLE_DEVICES": "GPU-b6c5d4e3",
                  "BATCH_SYSTEM": "HTCondor"},
                 {"_CONDOR_AssignedGPUs": ALL_FOUR, "SLURM_STEP_GPUS": ALL_FOUR, "GPU_DEVICE_ORDINAL": ALL_FOUR}, True),
    "flux": ({"FLUX_JOB_ID": "f3Lv2CcRsQ3", "CUDA_VISIBLE_DEVICES": "2"},
             {"CUDA_VISIBLE_DEVICES": ALL_FOUR, "LSB_JOBID": "1", "CUDA_VISIBLE_DEVICES1": ALL_FOUR}, True),
}


def _old_rule(image, scheduler):
    """What the enroot mode read before: the job's variables over the image's, the image's where the job had none."""
    return {**image, **scheduler}


@pytest.mark.parametrize("case", sorted(IMAGE_CASES))
def test_the_image_never_sets_or_widens_the_allocation(case):
    from pyxis_hook.engines.enroot import container_env
    from pyxis_hook.spec.allocation import request_env

    scheduler, image, widened_before = IMAGE_CASES[case]
    image = {"NVIDIA_VISIBLE_DEVICES": "all", **image}
    # the case is one the old rule got wrong: all four GPUs (or, where it did not, one GPU as now)
    before = [g.index for g in resolve_request(_old_rule(image, scheduler), {}, HOST, Config()).gpus]
    assert before == ([0, 1, 2, 3] if widened_before else [2])
    for env in (request_env(image, scheduler), container_env(tuple(image.items()), scheduler)):
        req = resolve_request(env, {}, HOST, Config())
        assert [g.index for g in req.gpus] == [2] and req.allocation == (2,), (case, req.reasons)
        # an explicit GPU the image's variables named is still outside the job's allocation
        with pytest.raises(RequestError, match="is not in this job's allocation"):
            resolve_request({**env, "NVIDIA_VISIBLE_DEVICES": "0"}, {}, HOST, Config())


def test_an_image_alone_is_no_allocation_and_its_variables_are_logged(capsys):
    from pyxis_hook import log
    from pyxis_hook.spec.allocation import request_env

    image = {"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "compute", "SLURM_STEP_GPUS": "0",
             "PATH": "/bin"}
    log.configure(stderr_level="debug")
    try:
        env = request_env(image, {"HOME": "/root", "NVIDIA_VISIBLE_DEVICES": "3"})
    finally:
        log.configure()
    # the image chooses within the allocation (here: none known); the scheduler's env adds only its own variables
    assert env == {"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "compute", "PATH": "/bin"}
    assert "SLURM_STEP_GPUS=0 in the container's environment is not read" in capsys.readouterr().err
    assert resolve_request(env, {}, HOST, Config()).allocation is None


# --------------------------------------------------------------------- Torque's GPU file


def _torque_file(tmp_path, text):
    path = tmp_path / "77.torquegpu"
    path.write_text(text)
    return {"PBS_JOBID": "77.torque", "PBS_VERSION": "TORQUE-6.1.3", "PBS_GPUFILE": str(path)}


@pytest.mark.parametrize("node", ["node01", "node01.cluster.example"])
@pytest.mark.parametrize("written", ["node01", "node01.cluster.example"])
def test_torque_gpu_file_this_nodes_lines(tmp_path, node, written):
    # `$cuda_visible_devices false` in the MoM config: no CUDA_VISIBLE_DEVICES, only the file says which GPUs;
    # the server names the node in full or short, the machine calls itself either way
    env = _torque_file(tmp_path, f"{written}-gpu3\nnode02-gpu0\n{written}-gpu1\nnode010-gpu2\nnode01x-gpu0\n")
    alloc = job_allocation(env, HOST, node=node)
    assert alloc is not None and (alloc.scheduler, indices(alloc)) == ("Torque", [1, 3])
    assert alloc.source == f"PBS_GPUFILE={env['PBS_GPUFILE']}" and f"({node})" in alloc.reason


def test_torque_gpu_file_other_nodes_lines_are_not_this_nodes(tmp_path):
    # node01 and node02 hold GPUs; this is node03 (and node1, a prefix of node10, is no match either)
    env = _torque_file(tmp_path, "node01-gpu0\nnode02-gpu1\nnode10-gpu2\nnode03.other-gpu5-gpu3\n")
    for node in ("node03.cluster", "node1"):
        alloc = job_allocation(env, HOST, node=node)
        assert alloc is not None and alloc.gpus == ()
    assert indices(job_allocation(env, HOST, node="node03.other-gpu5")) == [3]


def test_torque_gpu_file_through_the_request(tmp_path):
    import posix

    env = _torque_file(tmp_path, f"elsewhere-gpu0\n{posix.uname().nodename}-gpu2\n")
    req = resolve(env)
    assert [g.index for g in req.gpus] == [2] and req.scheduler == "Torque"
    # CUDA_VISIBLE_DEVICES, where Torque set it, is this node's share already: the file is not read then
    assert [g.index for g in resolve({**env, "CUDA_VISIBLE_DEVICES": "0", "PBS_GPUFILE": "/nonexistent/x"}).gpus] == [0]


def test_torque_without_gpu_file_has_no_gpu(tmp_path):
    # the mother superior sets PBS_GPUFILE for every job but writes the file only for a job with GPUs
    env = {"PBS_JOBID": "78.torque", "PBS_VERSION": "TORQUE-6.1.3", "PBS_GPUFILE": str(tmp_path / "78.torquegpu")}
    alloc = job_allocation(env, HOST, node="node01")
    assert alloc is not None and alloc.gpus == () and "does not exist" in alloc.reason
    req = resolve(env)
    assert req.gpus == () and any("selected no GPU" in w for w in req.warnings)
    # a sister node gets neither variable: nothing bounds the job there but its device cgroup
    assert job_allocation({"PBS_JOBID": "78.torque", "PBS_VERSION": "TORQUE-6.1.3"}, HOST) is None


@pytest.mark.parametrize("make, words", [
    (lambda p: p.mkdir(), "Is a directory"),
    (lambda p: p.write_bytes(b"n-gpu0\n" * (1 << 18)), "larger than 1048576 bytes"),
    (lambda p: p.write_text("node01-gpu9\n"), "(node01-gpu9): GPU 9 does not exist on this host"),
])
def test_torque_gpu_file_errors_are_one_line(tmp_path, make, words):
    path = tmp_path / "79.torquegpu"
    make(path)
    env = {"PBS_JOBID": "79.torque", "PBS_GPUFILE": str(path)}
    with pytest.raises(RequestError) as e:
        job_allocation(env, HOST, node="node01")
    assert str(e.value).startswith(f"PBS_GPUFILE={path}") and words in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(RequestError, match="^PBS_GPUFILE=aux/79gpu: not an absolute path$"):
        job_allocation({**env, "PBS_GPUFILE": "aux/79gpu"}, HOST, node="node01")


_HOSTS = st.sampled_from(["n1", "n10", "n1.a", "n2", "gpu-gpu1", "n1.b"])


@given(lines=st.lists(st.tuples(_HOSTS, st.integers(0, 20)), max_size=12), node=_HOSTS)
def test_torque_node_lines_property(lines, node):
    from pyxis_hook.host.torquegpus import node_indices

    text = "".join(f"{h}-gpu{n}\n" for h, n in lines)
    short = node.split(".")[0]
    mine = {n for h, n in lines if h in (node, short) or h.split(".")[0] == node}
    assert node_indices(text, node) == tuple(sorted(mine))
