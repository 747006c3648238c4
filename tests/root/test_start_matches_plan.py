"""`plan` and a started container agree, for every request shape, with the start image cold and warm.

The hook runs as a runtime runs it (`python -I -S .../__main__.py prestart`,
the state on stdin, a container stand-in in its own mount namespace over a
small image) on a fake 4-GPU host with MIG on GPU 0.  For each request
shape, three starts: the image removed (cold: the start imports as usual and
writes it), then twice more (warm: the modules run from the image, which the
debug log must say).
Each start must produce exactly the device nodes,
mount points and symlinks `pyxis-hook plan --json` lists for the same bundle.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.cli import run_cli
from fixtures.container import make_bundle, make_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus, make_host_tree
from fixtures.standin import start_standin

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

SHAPES = {
    "all-compute-utility": ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
    "two-by-index-utility": ("NVIDIA_VISIBLE_DEVICES=1,3", "NVIDIA_DRIVER_CAPABILITIES=utility"),
    "one-by-uuid-default-caps": ("NVIDIA_VISIBLE_DEVICES={uuid2}",),
    "all-capabilities": ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"),
    "mig-device": ("NVIDIA_VISIBLE_DEVICES=0:0", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
    "no-gpu": ("NVIDIA_VISIBLE_DEVICES=void",),
}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    base = tmp_path_factory.mktemp("agree")
    driver = make_fake_driver(base / "driver")
    gpus = fake_gpus(4)
    tree = make_host_tree(base / "host", gpus=gpus, mig={0: {1: [0]}}, driver_version="535.104.05")
    log = base / "hook.log"
    conf = base / "pyxis.conf"
    conf.write_text(f'driver-root = "{driver}"\ndev-root = "{tree.dev_root}"\nproc-root = "{tree.proc_root}"\n'
                    f'snapshot-dir = "{base}/snapshot"\nno-cgroups = true\n'
                    f'log-file = "{log}"\nlog-level = "debug"\n')
    return base, conf, log, gpus


def _observed(rootfs: Path, pid: int) -> dict:
    """Device nodes under the rootfs's /dev, mount points inside the rootfs, symlinks the start made."""
    seen_root = f"/proc/{pid}/root{rootfs}"  # through the container's namespace: its /dev is its own tmpfs
    devices = {}
    for d, _, names in os.walk(f"{seen_root}/dev"):
        for n in names:
            st = os.lstat(os.path.join(d, n))
            if stat.S_ISCHR(st.st_mode):
                devices["/" + os.path.relpath(os.path.join(d, n), seen_root)] = (os.major(st.st_rdev),
                                                                               os.minor(st.st_rdev))
    prefix = str(rootfs) + "/"
    with open(f"/proc/{pid}/mountinfo") as f:
        points = {line.split()[4] for line in f}
    mounts = {"/" + p[len(prefix):] for p in points if p.startswith(prefix)}
    return {"devices": devices, "mounts": mounts}


def _resolved(rootfs: Path, path: str) -> str:
    """`path` with the links of its directories followed inside `rootfs` (chroot semantics): where a mount lands."""
    parts = [p for p in path.split("/") if p]
    done: list[str] = []
    hops = 0
    while len(parts) > 1:
        part = parts.pop(0)
        here = os.path.join(str(rootfs), *done, part)
        if os.path.islink(here) and hops < 40:
            hops += 1
            target = os.readlink(here)
            parts = [p for p in target.split("/") if p] + parts
            if target.startswith("/"):
                done = []
            continue
        if part == "..":
            done = done[:-1]
        elif part != ".":
            done.append(part)
    return "/" + "/".join(done + parts)


def _links(root: str) -> dict[str, str]:
    out = {}
    for d, dirs, names in os.walk(root):
        for n in dirs + names:
            p = os.path.join(d, n)
            if os.path.islink(p):
                out["/" + os.path.relpath(p, root)] = os.readlink(p)
    return out


def _start(host, bundle: Path, rootfs: Path) -> dict:
    base, conf, log, _ = host
    proc = start_standin(f'mount --bind "{rootfs}" "{rootfs}" && '
                         f'mount -t tmpfs tmpfs "{rootfs}/dev" && exec sleep 600')
    try:
        state = json.dumps({"ociVersion": "1.0.2", "id": "agree", "status": "creating", "pid": proc.pid,
                            "bundle": str(bundle)})
        log.write_text("")
        r = subprocess.run([sys.executable, "-I", "-S", str(REPO / "pyxis_hook/__main__.py"), "prestart"],
                           input=state.encode(), capture_output=True,
                           env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYXIS_HOOK_CONFIG": str(conf)})
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        seen = _observed(rootfs, proc.pid)
        seen["links"] = _links(f"/proc/{proc.pid}/root{rootfs}")
        seen["log"] = log.read_text()
        return seen
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_start_does_what_plan_says_with_the_image_cold_and_warm(host, tmp_path, shape):
    from pyxis_hook import startimage

    base, conf, log, gpus = host
    env = tuple(e.format(uuid2=gpus[2].uuid) for e in SHAPES[shape])
    starts = []
    for i in range(3):
        rootfs = make_rootfs(tmp_path / f"rootfs{i}", gputest=False)
        before_links = _links(str(rootfs))
        bundle = make_bundle(tmp_path / f"bundle{i}", rootfs, env=env)
        r = run_cli("plan", "--bundle", str(bundle), "--json", conf=conf)
        assert r.returncode == 0, r.stderr
        plan = json.loads(r.stdout)["plan"]
        if i == 0:  # cold: no start image
            Path(startimage.image_path()).unlink(missing_ok=True)
        seen = _start(host, bundle, rootfs)
        want_devices = {d["path"]: (d["major"], d["minor"]) for d in plan["devices"]}
        # a device node is bound from the host's where it can be (apply/mounts.py)
        want_mounts = {_resolved(rootfs, m["container_path"]) for m in plan["mounts"]} | set(want_devices)
        mounts = seen["mounts"] - {"/dev"}  # the stand-in's own tmpfs, as a runtime's
        proc = {m for m in mounts - want_mounts  # the view's own mounts; MIG access files are plan mounts
                if m == "/proc/driver/nvidia" or m.startswith("/proc/driver/nvidia/")}
        if plan["proc_driver"] is not None:
            # its tmpfs, and the selected GPUs' dirs bound into it; only where the container's /proc has a
            # /proc/driver/nvidia to cover, which the stand-in (no NVIDIA module on this host) has not
            assert proc <= {"/proc/driver/nvidia", "/proc/driver/nvidia/gpus"} | {
                f"/proc/driver/nvidia/gpus/{g}" for g in plan["proc_driver"]["gpu_dirs"]}
        else:
            assert proc == set()
        assert seen["devices"] == want_devices
        assert mounts - proc == want_mounts
        new_links = {p: t for p, t in seen["links"].items() if p not in before_links}
        assert new_links == {s["container_path"]: s["target"] for s in plan["symlinks"]}
        starts.append((seen, plan))
    if shape != "no-gpu":
        assert all(s["devices"] for s, _ in starts)  # a real request: something was made
        entry = re.escape(startimage.image_path())
        assert re.search(rf"start image {entry}: boot section not used", starts[0][0]["log"])  # cold
        assert re.search(rf"start image {entry}: start section: \d+ modules loaded", starts[2][0]["log"])  # warm
    else:
        assert all(not s["devices"] and not s["mounts"] - {"/dev"} for s, _ in starts)
