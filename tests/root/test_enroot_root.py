"""Root tests: enroot hook mode, in the environment enroot builds for its hooks.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/engines/test_enroot.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import pytest
from pyxis_hook.engines import enroot
from e2e.conftest import fresh_rootfs
from unit.engines.test_enroot import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    PROBE,
    EnrootContainer,
    _environ,
    setup,
)


@pytest.mark.root
def test_image_env_selects_gpus(setup):
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=0,2",
                              "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    r = c.hook(shim, env_file, {})
    assert r.returncode == 0, r.stderr
    out = c.sh(PROBE)
    assert set(out.splitlines()[0].split()) == {"nvidia0", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}, out
    assert "cuDriverGetVersion=12020 rc=0" in out
    # the host's view of the rootfs is untouched: the mounts live in the container's namespace
    host_view = subprocess.run(["sh", "-c", f"cat '{c.rootfs}/dev/nvidia0' 2>&1 | head -1"],
                               capture_output=True, text=True).stdout
    assert "No such device or address" not in host_view  # on the host it is an empty mount point, not a node


@pytest.mark.root
def test_hook_env_overrides_image_and_slurm_bounds(setup):
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    r = c.hook(shim, env_file, {"SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert r.returncode == 0, r.stderr
    out = c.sh(PROBE)
    gpus = {n for n in out.splitlines()[0].split() if n[len("nvidia"):].isdigit()}
    assert gpus == {"nvidia2", "nvidia3"}
    # the container's environment gets the CUDA_VISIBLE_DEVICES it really needs (local indices)
    assert env_file.read_text().splitlines()[-1] == "CUDA_VISIBLE_DEVICES=0,1"


@pytest.mark.root
def test_the_images_scheduler_variables_never_widen_the_jobs_gpus(setup):
    # a Slurm batch step given GPU 1 (SLURM_JOB_GPUS only) of an image that names all four, as the
    # step's, the job's and an LSF task's: the container gets the job's one GPU
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
                              "SLURM_STEP_GPUS=0,1,2,3", "SLURM_JOB_GPUS=0,1,2,3", "CUDA_VISIBLE_DEVICES1=0,1,2,3"])
    r = c.hook(shim, env_file, {"SLURM_JOB_ID": "7", "SLURM_JOB_GPUS": "1"})
    assert r.returncode == 0, r.stderr
    out = c.sh(PROBE)
    assert {n for n in out.splitlines()[0].split() if n[len("nvidia"):].isdigit()} == {"nvidia1"}, out
    assert env_file.read_text().splitlines()[-1] == "CUDA_VISIBLE_DEVICES=0"


@pytest.mark.root
def test_own_nvidia_variable_wins_and_default_capability_is_utility(setup):
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=all"])
    r = c.hook(shim, env_file, {"NVIDIA_VISIBLE_DEVICES": "1"})
    assert r.returncode == 0, r.stderr
    out = c.sh(PROBE)
    assert set(out.splitlines()[0].split()) == {"nvidia1", "nvidiactl"}  # utility only: no uvm
    assert "libcuda.so.1: cannot open shared object file" in out  # no compute capability
    assert env_file.read_text() == "NVIDIA_VISIBLE_DEVICES=all\nNVIDIA_VISIBLE_DEVICES=1\n"  # what was honoured


@pytest.mark.root
@pytest.mark.parametrize("value", ["void", "none"])
def test_job_value_honoured_reaches_the_program(setup, value):
    """Pyxis runs enroot with the job's environment and afterwards gives the task the container's: the
    job's `void`/`none` that the hook obeyed over the image's `all` is what the container's environment
    file (what enroot-switchroot loads, the last definition winning) ends with."""
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
    r = c.hook(shim, env_file, {"NVIDIA_VISIBLE_DEVICES": value})
    assert r.returncode == 0, r.stderr
    assert {n for n in c.sh("ls /dev").split() if n.startswith("nvidia")} == \
        (set() if value == "void" else {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"})
    assert dict(enroot.parse_environ(env_file.read_text()))["NVIDIA_VISIBLE_DEVICES"] == value
    assert env_file.read_text().splitlines()[-1] == f"NVIDIA_VISIBLE_DEVICES={value}"


@pytest.mark.root
def test_void_leaves_container_alone(setup):
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["PATH=/bin"])
    r = c.hook(shim, env_file, {})
    assert r.returncode == 0 and r.stderr == ""
    assert c.sh("ls /dev | grep -c nvidia").strip() == "0"


@pytest.mark.root
def test_error_is_one_line_and_nothing_left(setup):
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=7"])
    r = c.hook(shim, env_file, {})
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "pyxis-hook: error:" in r.stderr
    assert c.sh("ls /dev | grep -c nvidia").strip() == "0"


@pytest.mark.root
def test_value_with_newline_refused_before_anything_is_applied(setup):
    host, shim, c, tmp = setup
    env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=all"])
    r = c.hook(shim, env_file, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_X": "a\nLD_PRELOAD=/x.so"})
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert "NVIDIA_REQUIRE_X: a value with a newline cannot be written to ENROOT_ENVIRON" in r.stderr
    assert c.sh("ls /dev | grep -c nvidia").strip() == "0"
    assert env_file.read_text() == "NVIDIA_VISIBLE_DEVICES=all\n"


def _tree(d) -> dict:
    out = {}
    for p, ds, fs in os.walk(d):
        for n in ds + fs:
            st = os.lstat(os.path.join(p, n))
            out[os.path.join(p, n)] = (st.st_mode, st.st_ino, st.st_rdev, st.st_size)
    return out


@pytest.mark.root
def test_restricted_dev_tmpfs_gets_the_nodes(setup):
    """ENROOT_RESTRICT_DEV: hooks.d/10-devices.sh mounts a fresh tmpfs on the rootfs's /dev before our hook."""
    host, shim, c, tmp = setup
    r2 = EnrootContainer(c.rootfs, mounts=f"mount -t tmpfs -o mode=755 tmpfs '{c.rootfs}/dev'")
    try:
        env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=0,2", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"])
        r = r2.hook(shim, env_file, {})
        assert r.returncode == 0 and "warning" not in r.stderr, r.stderr
        assert {"nvidia0", "nvidia2", "nvidiactl"} <= set(r2.sh("ls /dev").split())
    finally:
        r2.close()


@pytest.mark.root
def test_host_dev_bound_in_gets_no_mount_point(setup):
    """Without ENROOT_RESTRICT_DEV enroot rbinds the node's /dev (mounts.d/10-system.fstab); dev-root names
    another tree, so the nodes are missing there: the start fails with one line and that /dev holds nothing new.
    A host-like directory stands for the node's /dev."""
    host, shim, c, tmp = setup
    hostdev = tmp / "hostdev"
    hostdev.mkdir()
    os.mknod(hostdev / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    before = _tree(hostdev)
    r2 = EnrootContainer(c.rootfs, mounts=f"mount --rbind '{hostdev}' '{c.rootfs}/dev'")
    try:
        env_file = _environ(tmp, ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=utility"])
        r = r2.hook(shim, env_file, {})
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert "not created: it is a host directory bound into the container" in r.stderr, r.stderr
        assert _tree(hostdev) == before
    finally:
        r2.close()


@pytest.mark.root
def test_shim_start_runs_from_the_start_image(setup):
    """The shim's call skips the CLI and, once warm, runs its modules from the start image.

    Cold (no image), then warm: each start injects the same nodes.
    """
    from pathlib import Path

    from pyxis_hook import startimage

    host, shim, c, tmp = setup
    image = Path(startimage.image_path())
    image.unlink(missing_ok=True)  # cold
    env_file = _environ(tmp, ["PATH=/usr/bin", "NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=utility"])
    log = host.base / "hook.log"
    containers = [c] + [EnrootContainer(fresh_rootfs(tmp / f"rootfs{i}")) for i in (1, 2, 3)]
    try:
        for i, box in enumerate(containers):
            log.write_text("")
            r = box.hook(shim, env_file, {})
            assert r.returncode == 0, r.stderr
            assert sorted(box.sh("ls /dev | grep nvidia").split()) == ["nvidia1", "nvidiactl"]  # utility: no uvm
            text = log.read_text()
            assert f"start image {image}" in text, text
            if i == 0:
                assert f"start image {image}: boot section not used" in text
        assert re.search(rf"start image {re.escape(str(image))}: start section: \d+ modules loaded", text)  # warm
        assert "argparse" not in startimage.held(str(image), "start") and "pyxis_hook.cli" not in startimage.held(str(image), "start")
    finally:
        for box in containers[1:]:
            box.close()
