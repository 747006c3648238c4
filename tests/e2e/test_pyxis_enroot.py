"""`srun --container-image=...` through real Pyxis 0.24 and enroot 4.1.2 with our hook, on two Slurm nodes.

The cluster (`fixtures.pyxiscluster`) is Debian's Slurm 22.05 with two
slurmds on this machine, each in its own mount + UTS namespace with its own
/dev: node `pxa` holds GPUs with minors 0,1, node `pxb` GPUs with minors 2,3
(host indices 0,1 on both: Slurm's global ids), gres.conf per node,
ConstrainDevices=yes on the v1 device controller.  Pyxis runs enroot, whose
hooks.d holds the `98-pyxis-hook.sh` that `pyxis-hook enroot --install`
writes (and not enroot's `98-nvidia.sh`).  The image is a squashfs file
(`--container-image=/path/x.sqsh`) whose environment says
`NVIDIA_VISIBLE_DEVICES=all`.

In the container a GPU node the task may open gives ENXIO ("No such device
or address": allowed, but no kernel driver here) and one its device cgroup
denies gives EPERM; under `ENROOT_RESTRICT_DEV=y` /dev holds only what the
hook injected, without it enroot binds the node's whole /dev.

Jobs are submitted as an ordinary user (`USER`), as on a real cluster:
enroot then runs the hook as that user in a user namespace.  The node is
set up as docs/enroot-pyxis.md tells an admin: the node artifact built by
root (`pyxis-hook refresh`) and one root GPU start (the start image) before
any user's job.  A user's start must write nothing the node keeps (its
snapshot-dir, the start image, root's log file) and warn about nothing.
Tests that read the hook's own log submit as root.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.conftest import DRIVER_VERSION, fresh_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus
from fixtures.pyxisbuild import require_build
from fixtures.pyxiscluster import USER, cached_squashfs, pyxis_cluster, squashfs_image

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.real_engine,
              pytest.mark.skipif(not (shutil.which("slurmctld") and shutil.which("munged")),
                                 reason="slurm-wlm and munge are not installed (.ci/run installs them)")]

ENXIO = "No such device or address"
EPERM = "Operation not permitted"
NODE_MINORS = {"pxa": (0, 1), "pxb": (2, 3)}
IMAGE_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}

#: one line per task (busybox sh): what it sees, then one line per GPU node it tries to open
PROBE = r'''
n=$(hostname) t=$SLURM_PROCID
echo "TASK $n $t uid=$(id -u) gpus=$(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\n' ,) ctl=$(ls /dev | grep -c '^nvidiactl$') \
STEP=$SLURM_STEP_GPUS JOB=$SLURM_JOB_GPUS CVD=$CUDA_VISIBLE_DEVICES NVD=$NVIDIA_VISIBLE_DEVICES \
cuda=$(gputest 2>&1 | head -1 | tr ' ' _)"
for d in /dev/nvidia[0-9]*; do [ -e "$d" ] && echo "OPEN $n $t ${d#/dev/} $(cat "$d" 2>&1 | head -1 | sed 's/.*: //')"; done
true
'''


@dataclass
class Task:
    """One task's report from inside its container."""

    node: str
    rank: str
    fields: dict[str, str]
    opens: dict[str, str] = field(default_factory=dict)

    @property
    def gpus(self) -> set[str]:
        return {g for g in self.fields["gpus"].split(",") if g}

    def allowed(self) -> set[str]:
        """The GPU nodes this task may open (ENXIO), as opposed to EPERM from its device cgroup."""
        return {d for d, err in self.opens.items() if err == ENXIO}


def parse(stdout: str) -> dict[tuple[str, str], Task]:
    tasks: dict[tuple[str, str], Task] = {}
    for line in stdout.splitlines():
        parts = line.split(" ")
        if parts[0] == "TASK":
            tasks[(parts[1], parts[2])] = Task(parts[1], parts[2], dict(p.split("=", 1) for p in parts[3:]))
    for line in stdout.splitlines():
        parts = line.split(" ", 4)
        if parts[0] == "OPEN":
            tasks[(parts[1], parts[2])].opens[parts[3]] = parts[4]
    return tasks


def names(minors) -> set[str]:
    return {f"nvidia{m}" for m in minors}


@pytest.fixture(scope="module")
def pyxis():
    build = require_build()
    base = Path(tempfile.mkdtemp(prefix="pyxis-e2e-", dir="/tmp"))
    os.chmod(base, 0o755)  # the user's jobs walk into it: pytest's tmp dirs are root's alone
    try:
        yield from _cluster(base, build)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _cluster(base: Path, build):
    driver = make_fake_driver(base / "driver", version=DRIVER_VERSION)
    gpus = {name: fake_gpus(2, minors=list(m), first_bus=0x06 + 0x10 * i) for i, (name, m) in
            enumerate(NODE_MINORS.items())}
    cluster, nodes = pyxis_cluster(base, build, gpus, driver)
    rootfs = fresh_rootfs(base / "rootfs")
    (rootfs / "probe.sh").write_text(PROBE)
    (rootfs / "root").mkdir(exist_ok=True)  # --container-remap-root starts the task in root's home
    image = squashfs_image(rootfs, base / "image.sqsh", IMAGE_ENV)
    try:
        cluster.start()
        # the admin's second step: one root GPU start on each node writes the start image users' starts run
        first = cluster.srun("-N2", "--gres=gpu:1", f"--container-image={image}", "true",
                             env={**cluster.env, "ENROOT_RESTRICT_DEV": "y"}, timeout=120)
        assert first.returncode == 0, first.stdout + first.stderr + cluster.logs()
        yield cluster, nodes, image
    finally:
        cluster.stop()
        for node in nodes.values():
            node.syslog.close()


def kept(pyxis) -> dict[str, tuple[int, int, int]]:
    """What the nodes keep between starts, root's: each snapshot-dir, the start image, each hook log.

    path -> (uid, size, mtime); a start that wrote, replaced or removed any of them changes this.
    """
    _, nodes, _ = pyxis
    package = next(iter(nodes.values())).package
    paths = [p for node in nodes.values() for p in (node.snapshot, *node.snapshot.iterdir(), node.log)]
    paths += list((package / "__pycache__").glob("start-image.*"))
    return {str(p): (st.st_uid, st.st_size, st.st_mtime_ns) for p in paths if (st := p.stat())}


#: Pyxis shows enroot's start log (the hook's stderr among it) only for a failed start, or with these
SHOW_START_LOG = ("--container-entrypoint", "--container-entrypoint-log")


def fields(record: str) -> dict[str, str]:
    """A system log record's `key=value` words."""
    return dict(w.split("=", 1) for w in record.split() if "=" in w)


def srun(pyxis, *args: str, env: dict[str, str] | None = None, script: str = PROBE, image: Path | None = None,
         timeout: int = 120, uid: int = USER,
         remap_root: bool = False) -> tuple[subprocess.CompletedProcess, dict[tuple[str, str], Task]]:
    """The step run as `uid` (root: 0) in a container (`--container-remap-root` maps the user to root in it).

    Beyond success, for any uid: no `pyxis-hook:` warning on the step's
    stderr, every task runs as the uid it should, each node that ran a GPU
    container sent one start record naming the hook's uid; for a user, the
    kept files (`kept`) are as they were.
    """
    cluster, nodes, default_image = pyxis
    for node in nodes.values():
        node.records()
    before = kept(pyxis)
    assert any("start-image." in p for p in before), f"root's first start left no start image: {sorted(before)}"
    remap = ["--container-remap-root"] if remap_root else []
    r = cluster.srun(*args, *remap, *SHOW_START_LOG, f"--container-image={image or default_image}", "sh", "-c", script,
                     env={**cluster.env, **(env or {})}, timeout=timeout, uid=uid)
    assert r.returncode == 0, r.stdout + r.stderr + cluster.logs()
    assert "pyxis-hook:" not in r.stderr, r.stderr
    tasks = parse(r.stdout)
    assert tasks and {t.fields["uid"] for t in tasks.values()} == {"0" if remap_root else str(uid)}, r.stdout
    # the hook ran as the job's user: its one record per GPU container names the uid it ran as
    who = {"uid": str(uid), "ns_uid": "0" if remap_root or not uid else str(uid)}
    gpu_start = (env or {}).get("NVIDIA_VISIBLE_DEVICES") != "void"  # void: not a GPU container, no record
    ran = {t.node for t in tasks.values()} if gpu_start else set()
    for name, node in nodes.items():
        records = [fields(rec) for rec in node.records() if " pyxis-hook[" in rec]
        assert len(records) == (name in ran), (name, records)
        for rec in records:
            assert {k: rec.get(k) for k in (*who, "result")} == {**who, "result": "ok"}, rec
            assert rec.get("artifact") == "read", rec  # root's node artifact, trusted in the user's namespace
    if uid:
        assert kept(pyxis) == before, "an ordinary user's start wrote what the node keeps"
    return r, tasks


def holding(pyxis, *args: str) -> subprocess.Popen:
    """A job (no container) holding GPUs while a test runs; stop it with `release`."""
    cluster = pyxis[0]
    p = subprocess.Popen(["srun", *args, "sleep", "120"], env=cluster.env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    cluster.wait_running()
    return p


def release(pyxis, p: subprocess.Popen) -> None:
    p.kill()
    p.wait()
    subprocess.run(["scancel", "-u", "root"], env=pyxis[0].env, capture_output=True)


RESTRICT = [{"ENROOT_RESTRICT_DEV": "y"}, {}]
RESTRICT_IDS = ["restrict-dev", "host-dev"]


#: who submits: an ordinary user, the same user mapped to root in the container, root itself
WHO = {"user": {"uid": USER}, "user-remap-root": {"uid": USER, "remap_root": True}, "root": {"uid": 0}}


@pytest.mark.parametrize("env,who", [(e, w) for e in RESTRICT for w in ("user", "user-remap-root")]
                         + [({}, "root")],
                         ids=[f"{i}-{w}" for i in RESTRICT_IDS for w in ("user", "user-remap-root")] + ["host-dev-root"])
def test_one_node_gets_exactly_its_allocation_while_another_job_holds_a_gpu(pyxis, env, who):
    holder = holding(pyxis, "-w", "pxa", "--gres=gpu:1")
    try:
        _, tasks = srun(pyxis, "-w", "pxa", "--gres=gpu:1", env=env, **WHO[who])
    finally:
        release(pyxis, holder)
    (task,) = tasks.values()
    # the other job holds host GPU 0 (minor 0): this step is GPU 1, which CUDA numbers 0
    assert (task.fields["STEP"], task.fields["CVD"], task.fields["NVD"]) == ("1", "0", "all"), task
    assert task.fields["cuda"] == "cuDriverGetVersion=12020_rc=0", task
    # without ENROOT_RESTRICT_DEV enroot binds the node's /dev: the cgroup is then the only boundary
    assert task.gpus == ({"nvidia1"} if env else names(NODE_MINORS["pxa"])), task
    assert task.allowed() == {"nvidia1"}, task
    if not env:
        assert task.opens["nvidia0"] == EPERM, task


@pytest.mark.parametrize("value", ["void", "none"])
def test_the_jobs_void_or_none_wins_over_the_images_all(pyxis, value):
    _, tasks = srun(pyxis, "-w", "pxa", "--gres=gpu:2", env={"ENROOT_RESTRICT_DEV": "y", "NVIDIA_VISIBLE_DEVICES": value})
    (task,) = tasks.values()
    assert task.gpus == set(), task
    # the task reads what the hook honoured (written back to enroot's environment), not the image's `all`
    assert task.fields["NVD"] == value, task
    if value == "none":  # driver only: the control node and the host's libcuda, no GPU
        assert task.fields["ctl"] == "1" and task.fields["cuda"] == "cuDriverGetVersion=12020_rc=0", task
    else:  # not a GPU container: nothing injected
        assert task.fields["ctl"] == "0" and "cuDriverGetVersion" not in task.fields["cuda"], task


@pytest.mark.parametrize("env", RESTRICT, ids=RESTRICT_IDS)
def test_two_nodes_each_container_holds_its_nodes_gpus(pyxis, env):
    _, tasks = srun(pyxis, "-N2", "--gres=gpu:2", env=env)
    assert sorted(t.node for t in tasks.values()) == ["pxa", "pxb"], tasks
    for task in tasks.values():
        mine = names(NODE_MINORS[task.node])
        assert task.gpus == mine and task.allowed() == mine, task
        assert (task.fields["STEP"], task.fields["CVD"]) == ("0,1", "0,1"), task
        assert task.fields["cuda"] == "cuDriverGetVersion=12020_rc=0", task


def test_gpus_3_spread_over_two_nodes(pyxis):
    _, tasks = srun(pyxis, "-N2", "--gpus=3", env={"ENROOT_RESTRICT_DEV": "y"})
    assert sorted(len(t.gpus) for t in tasks.values()) == [1, 2], tasks
    for task in tasks.values():
        assert task.gpus <= names(NODE_MINORS[task.node]) and task.allowed() == task.gpus, task
        assert len(task.fields["STEP"].split(",")) == len(task.gpus), task


def test_sbatch_step_on_the_second_node_follows_its_step_gpus(pyxis):
    """A user's step on a node other than the batch host inherits the batch host's SLURM_JOB_GPUS."""
    cluster, nodes, image = pyxis
    holder = holding(pyxis, "-w", "pxb", "--gres=gpu:1")  # pxb's host GPU 0 (minor 2) is taken
    outdir = Path(tempfile.mkdtemp(prefix="batch-", dir=cluster.base))
    os.chown(outdir, USER, USER)  # the batch script's output is the user's
    out = outdir / "batch.out"
    before = kept(pyxis)
    try:
        r = cluster.run("sbatch", "--wait", "-N2", "--gres=gpu:1", "-w", "pxa,pxb", "-o", str(out),
                        f"--wrap=srun {' '.join(SHOW_START_LOG)} --container-image={image} sh /probe.sh",
                        env={**cluster.env, "ENROOT_RESTRICT_DEV": "y"}, timeout=180, uid=USER)
    finally:
        release(pyxis, holder)
    text = out.read_text() if out.exists() else ""
    assert r.returncode == 0, r.stdout + r.stderr + text + cluster.logs()
    assert "pyxis-hook:" not in text and kept(pyxis) == before, text
    tasks = {t.node: t for t in parse(text).values()}
    assert set(tasks) == {"pxa", "pxb"}, text
    assert (tasks["pxa"].fields["STEP"], tasks["pxa"].gpus) == ("0", {"nvidia0"}), text
    # pxb was given its host GPU 1 (minor 3), yet reads the batch host's SLURM_JOB_GPUS=0
    b = tasks["pxb"]
    assert (b.fields["STEP"], b.fields["JOB"]) == ("1", "0"), text
    assert b.gpus == {"nvidia3"} and b.allowed() == {"nvidia3"}, text
    assert {t.fields["uid"] for t in tasks.values()} == {str(USER)}, text


@pytest.mark.parametrize("bind", [[], ["--gpu-bind=none"]], ids=["gpu-bind", "gpu-bind-none"])
def test_per_task_binding_each_task_opens_its_gpu_in_the_nodes_container(pyxis, bind):
    """`srun -N2 -n4 --gpus-per-task=1`: one container per node, started by one task, must hold both tasks' GPUs."""
    _, tasks = srun(pyxis, "-N2", "-n4", "--gpus-per-task=1", *bind, env={"ENROOT_RESTRICT_DEV": "y"},
                    uid=0)  # root: the hook's own log says what it did
    bound = not bind  # Slurm binds each task to its GPU unless --gpu-bind=none
    assert len(tasks) == 4, tasks
    for node, minors in NODE_MINORS.items():
        on_node = [t for t in tasks.values() if t.node == node]
        assert len(on_node) == 2, tasks
        for task in on_node:
            assert task.gpus == names(minors), task  # the step's GPUs on this node are in the container
        if bound:  # each task opens its own GPU, which Slurm told it is GPU 0
            assert sorted(len(t.allowed()) for t in on_node) == [1, 1], on_node
            assert set.union(*(t.allowed() for t in on_node)) == names(minors), on_node
            assert all((t.fields["STEP"], t.fields["CVD"]) == ("0", "0") for t in on_node), on_node
        else:  # every task may open both of the step's GPUs on its node; Slurm tells it neither
            assert all(t.allowed() == names(minors) for t in on_node), on_node
            assert all((t.fields["STEP"], t.fields["CVD"]) == ("", "") for t in on_node), on_node
    if bound:
        for node in pyxis[1].values():
            assert "names 1 of the step's 2 GPU(s) on this node (SLURM_GPUS_ON_NODE=2)" in node.log_text()


def test_a_node_the_nodes_own_dev_lacks_is_never_created_in_it(pyxis):
    """dev-root names a tree with a node that the node's /dev lacks.  Without ENROOT_RESTRICT_DEV enroot
    binds the node's /dev into the container: the hook must not create a mount point in it (it would be an
    empty file on the node), so the start fails with its one line.  With ENROOT_RESTRICT_DEV the container's
    /dev is its own tmpfs and gets the node."""
    cluster, nodes, _ = pyxis
    node = nodes["pxa"]
    slurmd = (cluster.base / "slurmd.pxa.pid").read_text().strip()
    tools = Path(f"/proc/{slurmd}/root/dev/nvidia-uvm-tools")  # the node's own /dev, in its namespace
    st = os.lstat(tools)
    os.unlink(tools)
    node.write_conf(node.base.parent / "driver", dev_root=str(node.base / "host"))
    try:
        host_dev = cluster.srun("-w", "pxa", "--gres=gpu:1", f"--container-image={pyxis[2]}", "true",
                                env=cluster.env, timeout=120)
        created = os.path.lexists(tools)
        _, tasks = srun(pyxis, "-w", "pxa", "--gres=gpu:1", env={"ENROOT_RESTRICT_DEV": "y"},
                        script="ls /dev/nvidia-uvm-tools && " + PROBE, uid=0)
    finally:
        if not os.path.lexists(tools):
            os.mknod(tools, st.st_mode, st.st_rdev)
        node.write_conf(node.base.parent / "driver")
    assert host_dev.returncode != 0, host_dev.stdout + host_dev.stderr
    assert not created, "the hook created a mount point in the node's /dev"
    assert "device node /dev/nvidia-uvm-tools (in " in node.log_text()
    assert "not created: it is a host directory bound into the container" in node.log_text()
    (task,) = tasks.values()
    assert task.fields["cuda"] == "cuDriverGetVersion=12020_rc=0", task


@pytest.mark.realdriver
@pytest.mark.parametrize("uid", [USER, 0], ids=["user", "root"])
def test_cuda_clients_image_loads_the_host_driver(pyxis, tmp_path, uid):
    """A Debian image with cuda-bindings and nvidia-ml-py from PyPI, started by Pyxis, loads the host's 535 driver."""
    from e2e.test_cuda_clients import LINE, PROBE as CLIENT_PROBE, file_id, host_file, mapped_from
    from fixtures.distroimage import require_image
    from fixtures.realdriver import CUDA_VERSION, driver_version, require_driver_root

    cluster, nodes, _ = pyxis
    driver = require_driver_root(LINE, "debian")
    image = cached_squashfs(require_image(), {"probe.py": CLIENT_PROBE}, tmp_path / "overlay")
    node = nodes["pxa"]
    version = node.base / "host/proc/driver/nvidia/version"
    fake_version = version.read_text()
    version.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version(LINE)}  "
                       "Thu Jan  1 00:00:00 UTC 2026\n")
    try:
        node.write_conf(driver)  # the node artifact is the driver's the kernel module names
        before = kept(pyxis)
        r = cluster.srun("-w", "pxa", "--gres=gpu:1", *SHOW_START_LOG, f"--container-image={image}", "python3",
                         "/probe.py", env={**cluster.env, **IMAGE_ENV, "ENROOT_RESTRICT_DEV": "y"}, timeout=300, uid=uid)
        after = kept(pyxis)
    finally:
        version.write_text(fake_version)
        node.write_conf(node.base.parent / "driver")
    assert r.returncode == 0, r.stdout + r.stderr + cluster.logs()
    assert "pyxis-hook:" not in r.stderr, r.stderr
    if uid:
        assert after == before, "an ordinary user's start wrote what the node keeps"
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")]
    assert lines, r.stdout + r.stderr
    probe = json.loads(lines[-1][len("PROBE "):])
    assert probe["cuDriverGetVersion"] == [0, CUDA_VERSION[LINE]], probe
    assert probe["cuInit"] == 100 and probe["nvmlInit"] == 9, probe  # no kernel module on this machine
    # the files the interpreter mapped are the host driver's own (device, inode), bound in by the hook
    assert mapped_from(probe, "libcuda.so") == {file_id(host_file(driver, "libcuda.so"))}, probe["maps"]
    assert mapped_from(probe, "libnvidia-ml.so") == {file_id(host_file(driver, "libnvidia-ml.so"))}, probe["maps"]



def test_a_users_start_that_warns_is_heard_on_the_steps_stderr(pyxis):
    """What makes `srun`'s no-warning check mean something: a user's warning does reach the step's stderr.

    A log file the user may not open because it is root's is no warning;
    one in a directory that does not exist is.
    """
    cluster, nodes, image = pyxis
    node = nodes["pxa"]
    text = node.conf.read_text()
    node.conf.write_text(text.replace(f'log-file = "{node.log}"', f'log-file = "{node.base}/absent/hook.log"'))
    try:
        r = cluster.srun("-w", "pxa", "--gres=gpu:1", *SHOW_START_LOG, f"--container-image={image}", "true",
                         env=cluster.env, timeout=120, uid=USER)
    finally:
        node.conf.write_text(text)
    assert r.returncode == 0, r.stdout + r.stderr + cluster.logs()
    assert f"pyxis-hook: warning: cannot open log file {node.base}/absent/hook.log" in r.stderr, r.stderr
