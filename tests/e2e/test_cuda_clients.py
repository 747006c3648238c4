"""The CUDA clients users install from PyPI, in a real distribution image, through runc, crun and podman.

The image is the machine's Debian release (minbase + python3) with
``cuda-bindings`` 12.x and ``nvidia-ml-py`` pip-installed (fixtures/distroimage.py);
the host is the real 535 driver with fake GPUs and no kernel module, so the
clients answer as on a GPU node whose module is not loaded:
``cuDriverGetVersion`` gives the driver's CUDA version (12020), ``cuInit``
CUDA_ERROR_NO_DEVICE (100) and ``pynvml.nvmlInit`` NVML_ERROR_DRIVER_NOT_LOADED
(9).  Which file the interpreter really mapped is read from the container's
``/proc/self/maps`` and compared (device, inode) with the host driver's file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from e2e.conftest import hook_entry, make_host, mount_table, run_container
from e2e.test_podman import podman_run
from fixtures.cli import run_cli
from fixtures.container import make_bundle
from fixtures.distroimage import overlay_rootfs, require_image
from fixtures.realdriver import CUDA_VERSION, TRIPLET_DIR, driver_version, require_driver_root

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver]

LINE = "535"

#: what a user's script does first: driver version, init, NVML init; then which files it mapped
PROBE = r'''
import json, os
out = {}
try:
    from cuda.bindings import driver
    err, version = driver.cuDriverGetVersion()
    out["cuDriverGetVersion"] = [int(err), version]
    (err,) = driver.cuInit(0)
    out["cuInit"] = int(err)
except Exception as e:
    out["cuda"] = f"{type(e).__name__}: {e}"
import pynvml
try:
    pynvml.nvmlInit()
    out["nvmlInit"] = 0
except pynvml.NVMLError as e:
    out["nvmlInit"] = e.value
out["maps"] = {}
with open("/proc/self/maps") as f:
    for line in f:
        fields = line.split()
        if len(fields) == 6 and os.path.basename(fields[5]).startswith(("libcuda.so", "libnvidia-ml.so")):
            out["maps"][fields[5]] = [fields[3], int(fields[4])]
out["libcuda_files"] = sorted(n for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64") if os.path.isdir(d)
                              for n in os.listdir(d) if n.startswith("libcuda.so"))
print("PROBE " + json.dumps(out))
'''

RUNTIMES = ("runc", "crun", "podman")


@pytest.fixture(scope="session")
def image() -> Path:
    """The cached distribution root with the clients (built once per cache stamp)."""
    return require_image()


@pytest.fixture(scope="session")
def driver_root() -> Path:
    return require_driver_root(LINE, "debian")


def host_file(driver_root: Path, stem: str) -> os.stat_result:
    """The host driver's versioned library file (what the hook bind-mounts)."""
    name = f"{stem}.{driver_version(LINE)}"
    found = [p for p in (driver_root / TRIPLET_DIR).rglob(name) if p.is_file() and not p.is_symlink()]
    assert found, f"no {name} under {driver_root}"
    return found[0].stat()


def mapped_from(probe: dict, stem: str) -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every mapping of `stem`.* in the container."""
    out = set()
    for path, (dev, ino) in probe["maps"].items():
        if os.path.basename(path).startswith(stem + "."):
            major, minor = dev.split(":")
            out.add((int(major, 16), int(minor, 16), ino))
    return out


def file_id(st: os.stat_result) -> tuple[int, int, int]:
    return os.major(st.st_dev), os.minor(st.st_dev), st.st_ino


def run_probe(tmp_path: Path, runtime: str, rootfs: Path, driver_root: Path, env: tuple[str, ...]) -> dict:
    """Start a container with the probe through `runtime` and our hook; return the probe's report."""
    host = make_host(tmp_path / "host", driver_root=driver_root)
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version(LINE)}  "
                "Thu Jan  1 00:00:00 UTC 2026\n")
    (rootfs / "probe.py").write_text(PROBE)
    if runtime == "podman":
        if shutil.which("podman") is None:
            pytest.skip("podman is not installed (.ci/run installs it)")
        hooks = tmp_path / "hooks.d"
        hooks.mkdir()
        r = run_cli("hookd", "--install", str(hooks), conf=host.conf)
        assert r.returncode == 0, r.stderr
        opts = [a for e in env for a in ("-e", e)]
        p = podman_run(hooks, rootfs, *opts, script="exec python3 /probe.py")
        rc, stdout, stderr = p.returncode, p.stdout, p.stderr
    else:
        bundle = make_bundle(tmp_path / "bundle", rootfs, env=env, args=("python3", "/probe.py"),
                             hooks={"prestart": [hook_entry(host.conf)]})
        before = mount_table()
        r = run_container(runtime, bundle, f"pyxis-clients-{runtime}-{os.getpid()}-{tmp_path.name[-12:]}")
        assert mount_table() == before
        rc, stdout, stderr = r.rc, r.stdout, r.stderr
    assert rc == 0, stderr
    lines = [line for line in stdout.splitlines() if line.startswith("PROBE ")]
    assert lines, stdout + stderr
    return json.loads(lines[-1][len("PROBE "):])


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_default_request(tmp_path, runtime, image, driver_root):
    """compute+utility: both clients load the host's libraries and answer as a module-less node does."""
    with overlay_rootfs(image, tmp_path / "image") as rootfs:
        probe = run_probe(tmp_path, runtime, rootfs, driver_root, ("NVIDIA_VISIBLE_DEVICES=all",))
    assert probe["cuDriverGetVersion"] == [0, CUDA_VERSION[LINE]], probe
    assert probe["cuInit"] == 100  # CUDA_ERROR_NO_DEVICE
    assert probe["nvmlInit"] == 9  # NVML_ERROR_DRIVER_NOT_LOADED
    assert mapped_from(probe, "libcuda.so") == {file_id(host_file(driver_root, "libcuda.so"))}, probe["maps"]
    assert mapped_from(probe, "libnvidia-ml.so") == {file_id(host_file(driver_root, "libnvidia-ml.so"))}, \
        probe["maps"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_utility_only(tmp_path, runtime, image, driver_root):
    """NVIDIA_DRIVER_CAPABILITIES=utility: no libcuda in the container; NVML is the host's."""
    with overlay_rootfs(image, tmp_path / "image") as rootfs:
        probe = run_probe(tmp_path, runtime, rootfs, driver_root,
                          ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"))
    assert probe["libcuda_files"] == [] and mapped_from(probe, "libcuda.so") == set(), probe
    assert "cuDriverGetVersion" not in probe and "libcuda.so.1" in probe["cuda"], probe
    assert probe["nvmlInit"] == 9
    assert mapped_from(probe, "libnvidia-ml.so") == {file_id(host_file(driver_root, "libnvidia-ml.so"))}, \
        probe["maps"]


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_image_with_another_drivers_nvml(tmp_path, runtime, image, driver_root):
    """The image carries tesla-470's NVML as a regular file at the SONAME path (a `COPY` of another
    host's libraries): on this 535 host the clients must load the host's NVML, not the image's."""
    other = require_driver_root("470", "installer") / TRIPLET_DIR / "libnvidia-ml.so.1"
    with overlay_rootfs(image, tmp_path / "image") as rootfs:
        shutil.copyfile(os.path.realpath(other), rootfs / TRIPLET_DIR / "libnvidia-ml.so.1")
        probe = run_probe(tmp_path, runtime, rootfs, driver_root, ("NVIDIA_VISIBLE_DEVICES=all",))
    assert mapped_from(probe, "libnvidia-ml.so") == {file_id(host_file(driver_root, "libnvidia-ml.so"))}, \
        probe["maps"]
    assert probe["nvmlInit"] == 9
    assert probe["cuDriverGetVersion"] == [0, CUDA_VERSION[LINE]], probe
    assert probe["cuInit"] == 100
