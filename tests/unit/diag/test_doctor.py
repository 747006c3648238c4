"""doctor: each host cause gives its exact finding, on fixture hosts (hosttree.py + fakedriver.py).

Device-node tests need root (mknod); everything else runs anywhere.  The
persistenced socket is a real AF_UNIX socket, the ldconfig candidates are
the host's static glibc ldconfig, a gcc-built dynamic executable and a shell
script; runtimes are found on a fixture $PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from pyxis_hook.record import replace
from pathlib import Path

import jsonschema
import pytest

from fixtures.cli import write_conf
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import make_host_tree
from fixtures.synth import build_exe
from pyxis_hook import cli
from pyxis_hook.diag import doctor, installcheck
from pyxis_hook.spec.config import Config
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.diag.findings import Finding
from pyxis_hook.engines.hookd import hook_document
from pyxis_hook.host.discovery import discover

VERSION = "535.104.05"


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return make_fake_driver(tmp_path_factory.mktemp("doctor-drv") / "drv", VERSION)


def host_config(base: Path, driver: Path, **tree_kw) -> Config:
    tree_kw.setdefault("driver_version", VERSION)
    tree_kw.setdefault("make_nodes", os.geteuid() == 0)
    tree = make_host_tree(base, **tree_kw)
    return Config(driver_root=str(driver), proc_root=tree.proc_root, dev_root=tree.dev_root,
                  snapshot_dir=str(base / "snap"))


def denv(tmp_path: Path, **kw) -> doctor.DoctorEnv:
    hooks = tmp_path / "hooks.d"
    hooks.mkdir(exist_ok=True)
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    kw.setdefault("hooks_dirs", (str(hooks),))
    kw.setdefault("search_path", (str(bindir),))
    return doctor.DoctorEnv(**kw)


def by_code(findings, code) -> list[Finding]:
    return [f for f in findings if f.code == code]


def only(findings, code) -> Finding:
    hits = by_code(findings, code)
    assert len(hits) == 1, (code, findings)
    return hits[0]


def errors(findings) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


# --------------------------------------------------------------------- driver and module


def test_driver_and_module_agree(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    fs = doctor.check_driver(discover(cfg, strict=False), cfg)
    assert fs == [Finding("ok", "driver", f"driver {VERSION}: kernel module and user-space libraries agree")]


def test_kernel_module_and_libraries_differ(tmp_path, driver):
    cfg = host_config(tmp_path, driver, driver_version="535.216.03")
    f = only(doctor.check_driver(discover(cfg, strict=False), cfg), "driver-version-mismatch")
    assert f.severity == "error"
    assert f.what == f"kernel module 535.216.03 but user-space libraries {VERSION} in {driver}"
    assert "Driver/library version mismatch" in f.why and "reboot" in f.fix


def test_kernel_module_not_loaded(tmp_path, driver):
    cfg = host_config(tmp_path, driver, kernel_module=False)
    fs = doctor.run_checks(cfg, denv(tmp_path))
    f = only(fs, "kernel-module-not-loaded")
    assert f.what == f"{cfg.proc_root}/driver/nvidia is missing: the NVIDIA kernel module is not loaded"
    assert not by_code(fs, "device-node")  # no module: node checks would only repeat it


def test_nvidia_uvm_not_loaded(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    devices = Path(cfg.proc_root) / "devices"
    devices.write_text("".join(ln + "\n" for ln in devices.read_text().splitlines() if "nvidia-uvm" not in ln))
    f = only(doctor.check_devices(discover(cfg, strict=False).host, cfg), "nvidia-uvm-not-loaded")
    assert f.severity == "error" and f.what == f"no nvidia-uvm line in {cfg.proc_root}/devices"
    assert "nvidia-smi works but CUDA does not see the GPU" in f.why
    assert f.fix.startswith("modprobe nvidia-uvm")


# --------------------------------------------------------------------- device nodes


# --------------------------------------------------------------------- persistenced


def test_persistenced(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    f = only(doctor.check_persistenced(cfg), "persistenced-not-running")
    assert f.severity == "warning" and "start" in f.why and "nvidia-persistenced" in f.fix
    run = Path(tmp_path / "root/var/run/nvidia-persistenced")
    run.mkdir(parents=True)
    cfg2 = replace(cfg, driver_root=str(tmp_path / "root"))
    (run / "nvidia-persistenced.pid").write_text("4242\n")
    assert only(doctor.check_persistenced(cfg2), "persistenced-not-running")  # no such process
    (Path(cfg.proc_root) / "4242").mkdir()
    assert only(doctor.check_persistenced(cfg2), "persistenced").what == "nvidia-persistenced is running (pid 4242)"
    (run / "nvidia-persistenced.pid").unlink()
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(run / "socket"))
        assert only(doctor.check_persistenced(cfg2), "persistenced").severity == "ok"
    finally:
        s.close()


# --------------------------------------------------------------------- host ld.so.cache and ldconfig


def test_host_ldcache(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    inv = discover(cfg, strict=False)
    assert [f.code for f in doctor.check_host_ldcache(inv, cfg)] == ["host-ldcache"]
    assert doctor.check_host_ldcache(inv, cfg)[0].severity == "ok"
    drv2 = tmp_path / "drv2"
    shutil.copytree(driver, drv2, symlinks=True)
    (drv2 / "usr/lib/x86_64-linux-gnu" / f"libcuda.so.{VERSION}").unlink()
    cfg2 = replace(cfg, driver_root=str(drv2))
    f = only(doctor.check_host_ldcache(inv, cfg2), "host-ldcache")
    assert f.severity == "error"
    assert f.what == f"{drv2}/etc/ld.so.cache: libcuda.so.1 -> /usr/lib/x86_64-linux-gnu/libcuda.so.1, which does not exist"
    (drv2 / "etc/ld.so.cache").unlink()
    f = doctor.check_host_ldcache(inv, cfg2)[0]
    assert f.severity == "error" and f.what.startswith(f"{drv2}/etc/ld.so.cache: ")


def test_ldconfig_binary(tmp_path):
    real = "/sbin/ldconfig.real" if os.path.exists("/sbin/ldconfig.real") else "/sbin/ldconfig"
    assert doctor.check_ldconfig(Config(ldconfig="@" + real))[0] == Finding("ok", "ldconfig", f"{real} is a static ELF binary")
    script = tmp_path / "ldconfig"
    script.write_text("#!/bin/sh\nexec /sbin/ldconfig.real \"$@\"\n")
    f = doctor.check_ldconfig(Config(ldconfig=f"@{script}"))[0]
    assert (f.severity, f.code) == ("error", "ldconfig-script") and str(script) in f.what
    dyn = build_exe(tmp_path / "dyn", "ldconfig")
    f = doctor.check_ldconfig(Config(ldconfig=f"@{dyn}"))[0]
    assert (f.severity, f.code) == ("error", "ldconfig-dynamic") and f.what.startswith(f"{dyn} is dynamically linked")
    f = doctor.check_ldconfig(Config(ldconfig=f"@{tmp_path}/nope"))[0]
    assert (f.code, f.what) == ("ldconfig-missing", f"{tmp_path}/nope (pyxis.conf ldconfig) does not exist")
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x7fELF" + b"\0" * 8)
    assert doctor.check_ldconfig(Config(ldconfig=f"@{junk}"))[0].code == "ldconfig-not-elf"
    assert doctor.check_ldconfig(Config(ldconfig="/sbin/ldconfig"))[0].severity == "info"


def test_config_file(tmp_path):
    assert doctor.check_config(Config())[0].code == "config"
    good = tmp_path / "good.conf"
    good.write_text('ldcache = "merge"\n')
    assert doctor.check_config(replace(Config(), source=str(good)))[0].severity == "ok"
    bad = tmp_path / "bad.conf"
    bad.write_text('log-level = "loud"\n')
    f = doctor.check_config(replace(Config(), source=str(bad)))[0]
    assert f.severity == "error" and f.what.startswith(f"{bad}: key 'log-level'")
    fifo = tmp_path / "fifo.conf"  # read as a start reads it: one line, never a hang
    os.mkfifo(fifo)
    f = doctor.check_config(replace(Config(), source=str(fifo)))[0]
    assert f.severity == "error" and f.what.startswith(f"{fifo}: "), f.what


# --------------------------------------------------------------------- hooks.d, runtimes, cgroup, openat2


def test_hooks_d(tmp_path):
    env = denv(tmp_path, python="/usr/bin/python3")
    hooks = Path(env.hooks_dirs[0])
    f = only(installcheck.check_hooks_d(Config(), env), "hook-not-installed")
    assert f.fix == "pyxis-hook install podman (or: install cri-o)"
    (hooks / "pyxis-hook.json").write_text(json.dumps(hook_document(python="/usr/bin/python3")))
    assert only(installcheck.check_hooks_d(Config(), env), "hook-installed").severity == "ok"

    other = denv(tmp_path, python=shutil.which("python3") if os.path.realpath(shutil.which("python3")) !=
                 os.path.realpath("/usr/bin/python3") else "/bin/sh")
    f = only(installcheck.check_hooks_d(Config(), other), "hook-other-install")
    assert f.what.startswith(f"{hooks}/pyxis-hook.json runs /usr/bin/python3")
    conf = tmp_path / "pyxis.conf"
    conf.write_text("")
    f = only(installcheck.check_hooks_d(replace(Config(), source=str(conf)), env), "hook-other-config")
    assert str(conf) in f.what
    (hooks / "pyxis-hook.json").write_text(json.dumps(hook_document(python=str(tmp_path / "gone/python"))))
    f = only(installcheck.check_hooks_d(Config(), env), "hook-path-missing")
    assert f.severity == "error" and f"{tmp_path}/gone/python" in f.what


def test_runtimes(tmp_path):
    env = denv(tmp_path)
    f = only(doctor.check_runtimes(Config(), env), "no-runtime")
    assert f.what == f"neither runc nor crun in {tmp_path}/bin"
    fake = tmp_path / "bin/crun"
    fake.write_text("#!/bin/sh\necho 'crun version 9.9'\necho commit: x\n")
    fake.chmod(0o755)
    assert [f.what for f in doctor.check_runtimes(Config(), env)] == [f"{fake}: crun version 9.9"]


def test_node_artifact_finding(tmp_path, driver):
    """Doctor says whether the node artifact is trusted and fresh, and how to rebuild it when not."""
    from pyxis_hook.host import artifact

    cfg = host_config(tmp_path, driver)
    (f,) = installcheck.check_node_artifact(cfg)
    assert f.code == "node-artifact" and f.severity in ("warning", "info") and "pyxis-hook refresh" in f.fix
    artifact.load_or_build(cfg, strict=False)
    (f,) = installcheck.check_node_artifact(cfg)
    assert (f.code, f.severity) == ("node-artifact", "ok") and "trusted and fresh" in f.what


def _self_cgroup(cfg: Config, text: str, mountinfo: str = "") -> None:
    d = Path(cfg.proc_root) / "self"
    d.mkdir(exist_ok=True)
    (d / "cgroup").write_text(text)
    (d / "mountinfo").write_text(mountinfo)


def test_cgroup_versions(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    env = denv(tmp_path)
    assert doctor.check_cgroup(cfg, env)[0].severity == "info"  # unreadable
    _self_cgroup(cfg, "0::/user.slice/session-1.scope\n")
    f = doctor.check_cgroup(cfg, env)[0]
    assert (f.code, f.what) == ("cgroup-v2", "cgroup v2: device access is decided by eBPF programs")
    _self_cgroup(cfg, "4:devices:/user.slice\n1:name=systemd:/user.slice\n")
    assert doctor.check_cgroup(cfg, env)[0].code == "cgroup"
    assert doctor.check_cgroup(cfg, env)[0].severity == "ok"


def test_openat2():
    assert doctor.check_openat2()[0].code in ("openat2", "no-openat2")


# --------------------------------------------------------------------- Slurm


def _slurm_v1(cfg: Config, tmp_path: Path, rules: str) -> None:
    mnt = tmp_path / "cg/devices"
    step = mnt / "slurm/uid_0/job_42/step_0"
    step.mkdir(parents=True)
    (step / "devices.list").write_text(rules)
    _self_cgroup(cfg, "4:devices:/slurm/uid_0/job_42/step_0\n",
                 f"30 20 0:26 / {mnt} rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,devices\n")


def test_slurm_job_confined(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    _slurm_v1(cfg, tmp_path, "c 195:255 rw\nc 195:0 rw\n")
    f = only(doctor.check_slurm(discover(cfg, strict=False).host, cfg, denv(tmp_path)), "slurm-devices")
    assert (f.severity, f.what) == ("ok", "Slurm job 42: device cgroup allows GPU minor(s) 0 of 2")


def test_slurm_job_not_confined(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    _slurm_v1(cfg, tmp_path, "a *:* rwm\n")
    env = denv(tmp_path, environ=(("SLURM_JOB_ID", "42"), ("SLURM_JOB_GPUS", "0")))
    f = only(doctor.check_slurm(discover(cfg, strict=False).host, cfg, env), "slurm-not-confined")
    assert f.what == "Slurm job 42: its device cgroup allows every GPU (2) although it was allocated 1"
    assert "ConstrainDevices=yes" in f.fix


def test_slurm_not_confined_counts_the_step_as_the_hook_reads_it(tmp_path, driver):
    """A step on another node of a batch job inherits the batch host's SLURM_JOB_GPUS (two GPUs here):
    SLURM_STEP_GPUS (one, as a UUID) is what the hook reads (spec.allocation), and what doctor counts."""
    cfg = host_config(tmp_path, driver)
    _slurm_v1(cfg, tmp_path, "a *:* rwm\n")
    host = discover(cfg, strict=False).host
    uuid = host.gpus[1].uuid
    env = denv(tmp_path, environ=(("SLURM_JOB_ID", "42"), ("SLURM_JOB_GPUS", "0,1"), ("SLURM_STEP_GPUS", uuid)))
    f = only(doctor.check_slurm(host, cfg, env), "slurm-not-confined")
    assert f.what == "Slurm job 42: its device cgroup allows every GPU (2) although it was allocated 1"


def test_slurm_v2_and_no_slurm(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    host = discover(cfg, strict=False).host
    _self_cgroup(cfg, "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n")
    f = only(doctor.check_slurm(host, cfg, denv(tmp_path)), "slurm-devices")
    assert f.severity == "info" and f.what.startswith("Slurm job 7: cannot tell")
    _self_cgroup(cfg, "0::/user.slice\n")
    assert doctor.check_slurm(host, cfg, denv(tmp_path)) == []


# --------------------------------------------------------------------- command line


def _conf(tmp_path: Path, cfg: Config, ldconfig: str = "@/sbin/ldconfig") -> Path:
    return write_conf(tmp_path / "pyxis.conf", driver_root=cfg.driver_root, proc_root=cfg.proc_root,
                      dev_root=cfg.dev_root, snapshot_dir=cfg.snapshot_dir, extra=f'ldconfig = "{ldconfig}"\n')


def test_cli_mismatch_exits_one_and_prints_the_fix(tmp_path, driver, capsys):
    cfg = host_config(tmp_path, driver, driver_version="535.216.03", make_nodes=False)
    conf = _conf(tmp_path, cfg)
    assert cli.main(["--config", str(conf), "doctor"]) == 1
    out = capsys.readouterr().out
    assert f"✗ [driver-version-mismatch] kernel module 535.216.03 but user-space libraries {VERSION}" in out
    assert "    fix: reboot, or reload the module" in out
    assert cli.main(["--config", str(conf), "doctor", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, load_schema("doctor.schema.json"))
    assert doc["ok"] is False and doc["proc_root"] == cfg.proc_root


@pytest.mark.realdriver
@pytest.mark.slow
def test_real_driver_module_library_mismatch(tmp_path):
    from fixtures.realdriver import driver_version, require_driver_root

    drv = require_driver_root("535", "debian")
    real = driver_version("535")
    cfg = host_config(tmp_path, drv, driver_version="535.999.99", make_nodes=False)
    inv = discover(cfg, strict=False)
    f = only(doctor.check_driver(inv, cfg), "driver-version-mismatch")
    assert f.what == f"kernel module 535.999.99 but user-space libraries {real} in {drv}"
    cfg = host_config(tmp_path / "ok", drv, driver_version=real, make_nodes=False)
    inv = discover(cfg, strict=False)
    assert doctor.check_driver(inv, cfg)[0].code == "driver"
    assert doctor.check_host_ldcache(inv, cfg)[0].severity == "ok"


def test_troubleshooting_doc_lists_every_finding_code():
    """docs/troubleshooting.md is where users look codes up: every code either command emits is there."""
    import re

    repo = Path(__file__).resolve().parents[3]
    doc = (repo / "docs/troubleshooting.md").read_text()
    found: set[str] = set()
    from pyxis_hook.diag import doctor as doctor_mod, ldcheck

    for mod in (ldcheck, doctor_mod):
        src = Path(mod.__file__).read_text()
        found |= set(re.findall(r'Finding\([^,()]+,\s*"([a-z0-9-]+)"', src))
        found |= set(re.findall(r'gap\("([a-z0-9-]+)"', src))
    assert len(found) > 40
    missing = sorted(c for c in found if f"`{c}`" not in doc)
    assert not missing, missing


# --------------------------------------------------------------------- review fixes


def test_host_ldcache_uses_the_machines_loader_flags(tmp_path, driver):
    """An aarch64 host's cache lists libcuda with 0x0A03: found there, not with x86-64's 0x0303."""
    from pyxis_hook.loader import cachewrite, ldcache

    cfg = host_config(tmp_path, driver)
    inv = discover(cfg, strict=False)
    drv = tmp_path / "drv-arm"
    shutil.copytree(driver, drv, symlinks=True)
    lib = "/usr/lib/x86_64-linux-gnu"
    entries = [ldcache.CacheEntry(s, f"{lib}/{s}", 0x0A03) for s in ("libcuda.so.1", "libnvidia-ml.so.1")]
    (drv / "etc/ld.so.cache").write_bytes(cachewrite.serialize_cache(entries, "ldconfig (GNU libc) 2.36"))
    cfg = replace(cfg, driver_root=str(drv))
    assert doctor.check_host_ldcache(inv, cfg, machine="aarch64")[0].severity == "ok"
    assert [f.severity for f in doctor.check_host_ldcache(inv, cfg, machine="x86_64")] == ["error", "error"]


def test_foreign_hooks_d_file_with_odd_args(tmp_path):
    """A hooks.d file of another tool with `"args": 1` or `"env": "x"` is ignored, not an internal error."""
    env = denv(tmp_path, python="/usr/bin/python3")
    hooks = Path(env.hooks_dirs[0])
    (hooks / "other.json").write_text(json.dumps({"version": "1.0.0", "hook": {"path": "/bin/true", "args": 1,
                                                                                "env": "x"}}))
    assert only(installcheck.check_hooks_d(Config(), env), "hook-not-installed").severity == "warning"
    doc = hook_document(python="/usr/bin/python3")
    doc["hook"]["env"] = 7
    (hooks / "pyxis-hook.json").write_text(json.dumps(doc))
    assert only(installcheck.check_hooks_d(Config(), env), "hook-installed").severity == "ok"


def test_hooks_d_through_the_launcher_install_writes(tmp_path):
    """The registration `pyxis-hook install` writes names the launcher: it is this install when the launcher runs this
    install's interpreter and package; when not, the fix is to install again."""
    from pyxis_hook.engines.hookd import base_argv
    from pyxis_hook.engines.launcher import launcher_text

    env = denv(tmp_path, python="/usr/bin/python3")
    launcher = tmp_path / "pyxis-hook"
    launcher.write_text(launcher_text("/usr/bin/python3", base_argv("/usr/bin/python3")[-1]))
    launcher.chmod(0o755)
    (Path(env.hooks_dirs[0]) / "pyxis-hook.json").write_text(json.dumps(
        {"version": "1.0.0", "hook": {"path": str(launcher), "args": [str(launcher), "prestart"]},
         "when": {"always": True}, "stages": ["prestart"]}))
    assert only(installcheck.check_hooks_d(Config(), env), "hook-installed").severity == "ok"
    launcher.write_text(launcher_text("/opt/other/bin/python3", base_argv("/usr/bin/python3")[-1]))
    f = only(installcheck.check_hooks_d(Config(), env), "hook-other-install")
    assert f.what.endswith("runs /opt/other/bin/python3, not this install's /usr/bin/python3")
    assert f.fix == "pyxis-hook install podman (or: install cri-o)"


def test_stale_registration_and_enroot_node(tmp_path):
    """A launcher naming a gone interpreter is an error with its fix; enroot's hooks.d is checked."""
    from pyxis_hook.diag import enginecheck
    from pyxis_hook.engines.launcher import LAUNCHER, launcher_text

    launcher = tmp_path / LAUNCHER.lstrip("/")
    launcher.parent.mkdir(parents=True)
    launcher.write_text(launcher_text("/opt/gone/bin/python3", "/opt/gone/pyxis_hook/__main__.py"))
    f = only(enginecheck.check_launcher(str(tmp_path)), "registration-stale")
    assert f.severity == "error" and f.fix.startswith("pyxis-hook install ENGINE")
    hooks = tmp_path / "etc/enroot/hooks.d"
    hooks.mkdir(parents=True)
    (hooks / "98-nvidia.sh").write_text("#!/bin/bash\nexec nvidia-container-cli\n")
    (hooks / "98-nvidia.sh").chmod(0o755)
    ids = {f.code: f for f in enginecheck.check_enroot(str(tmp_path))}
    assert ids["enroot-hook-missing"].fix == ids["enroot-nvidia-hook-active"].fix.split(" (")[0] == \
        "pyxis-hook install enroot"


def test_relative_config_matches_the_absolute_one_in_hooks_d(tmp_path, monkeypatch):
    """`pyxis-hook --config pyxis.conf doctor` in the config's dir: the installed hook names it absolute."""
    from pyxis_hook.engines.hookd import hook_env

    env = denv(tmp_path, python="/usr/bin/python3")
    (tmp_path / "pyxis.conf").write_text("")
    monkeypatch.chdir(tmp_path)
    cfg = replace(Config(), source="pyxis.conf")
    doc = hook_document(env=hook_env(cfg), python="/usr/bin/python3")
    assert f"PYXIS_HOOK_CONFIG={tmp_path}/pyxis.conf" in doc["hook"]["env"]
    (Path(env.hooks_dirs[0]) / "pyxis-hook.json").write_text(json.dumps(doc))
    assert only(installcheck.check_hooks_d(cfg, env), "hook-installed").severity == "ok"
    elsewhere = replace(Config(), source=str(tmp_path / "other.conf"))
    assert only(installcheck.check_hooks_d(elsewhere, env), "hook-other-config").fix.startswith(
        f"pyxis-hook --config {tmp_path}/other.conf hookd --install ")


def test_cgroup_hybrid_without_v1_devices_and_v1_without_devices(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    env = denv(tmp_path)
    _self_cgroup(cfg, "1:name=systemd:/user.slice\n0::/user.slice\n")
    f = doctor.check_cgroup(cfg, env)[0]
    assert (f.code, f.what) == ("cgroup-v2", "cgroup hybrid: device access is decided by eBPF programs")
    _self_cgroup(cfg, "3:cpu:/user.slice\n")
    assert (doctor.check_cgroup(cfg, env)[0].severity, doctor.check_cgroup(cfg, env)[0].code) == ("warning", "cgroup")


def test_scheduler_line_names_the_scheduler_and_its_gpus(tmp_path, driver):
    # a Flux job step with one GPU (gpu-affinity writes Flux GPU ids, PCI order); then one without GPUs (-1)
    from pyxis_hook.diag.schedcheck import check_scheduler

    cfg = host_config(tmp_path, driver)
    host = discover(cfg, strict=False).host
    _self_cgroup(cfg, "0::/user.slice\n")
    env = denv(tmp_path, environ=(("FLUX_JOB_ID", "f3Lv2CcRsQ3"), ("CUDA_VISIBLE_DEVICES", "1")))
    f = only(check_scheduler(host, cfg, env), "scheduler")
    assert f.severity == "ok" and f.what.startswith("Flux job: Flux job f3Lv2CcRsQ3: CUDA_VISIBLE_DEVICES=1: host GPUs 1")
    env = denv(tmp_path, environ=(("FLUX_JOB_ID", "f3Lv2CcRsQ3"), ("CUDA_VISIBLE_DEVICES", "-1")))
    assert "without GPUs" in only(check_scheduler(host, cfg, env), "scheduler").what
    env = denv(tmp_path, environ=(("LSB_JOBID", "4711"), ("CUDA_VISIBLE_DEVICES", "5")))
    assert only(check_scheduler(host, cfg, env), "scheduler-allocation").severity == "error"
    assert check_scheduler(host, cfg, denv(tmp_path)) == []


def test_start_image_findings(tmp_path, monkeypatch):
    """Current, pending (no image yet, or a stale one) and unwritable, as a GPU start would see the file."""
    import marshal
    import sys

    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # as the hook runs (-I: PYTHONDONTWRITEBYTECODE ignored)

    from pyxis_hook import startimage, trust
    from pyxis_hook.diag.installcheck import check_start_image

    (tmp_path / "cache").mkdir(mode=0o755)
    os.chmod(tmp_path / "cache", 0o755)
    path = str(tmp_path / "cache" / "start-image.bin")
    (pending,) = check_start_image(path)
    assert (pending.severity, pending.code) == ("info", "start-image-pending") and "No such file or directory" in pending.what
    src = tmp_path / "m.py"
    src.write_text("X = 1\n")
    st = src.stat()
    entry = ("m", str(src), False, st.st_mtime_ns, st.st_size, compile("X = 1\n", str(src), "exec"))
    blobs = [marshal.dumps([]), marshal.dumps([entry]), marshal.dumps([])]  # boot, start, cdi-hook
    with open(path, "wb") as f:
        f.write(startimage._header() + b"".join(len(b).to_bytes(8, "little") for b in blobs) + b"".join(blobs))
    os.chmod(path, 0o644)
    (ok,) = check_start_image(path)
    assert (ok.severity, ok.code) == ("ok", "start-image") and "current, 1 modules" in ok.what
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (stale,) = check_start_image(path)
    assert stale.code == "start-image-pending" and f"stale ({src} changed)" in stale.what
    (unwritable,) = check_start_image(str(tmp_path / "missing-dir" / "start-image.bin"))
    assert unwritable.code == "start-image-unwritable"
    assert unwritable.severity == ("warning" if trust.may_write() else "info")  # the owner's to fix
    os.chmod(tmp_path / "cache", 0o777)  # writable by others: nothing written there would be trusted
    assert check_start_image(str(tmp_path / "cache" / "other.bin"))[0].code == "start-image-unwritable"
    os.chmod(tmp_path / "cache", 0o755)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # python -B: no bytecode, no image either
    assert check_start_image(str(tmp_path / "cache" / "other.bin"))[0].code == "start-image-unwritable"


def test_devices_mig_management_nodes_made_on_demand_are_no_error(tmp_path):
    """MIG's config and monitor nodes exist only once nvidia-modprobe made them: missing, they are no finding;
    a GPU's node missing still is an error (as any user sees the host: no node is made without root here)."""
    from pyxis_hook.host.gpus import DeviceNode
    from pyxis_hook.host.gpuscan import discover_gpus

    tree = make_host_tree(tmp_path, make_nodes=False)
    host = discover_gpus(tree.proc_root, tree.dev_root)
    assert (host.mig_config_minor, host.mig_monitor_minor) == (1, 2)
    present = tuple(DeviceNode(n.path, n.major, n.minor, 0o666, True, None)
                    if not n.path.startswith("/dev/nvidia-caps/") else n for n in host.nodes)
    cfg = Config(proc_root=tree.proc_root, dev_root=tree.dev_root)
    assert not by_code(doctor.check_devices(replace(host, nodes=present), cfg), "device-node")
    gone = tuple(replace(n, exists=False, problem="missing") if n.path == "/dev/nvidia0" else n for n in present)
    assert [f.what for f in by_code(doctor.check_devices(replace(host, nodes=gone), cfg), "device-node")] == [
        f"{tree.dev_root}/dev/nvidia0: missing (expected char 195:0)"]
