"""Real rootful podman (Debian 4.3.1): hooks.d prestart, CDI `--device`, and the precreate stage.

Flags the CI machines need (runc: crun refuses the hybrid cgroup layout;
cgroupfs + file events: no systemd; ulimits at or under the hard limits: no
CAP_SYS_RESOURCE).  podman 4.3 has no --cdi-spec-dir option: it reads
/etc/cdi and /var/run/cdi, so the CDI tests write a spec with a test-only
kind into /var/run/cdi and remove it afterwards.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, make_host, mount_table
from fixtures.cli import run_cli
from pyxis_hook.engines.hookd import interpreter

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (.ci/run installs it)")]

TEST_KIND = "pyxis-test.example/gpu"
PROBE = ("echo $(ls /dev | grep nvidia); /usr/bin/gputest; cat /dev/nvidia1 2>&1 | head -1 | sed 's/^/open1: /'; "
         "echo NVD=$NVIDIA_VISIBLE_DEVICES CVD=$CUDA_VISIBLE_DEVICES")


def _ulimits() -> list[str]:
    n = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 20000)
    p = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 1024)
    return ["--ulimit", f"nofile={n}:{n}", "--ulimit", f"nproc={p}:{p}"]


def _podman_cmd(hooks_dir: Path, rootfs: Path, *opts: str, script: str) -> list[str]:
    return ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", "--events-backend=file",
            "--hooks-dir", str(hooks_dir), "run", "--rm", *_ulimits(), *opts, "--rootfs", str(rootfs),
            "/bin/sh", "-c", script]


_WARM: list[bool] = []


def warm_podman() -> None:
    """One container without hooks or devices, once per test run, before any host mount table is measured.

    podman's first run on a machine leaves a mount of its own behind for good:
    the /run/netns bind mount its network namespaces live under.  Made here,
    it is in every `before` table, so `podman_run` can still demand an
    unchanged table after each run.  (The private bind mount of its storage
    dir is made and removed by each podman command: no table sees it.)
    """
    if _WARM:
        return
    base = Path(tempfile.mkdtemp(prefix="pyxis-podman-warm-"))
    try:
        (base / "hooks").mkdir()
        r = subprocess.run(_podman_cmd(base / "hooks", fresh_rootfs(base / "rootfs"), script="true"),
                           capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"podman without hooks fails: {r.stderr}"
    finally:
        shutil.rmtree(base, ignore_errors=True)
    _WARM.append(True)


def podman_run(hooks_dir: Path, rootfs: Path, *opts: str, script: str = PROBE) -> subprocess.CompletedProcess:
    """Run a container; the host's mount table must be the same afterwards (nothing the hook did leaked)."""
    hooks_dir.mkdir(exist_ok=True)
    warm_podman()
    before = mount_table()
    r = subprocess.run(_podman_cmd(hooks_dir, rootfs, *opts, script=script), capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert mount_table() == before, "host mount table changed"
    return r


def _nodes(out: str) -> set[str]:
    return set(out.splitlines()[0].split()) if out else set()


def _cli(conf: Path, *args: str) -> subprocess.CompletedProcess:
    r = run_cli(*args, conf=conf)
    assert r.returncode == 0, r.stderr
    return r


@pytest.fixture
def host(tmp_path):
    return make_host(tmp_path)


def test_hooksd_prestart(tmp_path, host):
    """`pyxis-hook hookd --install DIR` is all podman needs."""
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    _cli(host.conf, "hookd", "--install", str(hooks))
    r = podman_run(hooks, fresh_rootfs(tmp_path / "r1"), "-e", "NVIDIA_VISIBLE_DEVICES=0,1")
    assert r.returncode == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
    assert "open1: cat: can't open '/dev/nvidia1': No such device or address" in r.stdout  # cgroup allows it
    # a container that asks for nothing is left alone
    r = podman_run(hooks, fresh_rootfs(tmp_path / "r2"))
    assert r.returncode == 0, r.stderr
    assert _nodes(r.stdout) == set() and "libcuda.so.1: cannot open shared object file" in r.stdout


@pytest.fixture
def cdi_spec(tmp_path, host, request):
    conf = tmp_path / "cdi.conf"
    conf.write_text(host.conf.read_text() + f'cdi-kind = "{TEST_KIND}"\n')
    os.makedirs("/var/run/cdi", exist_ok=True)
    fmt = getattr(request, "param", "json")
    extra = ["--no-hooks"] if fmt == "no-hooks" else []
    fmt = "json" if extra else fmt
    path = Path(f"/var/run/cdi/pyxis-test-{os.getpid()}-{tmp_path.name[-10:]}.{fmt}")
    _cli(conf, "cdi", "generate", "--format", fmt, "--output", str(path), *extra)
    yield path
    path.unlink()


@pytest.mark.parametrize("cdi_spec", ["json", "yaml"], indirect=True)
def test_cdi_device(tmp_path, cdi_spec):
    """`--device KIND=1`: podman applies the spec; our createContainer hooks make links and the cache."""
    r = podman_run(tmp_path / "nohooks", fresh_rootfs(tmp_path / "r"), "--device", f"{TEST_KIND}=1")
    assert r.returncode == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia1", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout  # SONAME link + ld.so.cache from the hooks
    assert "open1: cat: can't open '/dev/nvidia1': No such device or address" in r.stdout
    assert "NVD=void" in r.stdout  # a hooks.d prestart hook would leave this container alone


@pytest.mark.parametrize("cdi_spec", ["no-hooks"], indirect=True)
def test_cdi_without_hooks(tmp_path, cdi_spec):
    """The spec for engines that ignore CDI hooks (Apptainer --device): links are binds of the library."""
    r = podman_run(tmp_path / "nohooks", fresh_rootfs(tmp_path / "r"), "--device", f"{TEST_KIND}=0",
                   script=PROBE + "; ldconfig -p | grep -c libcuda | sed 's/^/cached=/'")
    assert r.returncode == 0, r.stderr
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout  # found by the loader's default-directory search
    assert "cached=0" in r.stdout  # nobody refreshed the image's ld.so.cache


def test_cdi_all_and_uuid(tmp_path, host, cdi_spec):
    r = podman_run(tmp_path / "nohooks", fresh_rootfs(tmp_path / "a"), "--device", f"{TEST_KIND}=all")
    assert r.returncode == 0, r.stderr
    assert {"nvidia0", "nvidia1", "nvidia2", "nvidia3"} <= _nodes(r.stdout)
    uuid = host.tree.gpus[2].uuid
    r = podman_run(tmp_path / "nohooks", fresh_rootfs(tmp_path / "u"), "--device", f"{TEST_KIND}={uuid}")
    assert r.returncode == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
    assert "open1: cat: can't open '/dev/nvidia1': No such file or directory" in r.stdout


def test_precreate_stage(tmp_path, host):
    """podman 4.3 runs hooks.d `precreate` hooks (config.json on stdin, the new one on stdout)."""
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    python = interpreter()  # a venv's bin/python as is: its realpath would leave the venv (and the package) behind
    (hooks / "pyxis-hook-precreate.json").write_text(json.dumps({
        "version": "1.0.0",
        "hook": {"path": python, "args": [python, "-I", "-m", "pyxis_hook", "precreate"],
                 "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"PYXIS_HOOK_CONFIG={host.conf}"]},
        "when": {"always": True}, "stages": ["precreate"]}))
    r = podman_run(hooks, fresh_rootfs(tmp_path / "r"), "-e", "NVIDIA_VISIBLE_DEVICES=all",
                   "-e", "SLURM_STEP_GPUS=1,3", "-e", "CUDA_VISIBLE_DEVICES=1,3")
    assert r.returncode == 0, r.stderr
    # runc made exactly the allocated nodes and allowed them; CUDA_VISIBLE_DEVICES is local
    assert _nodes(r.stdout) == {"nvidia1", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
    assert "open1: cat: can't open '/dev/nvidia1': No such device or address" in r.stdout
    assert "CVD=0,1" in r.stdout
    # precreate adds no files: that is the prestart hook's (or CDI's) job
    assert "libcuda.so.1: cannot open shared object file" in r.stdout


def test_install_podman_is_all_stock_podman_needs(tmp_path, host):
    """`pyxis-hook install podman` onto this machine, then podman with no --hooks-dir gives the GPU; uninstall."""
    from pyxis_hook.engines.enginefiles import ROLE_FILES, STATE_DIR

    ours = [ROLE_FILES["hooks-json"][0], ROLE_FILES["launcher"][0], STATE_DIR]
    if any(os.path.lexists(p) for p in ours):
        pytest.skip(f"this machine already has one of {ours}")
    r = run_cli("install", "podman", conf=host.conf)
    try:
        assert r.returncode == 0, r.stderr
        cmd = _podman_cmd(tmp_path, fresh_rootfs(tmp_path / "r"), "-e", "NVIDIA_VISIBLE_DEVICES=0", script=PROBE)
        i = cmd.index("--hooks-dir")
        del cmd[i:i + 2]  # podman's own hooks directories, as configured out of the box
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        assert "nvidia0" in _nodes(r.stdout) and "cuDriverGetVersion=12020 rc=0" in r.stdout
    finally:
        u = run_cli("uninstall", "podman", conf=host.conf)
    assert u.returncode == 0, u.stderr
    assert not any(os.path.lexists(p) for p in ours)
