"""A real single-node Slurm (Debian slurm-wlm 22.05, munge) launching a container with the hook.

The cluster is `fixtures.slurmcluster.Cluster` with one node on this host:
gres.conf names `/dev/nvidia[0-3]`, fake nodes made with mknod (only where
absent, removed afterwards), ConstrainDevices=yes on the v1 device
controller.  The container is started by `srun` through
`runc run` with our prestart hook; the launcher copies the step's SLURM_* and
CUDA_VISIBLE_DEVICES into config.json's process.env as podman `--env-host`
or Pyxis would.  While another job holds GPUs 0 and 1, `srun --gres=gpu:2`
must give the container exactly GPUs 2 and 3, and CUDA_VISIBLE_DEVICES=0,1.
Under `--gpus-per-task=1` one container, started from task 0 as Pyxis does,
must let every task open its own GPU.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, hook_entry, make_host
from fixtures.slurmcluster import Cluster

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("slurmctld") and shutil.which("munged")),
                                 reason="slurm-wlm and munge are not installed (.ci/run installs them)")]

REPO = Path(__file__).resolve().parents[2]

LAUNCHER = r'''
import os, subprocess, sys
sys.path.insert(0, {tests!r})
from fixtures.container import make_bundle
bundle, hook_json, script = sys.argv[1], sys.argv[2], sys.argv[3]
import json
keep = [f"{{k}}={{v}}" for k, v in os.environ.items()
        if k.startswith("SLURM_") or k in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")]
make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", *keep),
            args=("/bin/sh", "-c", script), hooks={{"prestart": [json.loads(hook_json)]}})
# Under ConstrainDevices (v1) the step's cgroup is "allow all but the GPUs not allocated"; a child cgroup
# cannot then take runc's default "deny all + c *:* m ..." rules (EPERM from the kernel: the wildcard
# overlaps the parent's exceptions).  Allow-all in the container cgroup copies the step's exceptions,
# so the allocation still confines the container (checked below with mknod/open of other GPUs).
cfg_path = os.path.join(bundle, "config.json")
cfg = json.load(open(cfg_path))
cfg["linux"]["resources"]["devices"] = [{{"allow": True, "access": "rwm"}}]
for k in cfg["process"]["capabilities"]:
    cfg["process"]["capabilities"][k].append("CAP_MKNOD")
json.dump(cfg, open(cfg_path, "w"))
name = "pyxis-slurm-" + os.environ.get("SLURM_JOB_ID", "x")
r = subprocess.run(["runc", "run", name], cwd=bundle, stdin=subprocess.DEVNULL)
subprocess.run(["runc", "delete", "-f", name], capture_output=True)
sys.exit(r.returncode)
'''


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        c.start()
        yield c
    finally:
        c.stop()


PROBE = ("echo $(ls /dev | grep nvidia); /usr/bin/gputest; cat /dev/nvidia2 2>&1 | head -1 | sed 's/^/open2: /'; "
         "mknod /dev/x0 c 195 0 2>&1 | sed 's/^/mknod0: /'; cat /dev/x0 2>&1 | head -1 | sed 's/^/open0: /'; "
         "echo CVD=$CUDA_VISIBLE_DEVICES STEP=$SLURM_STEP_GPUS")


def _launch(cluster, tmp_path, host, gres: str, script: str = PROBE, **kw):
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER.format(tests=str(REPO / "tests")))
    bundle = tmp_path / "bundle"
    fresh_rootfs(bundle / "rootfs")
    import json

    hook = json.dumps(hook_entry(host.conf))
    return cluster.srun(f"--gres={gres}", sys.executable, str(launcher), str(bundle), hook, script, **kw)


def test_srun_gres_gpu2_gives_exactly_the_allocated_gpus(cluster, tmp_path):
    host = make_host(tmp_path / "host")
    busy = subprocess.Popen(["srun", "--gres=gpu:2", "sleep", "60"], env=cluster.env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        cluster.wait_running()
        r = _launch(cluster, tmp_path, host, "gpu:2")
    finally:
        busy.kill()
        busy.wait()
        subprocess.run(["scancel", "-u", "root"], env=cluster.env, capture_output=True)
    assert r.returncode == 0, r.stderr + cluster.logs()
    lines = r.stdout.splitlines()
    gpus = {n for n in lines[0].split() if n[len("nvidia"):].isdigit()}
    assert gpus == {"nvidia2", "nvidia3"}, r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
    # the node is allowed by both the step's and the container's device cgroup: only the driver is missing
    assert "open2: cat: can't open '/dev/nvidia2': No such device or address" in r.stdout
    # GPU 0 belongs to the other job: the step's device cgroup refuses it inside the container
    assert "mknod0: mknod: /dev/x0: Operation not permitted" in r.stdout or \
        "open0: cat: can't open '/dev/x0': Operation not permitted" in r.stdout, r.stdout
    assert "CVD=0,1 STEP=2,3" in r.stdout
    log = (host.base / "hook.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1 agrees with the injected devices" in log


def test_request_outside_the_allocation_is_bounded(cluster, tmp_path):
    """NVIDIA_VISIBLE_DEVICES=all inside a one-GPU step gets that GPU only."""
    host = make_host(tmp_path / "host")
    r = _launch(cluster, tmp_path, host, "gpu:1", script="echo $(ls /dev | grep nvidia); echo CVD=$CUDA_VISIBLE_DEVICES")
    assert r.returncode == 0, r.stderr + cluster.logs()
    gpus = {n for n in r.stdout.splitlines()[0].split() if n[len("nvidia"):].isdigit()}
    assert len(gpus) == 1, r.stdout
    assert "CVD=0" in r.stdout


# Pyxis starts one container per node from the first task and the other tasks join it (setns into its
# namespaces, each staying in its own cgroup).  This launcher does the same with runc: task 0 starts the
# container with the hook, every task then enters its mount namespace and root (`nsenter -m -r`) and opens
# the GPU its own device cgroup allows (found by opening the host's nodes: ENXIO = allowed, EPERM = denied).
# runc's /dev is a tmpfs holding only the injected nodes, as under ENROOT_RESTRICT_DEV=y.
SHARED_LAUNCHER = r'''
import errno, json, os, subprocess, sys, time
sys.path.insert(0, {tests!r})
from fixtures.container import make_bundle
bundle, hook_json = sys.argv[1], sys.argv[2]
local = os.environ["SLURM_LOCALID"]
name = "pyxis-pertask-" + os.environ["SLURM_JOB_ID"]
def wait(path):
    deadline = time.monotonic() + 60
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            sys.exit(f"task {{local}}: timed out waiting for {{path}}")
        time.sleep(0.2)
if local == "0":
    keep = [f"{{k}}={{v}}" for k, v in os.environ.items()
            if k.startswith("SLURM_") or k in ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")]
    make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility", *keep),
                args=("/bin/cat",), hooks={{"prestart": [json.loads(hook_json)]}})
    cfg_path = os.path.join(bundle, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["linux"]["resources"]["devices"] = [{{"allow": True, "access": "rwm"}}]  # see LAUNCHER
    json.dump(cfg, open(cfg_path, "w"))
    # the container's `cat` reads this pipe: it lives until task 0 closes it
    runc = subprocess.Popen(["runc", "run", "-d", name], cwd=bundle, stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL)
    rc = runc.wait()
    open(bundle + ".started", "w").write(str(rc))
    if rc:
        sys.exit(rc)
wait(bundle + ".started")
pid = json.loads(subprocess.run(["runc", "state", name], capture_output=True, text=True, check=True).stdout)["pid"]
own = []
for minor in range(4):
    try:
        os.close(os.open(f"/dev/nvidia{{minor}}", os.O_RDWR))
    except OSError as e:
        if e.errno == errno.ENXIO:
            own.append(minor)
for minor in own:
    r = subprocess.run(["nsenter", "-t", str(pid), "-m", "-r", "-w", "/bin/sh", "-c", f"cat /dev/nvidia{{minor}}"],
                       capture_output=True, text=True)
    print(f"task {{local}} gpu {{minor}}: {{(r.stdout + r.stderr).strip()}}", flush=True)
open(f"{{bundle}}.done{{local}}", "w").close()
if local == "0":
    for i in range(int(os.environ["SLURM_NTASKS"])):
        wait(f"{{bundle}}.done{{i}}")
    subprocess.run(["runc", "delete", "-f", name], capture_output=True)
'''


@pytest.mark.parametrize("bind", [[], ["--gpu-bind=none"]], ids=["gpu-bind", "gpu-bind-none"])
def test_per_task_binding_each_task_opens_its_gpu_in_the_shared_container(cluster, tmp_path, bind):
    """`srun -n2 --gpus-per-task=1`: Slurm tells each task SLURM_STEP_GPUS=0 (or nothing), the hook runs
    in task 0's cgroup, and the one container must still hold task 1's GPU."""
    host = make_host(tmp_path / "host")
    launcher = tmp_path / "shared.py"
    launcher.write_text(SHARED_LAUNCHER.format(tests=str(REPO / "tests")))
    bundle = tmp_path / "bundle"
    fresh_rootfs(bundle / "rootfs")
    import json

    r = cluster.srun("-n2", "--gpus-per-task=1", *bind, sys.executable, str(launcher), str(bundle),
                     json.dumps(hook_entry(host.conf)), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = sorted(ln for ln in r.stdout.splitlines() if ln.startswith("task "))
    # --gpus-per-task binds one GPU to each task; --gpu-bind=none lets each open both of the step's
    assert {ln.split()[1] for ln in lines} == {"0", "1"} and len(lines) == (4 if bind else 2), r.stdout + r.stderr
    # each task's node is in the container and its own cgroup lets it open it (only the driver is missing)
    for line in lines:
        assert "No such device or address" in line, r.stdout
    log = (host.base / "hook.log").read_text()
    if not bind:
        assert "SLURM_STEP_GPUS=0 names 1 of the step's 2 GPU(s) on this node" in log, log
