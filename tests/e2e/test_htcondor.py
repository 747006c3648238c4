"""A real HTCondor job's environment starting a container through the hook.

A personal HTCondor (Debian trixie's `condor`, `fixtures.htcondor`) takes
the fixture host's four GPUs as its inventory, in condor_gpu_discovery's
own output format, once with the default ids (`GPU-<8 hex>`) and once with
`-by-index` ids (`CUDA<N>`).  It runs a `request_gpus = 2` job and a job
without GPUs; each job prints its environment (`env -0`).  HTCondor runs
jobs as their unprivileged owner, so the container is then started here as
root with that environment in config.json's process.env, the shape of a
root launcher, by runc with our prestart hook, on the fixture host whose
GPUs the inventory reported.

Where each value comes from: the GPU ids, UUIDs and PCI bus ids are the
fixture host's (`fake_gpus`, minors deliberately not in PCI order); every
GPU variable of the job (`_CONDOR_AssignedGPUs`, `CUDA_VISIBLE_DEVICES`,
`GPU_DEVICE_ORDINAL`, `NVIDIA_VISIBLE_DEVICES`, the no-GPU `10000` and
`none`) is written by HTCondor itself; which two GPUs the job gets is
HTCondor's choice.  The image asks for `NVIDIA_VISIBLE_DEVICES=all`.
"""

from __future__ import annotations

import shutil

import pytest

from e2e.conftest import fresh_rootfs, hook_entry, make_host, run_container
from fixtures.container import make_bundle
from fixtures.htcondor import Job, PoolRun, discovery_output, gpu_id, require_condor_root, run_pool
from fixtures.hosttree import fake_gpus

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not (shutil.which("mmdebstrap") and shutil.which("runc")),
                                 reason="mmdebstrap and runc are not installed (.ci/run installs them)")]

#: four GPUs in PCI order whose /dev/nvidiaN minors are 2, 0, 3, 1 (so an index is never a minor)
GPUS = fake_gpus(4, minors=[2, 0, 3, 1])
JOBS = (Job("gpu", request_gpus=2), Job("nogpu"))
IMAGE_ENV = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
PROBE = "echo $(ls /dev | grep nvidia); /usr/bin/gputest; echo CVD=$CUDA_VISIBLE_DEVICES"


@pytest.fixture(scope="module", params=["uuid", "by-index"])
def pool(request, tmp_path_factory) -> tuple[str, PoolRun]:
    """One pool run per id form: (form, what the jobs saw)."""
    root = require_condor_root()
    inventory = discovery_output(GPUS, by_index=request.param == "by-index")
    return request.param, run_pool(root, tmp_path_factory.mktemp(f"condor-{request.param}"), inventory, JOBS)


def inventory_minors(by_index: bool) -> dict[str, int]:
    """The inventory's id of each GPU -> its /dev/nvidiaN minor (what the fixture host really has)."""
    return {gpu_id(g, i, by_index): g.minor for i, g in enumerate(GPUS)}


def test_the_jobs_environments_are_htcondors(pool):
    """The values the hook must read, as HTCondor 23 wrote them (docs/schedulers.md records them)."""
    form, run = pool
    assert run.version.startswith("$CondorVersion: 23."), run.version
    gpu, nogpu = run.envs["gpu"], run.envs["nogpu"]
    assigned = gpu["_CONDOR_AssignedGPUs"].split(",")
    ids = inventory_minors(form == "by-index")
    assert len(assigned) == 2 and set(assigned) <= set(ids), gpu
    assert gpu["BATCH_SYSTEM"] == "HTCondor"
    # the full UUIDs, from the inventory's DeviceUuid, whichever id form the inventory used
    by_minor = {g.minor: g.uuid for g in GPUS}
    assert gpu["NVIDIA_VISIBLE_DEVICES"] == ",".join(by_minor[ids[a]] for a in assigned)
    if form == "uuid":
        assert gpu["CUDA_VISIBLE_DEVICES"] == gpu["GPU_DEVICE_ORDINAL"] == gpu["_CONDOR_AssignedGPUs"]
    else:
        # 23.x leaves the CUDA prefix in (the `/CUDA//` rewrite of ENVIRONMENT_FOR_AssignedGPUs does not
        # apply); later versions strip it: the hook accepts both
        assert gpu["CUDA_VISIBLE_DEVICES"] in (gpu["_CONDOR_AssignedGPUs"], ",".join(a[4:] for a in assigned))
    for var in ("_CONDOR_AssignedGPUs", "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL"):
        assert nogpu[var] == "10000", nogpu
    assert nogpu["NVIDIA_VISIBLE_DEVICES"] == "none"


def _container(tmp_path, host, env: tuple[str, ...]):
    bundle = tmp_path / "bundle"
    fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle, env=env, args=("/bin/sh", "-c", PROBE), hooks={"prestart": [hook_entry(host.conf)]})
    return run_container("runc", bundle, f"pyxis-condor-{tmp_path.name}"[:60])


def _gpu_nodes(stdout: str) -> set[int]:
    return {int(n[len("nvidia"):]) for n in stdout.splitlines()[0].split() if n[len("nvidia"):].isdigit()}


@pytest.mark.parametrize("launcher", ["job-env", "image-request"])
@pytest.mark.parametrize("job", ["gpu", "nogpu"])
def test_container_gets_exactly_the_jobs_gpus(pool, tmp_path, job, launcher):
    """job-env: the image's environment, then every variable the job had (later wins, as `-e` does), so
    HTCondor's own NVIDIA_VISIBLE_DEVICES is the request.  image-request: the image's request `all` is
    kept and the job's other variables passed: `all` must mean the job's GPUs (none for 10000)."""
    form, run = pool
    env = run.envs[job]
    host = make_host(tmp_path / "host", gpus=GPUS)
    passed = tuple(f"{k}={v}" for k, v in env.items() if launcher == "job-env" or k != "NVIDIA_VISIBLE_DEVICES")
    r = _container(tmp_path, host, (*IMAGE_ENV, *passed))
    log = (host.base / "hook.log").read_text() if (host.base / "hook.log").exists() else ""
    assert r.rc == 0, r.stdout + r.stderr + log
    ids = inventory_minors(form == "by-index")
    assigned = [] if env["_CONDOR_AssignedGPUs"] == "10000" else env["_CONDOR_AssignedGPUs"].split(",")
    assert len(assigned) == (2 if job == "gpu" else 0)
    # exactly the job's GPUs: each assigned id (UUID prefix or CUDA index) is the fixture GPU of that minor
    assert _gpu_nodes(r.stdout) == {ids[a] for a in assigned}, r.stdout + log
    # the host's libcuda is loaded in the container, GPUs or not (the driver comes without devices)
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout
    if launcher == "image-request":
        assert f"'all' = every GPU within the HTCondor allocation (_CONDOR_AssignedGPUs={env['_CONDOR_AssignedGPUs']})" \
            f": {len(assigned)} GPU(s)" in log, log
