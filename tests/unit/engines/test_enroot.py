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
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, make_host, mount_table
from fixtures.cli import run_cli
from pyxis_hook.engines import enroot
from pyxis_hook.commands.enroot import SHIM_NAME, shim_text
from pyxis_hook.spec.config import Config
from pyxis_hook.errors import UsageError

REPO = Path(__file__).resolve().parents[3]


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


def test_scheduler_variables_come_from_the_hook_only():
    # the image's scheduler variables are never read, even where the job's environment lacks them
    file_env = (("NVIDIA_VISIBLE_DEVICES", "all"), ("SLURM_STEP_GPUS", "0,1,2,3"), ("SLURM_JOB_GPUS", "0,1,2,3"),
                ("CUDA_VISIBLE_DEVICES3", "3"), ("PBS_GPUFILE", "/tmp/x"), ("PATH", "/bin"))
    env = enroot.container_env(file_env, {"SLURM_JOB_GPUS": "1", "SLURM_JOB_ID": "7"})
    assert env == {"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_JOB_GPUS": "1", "PATH": "/bin",
                   "NVIDIA_DRIVER_CAPABILITIES": "utility"}


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
    assert text.startswith("#!/bin/sh\n") and text.rstrip().endswith("exec '/usr/libexec/pyxis-hook/pyxis-hook' enroot")
    assert os.access(REPO / "hook.d" / SHIM_NAME, os.X_OK)
    main = os.path.join(REPO, "pyxis_hook", "__main__.py")
    assert f"exec '/x y/python' -I -S '{main}' enroot" in shim_text("/x y/python")


# ------------------------------------------------------------ the real environment (root)


class EnrootContainer:
    """A process in its own mount namespace over a rootfs, as enroot's runtime leaves it for hooks."""

    def __init__(self, rootfs: Path, mounts: str = "true"):
        """`mounts`: shell commands run after the rootfs bind, as enroot's fstabs and hooks before ours."""
        self.rootfs = rootfs
        self.proc = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f"mount --bind '{rootfs}' '{rootfs}' && {mounts} && echo ready && exec sleep 300"],
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


def test_documented_shim_matches_generated():
    """docs/enroot-pyxis.md shows what `pyxis-hook install enroot` writes, line for line."""
    from pyxis_hook.engines.filetexts import InstallContext, enroot_shim

    text = (REPO / "docs/enroot-pyxis.md").read_text()
    shown = text.split("```sh\n#!/bin/sh\n", 1)[1].split("```", 1)[0]
    ctx = InstallContext("/usr/bin/python3", "/usr/lib/python3/dist-packages/pyxis_hook/__main__.py",
                         "/etc/pyxis-hook/pyxis.conf", "")
    assert shown == enroot_shim(ctx).split("\n", 1)[1]


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


def test_the_hook_reads_its_environment_as_os_environ_decodes_it():
    from pyxis_hook import start

    assert start.environ() == dict(os.environ)
