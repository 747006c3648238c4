"""enroot hook mode, in the environment enroot builds for its hooks.

Root tests make that environment as enroot's runtime does: a process in its
own mount namespace with the rootfs bind-mounted onto itself (its pid is
ENROOT_PID), the image's environment file (ENROOT_ENVIRON), and the hook run
inside that namespace with the container's variables exported.  The result
is checked from inside the container (chroot in that namespace): the device
nodes, and glibc's loader finding the driver through the refreshed cache.
"""

from __future__ import annotations

import os
import subprocess
from pyxis_hook.record import replace
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, make_host, mount_table
from fixtures.cli import run_cli
from pyxis_hook.engines import enroot
from pyxis_hook.commands.enroot import SHIM_NAME, shim_text
from pyxis_hook.spec.config import Config
from pyxis_hook.errors import UsageError

REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------ enroot's variable rules


def test_parse_environ_keeps_order_and_values_verbatim():
    text = 'A=1\nNVIDIA_VISIBLE_DEVICES=all\nnoequals\n=x\nB="quoted value"\nC=a=b\nNVIDIA_VISIBLE_DEVICES=0\n'
    assert enroot.parse_environ(text) == (("A", "1"), ("NVIDIA_VISIBLE_DEVICES", "all"), ("B", '"quoted value"'),
                                          ("C", "a=b"), ("NVIDIA_VISIBLE_DEVICES", "0"))


def test_precedence_like_98_nvidia_sh():
    file_env = (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_VISIBLE_DEVICES", "1"),
                ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"), ("CUDA_VERSION", "12.2"))
    # the last line of the file wins over earlier ones
    env = enroot.container_env(file_env, {})
    assert env["NVIDIA_VISIBLE_DEVICES"] == "1" and env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    # the hook's own environment wins over the file; unrelated host variables are not taken
    env = enroot.container_env(file_env, {"NVIDIA_VISIBLE_DEVICES": "2", "HOME": "/root", "SLURM_STEP_GPUS": "2,3"})
    assert env["NVIDIA_VISIBLE_DEVICES"] == "2" and "HOME" not in env and env["SLURM_STEP_GPUS"] == "2,3"


def test_honoured_env_is_what_the_hook_took_over_the_file():
    file_env = (("NVIDIA_VISIBLE_DEVICES", "void"), ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"))
    own = {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
           "NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "CUDA_VISIBLE_DEVICES": "1", "HOME": "/root"}
    # the file ends with `all`: the job's `void` is written; an equal value and non-NVIDIA_ variables are not
    assert enroot.honoured_env(file_env, own) == (("NVIDIA_VISIBLE_DEVICES", "void"),
                                                  ("NVIDIA_REQUIRE_CUDA", "cuda>=12.0"))
    assert enroot.honoured_env(file_env, {}) == ()
    with pytest.raises(UsageError, match="^NVIDIA_VISIBLE_DEVICES: a value with a newline cannot be written"):
        enroot.honoured_env(file_env, {"NVIDIA_VISIBLE_DEVICES": "0\nLD_PRELOAD=/x.so"})


def test_defaults_void_and_utility():
    env = enroot.container_env((("CUDA_VERSION", "11.0"),), {})
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"  # even for a legacy CUDA image, as enroot does
    env = enroot.container_env((("NVIDIA_VISIBLE_DEVICES", "0"), ("NVIDIA_DRIVER_CAPABILITIES", "")), {})
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


@pytest.mark.parametrize("environ,match", [
    ({}, "ENROOT_PID is not set"),
    ({"ENROOT_PID": "x", "ENROOT_ROOTFS": "/", "ENROOT_ENVIRON": "/e"}, "ENROOT_PID='x'"),
    ({"ENROOT_PID": "5", "ENROOT_ROOTFS": "rel", "ENROOT_ENVIRON": "/e"}, "ENROOT_ROOTFS='rel'"),
])
def test_bad_enroot_environment(environ, match):
    with pytest.raises(UsageError, match=match):
        enroot.enroot_facts(environ)


def test_missing_environ_file_is_one_line(tmp_path):
    r = run_cli("enroot", env={"ENROOT_PID": str(os.getpid()), "ENROOT_ROOTFS": str(tmp_path),
                               "ENROOT_ENVIRON": str(tmp_path / "nope"), "PATH": os.environ["PATH"]})
    assert r.returncode != 0 and r.stderr.count("\n") == 1
    assert f"ENROOT_ENVIRON {tmp_path}/nope: No such file or directory" in r.stderr


def test_repo_shim_execs_pyxis_hook_enroot():
    text = (REPO / "hook.d" / SHIM_NAME).read_text()
    assert text.startswith("#!/bin/sh\n") and text.rstrip().endswith("exec pyxis-hook enroot")
    assert os.access(REPO / "hook.d" / SHIM_NAME, os.X_OK)
    main = os.path.join(REPO, "pyxis_hook", "__main__.py")
    assert f"exec '/x y/python' -I -S '{main}' enroot" in shim_text("/x y/python")


# ------------------------------------------------------------ the real environment (root)


class EnrootContainer:
    """A process in its own mount namespace over a rootfs, as enroot's runtime leaves it for hooks."""

    def __init__(self, rootfs: Path):
        self.rootfs = rootfs
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f"mount --bind '{rootfs}' '{rootfs}' && echo ready && exec sleep 300"],
            stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "ready"
        self.pid = self.proc.pid

    def hook(self, shim: Path, environ_file: Path, own_env: dict) -> subprocess.CompletedProcess:
        """Run the hook inside the container's namespace with the container's variables exported."""
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "ENROOT_PID": str(self.pid), "ENROOT_ROOTFS": str(self.rootfs),
               "ENROOT_ENVIRON": str(environ_file), **own_env}
        return subprocess.run(["nsenter", "-t", str(self.pid), "-m", "--", str(shim)], env=env,
                              capture_output=True, text=True, timeout=60)

    def sh(self, script: str) -> str:
        r = subprocess.run(["nsenter", "-t", str(self.pid), "-m", "--", "chroot", str(self.rootfs),
                            "/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)
        return r.stdout + r.stderr

    def close(self):
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def setup(tmp_path):
    host = make_host(tmp_path)
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    r = run_cli("enroot", "--install", str(hooks), conf=host.conf)
    assert r.returncode == 0, r.stderr
    rootfs = fresh_rootfs(tmp_path / "rootfs")
    before = mount_table()
    c = EnrootContainer(rootfs)
    yield host, hooks / SHIM_NAME, c, tmp_path
    c.close()
    assert mount_table() == before, "host mount table changed"


def _environ(tmp_path, lines):
    p = tmp_path / "environ"
    p.write_text("".join(f"{x}\n" for x in lines))
    return p


PROBE = "echo $(ls /dev | grep nvidia); /usr/bin/gputest"


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


def test_documented_shim_matches_generated():
    text = (REPO / "docs/enroot-pyxis.md").read_text()
    shown = text.split("```sh\n#!/bin/sh\n", 1)[1].split("```", 1)[0]
    generated = shim_text("/usr/bin/python3.11", replace(Config(), source="/etc/pyxis-hook/pyxis.conf")).split("\n", 2)[2]
    here = os.path.join(REPO, "pyxis_hook", "__main__.py")
    assert shown == generated.replace(here, "/usr/lib/python3/dist-packages/pyxis_hook/__main__.py")


def test_shim_names_the_config_absolute(tmp_path):
    """`pyxis-hook --config pyxis.conf enroot --install DIR`: enroot runs the shim from another cwd."""
    (tmp_path / "pyxis.conf").write_text("")
    hooks = tmp_path / "hooks.d"
    hooks.mkdir()
    r = run_cli("enroot", "--install", str(hooks), conf="pyxis.conf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (hooks / SHIM_NAME).read_text().split("\n")[2].startswith(f"PYXIS_HOOK_CONFIG='{tmp_path}/pyxis.conf' exec ")
    assert "PYXIS_HOOK_CONFIG" not in shim_text("/usr/bin/python3", Config())
    r = run_cli("enroot", "--install", str(tmp_path / "no"))
    assert r.returncode == 2 and r.stderr.strip().endswith(f"{tmp_path}/no: not a directory")
