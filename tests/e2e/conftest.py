"""Fixtures for end-to-end tests: a fake GPU host, driver trees, bundles run by real runtimes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from fixtures.container import make_bundle, make_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import FakeGpu, fake_gpus, make_host_tree

DRIVER_VERSION = "535.216.03"


@dataclass
class Host:
    """A fake GPU host: driver root, proc/dev trees and a pyxis.conf naming them."""

    base: Path
    driver_root: Path
    proc_root: str
    dev_root: str
    conf: Path
    tree: object

    def write_conf(self, **extra) -> Path:
        lines = [f'driver-root = "{self.driver_root}"', f'dev-root = "{self.dev_root}"',
                 f'proc-root = "{self.proc_root}"', f'snapshot-dir = "{self.base}/snapshot"',
                 f'log-file = "{self.base}/hook.log"', 'log-level = "debug"']
        for k, v in extra.items():
            lines.append(f"{k.replace('_', '-')} = {json.dumps(v)}")
        self.conf.write_text("\n".join(lines) + "\n")
        return self.conf


def hook_entry(conf: Path, stage: str = "prestart") -> dict:
    from pyxis_hook.engines.hookd import hook_argv, interpreter

    python = interpreter()
    return {"path": python, "args": hook_argv(stage, python),
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"PYXIS_HOOK_CONFIG={conf}"]}


def make_host(base: Path, driver_root: Path | None = None, *, gpus: int | list[FakeGpu] = 4,
              kernel_module: bool = True) -> Host:
    """`gpus`: a count (minors in PCI order) or the GPUs themselves (`fake_gpus(n, minors=...)`)."""
    tree = make_host_tree(base / "host", gpus=fake_gpus(gpus) if isinstance(gpus, int) else gpus,
                          driver_version=DRIVER_VERSION,
                          kernel_module=kernel_module)
    if driver_root is None:
        driver_root = make_fake_driver(base / "driver", version=DRIVER_VERSION)
    host = Host(base, Path(driver_root), str(tree.proc_root), str(tree.dev_root), base / "pyxis.conf", tree)
    host.write_conf()
    return host


@pytest.fixture
def host(tmp_path) -> Host:
    return make_host(tmp_path)


_ROOTFS_TEMPLATE: dict[str, Path] = {}


def fresh_rootfs(dest: Path, **kw) -> Path:
    """A rootfs copied from a per-session template (building one costs a gcc + ldconfig run)."""
    key = json.dumps(kw, sort_keys=True)
    if key not in _ROOTFS_TEMPLATE:
        import tempfile

        tpl = Path(tempfile.mkdtemp(prefix="pyxis-rootfs-")) / "rootfs"
        make_rootfs(tpl, **kw)
        _ROOTFS_TEMPLATE[key] = tpl
    shutil.copytree(_ROOTFS_TEMPLATE[key], dest, symlinks=True)
    return dest


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str


def run_container(runtime: str, bundle: Path, name: str, timeout: int = 60) -> Result:
    """`runc run` / `crun run` the bundle (crun inside a private mount ns without the hybrid cgroup2)."""
    if runtime == "runc":
        cmd = ["runc", "run", name]
    else:
        cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
               f"umount /sys/fs/cgroup/unified 2>/dev/null; exec crun run {name}"]
    try:
        r = subprocess.run(cmd, cwd=bundle, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    finally:
        subprocess.run([runtime, "delete", "-f", name], capture_output=True)
    return Result(r.returncode, r.stdout, r.stderr)


def mount_table() -> list[str]:
    """The host's mounts (mount point + source), to prove nothing leaked."""
    with open("/proc/self/mountinfo") as f:
        return sorted(" ".join(line.split()[4:5] + line.split()[3:4]) for line in f)


def bundle_for(tmp: Path, host: Host, env: tuple[str, ...], script: str, *, stage: str = "prestart",
               rootfs_kw: dict | None = None, annotations: dict | None = None, readonly: bool = False) -> Path:
    bundle = tmp / "bundle"
    fresh_rootfs(bundle / "rootfs", **(rootfs_kw or {}))
    make_bundle(bundle, env=env, args=("/bin/sh", "-c", script), hooks={stage: [hook_entry(host.conf, stage)]},
                annotations=annotations, readonly=readonly)
    return bundle


def file_tree(root: Path) -> dict[str, bytes]:
    """Every file and link under `root`: relative path -> content (a link: its target), to compare trees."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for f in files:
            p = Path(d) / f
            out[str(p.relative_to(root))] = os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
    return out
