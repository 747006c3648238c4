"""A herd of 20 containers started at once by runc with the hook, the real driver, no snapshot yet.

Every start finds the snapshot directory empty or half-built by its
neighbours: they may all rebuild the inventory, and must all come up right
(the host's libcuda and libnvidia-ml mapped, by inode; the /dev/nvidiaN node
asked for), leave no mount on the host, and leave one valid snapshot.

Then a driver upgrade during a herd: the driver root is a link flipped from
the 535 tree to the 550 tree (the module's version in procfs following)
while the starts run.  Each container gets one driver, the old or the new:
both libraries of one tree and the CUDA version that tree's libcuda reports.
A start caught between the link and the module's version may fail, with
one clear error line; none gets a mix.  And the upgrade landing in one
start between its plan and its apply, the worst moment: that container
still gets the old driver whole (libraries and nvidia-smi).
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, hook_entry, make_host, run_container
from fixtures.container import make_bundle
from fixtures.herd import mounts_under, run_herd
from fixtures.maps import MAPS_C, mapped
from fixtures.realdriver import CUDA_VERSION, TRIPLET_DIR, driver_version, require_driver_root
from fixtures.synth import build_exe
from pyxis_hook.errors import ArtifactError
from pyxis_hook.host import artifact
from pyxis_hook.rootfs import resolve_in_root
from pyxis_hook.spec.config import load_config

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver]

N = 20
GPUS = 4
STEMS = ("libnvidia-ml.so", "libcuda.so")
#: the hook with a host change run between its plan and its apply (a script: never imported)
MIDSTART = Path(__file__).resolve().parents[1] / "fixtures" / "midstart.py"
SCRIPT = "ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; /usr/bin/mapstest"


def _set_module_version(proc_root: str, line: str) -> None:
    """The fake host's procfs reports `line`'s kernel module (replaced in one rename, as procfs reads whole)."""
    path = os.path.join(proc_root, "driver/nvidia/version")
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version(line)}  "
                "Thu Jan  1 00:00:00 UTC 2026\n")
    os.rename(tmp, path)


def _point(link: Path, target: Path) -> None:
    """Make `link` lead to `target` in one rename: no moment without a driver root."""
    tmp = link.with_name(link.name + ".new")
    tmp.symlink_to(target)
    tmp.rename(link)


def _linked_host(tmp_path: Path):
    """(the 535 and 550 trees, the driver root: a link to 535's, a host running 535 with it)."""
    trees = {line: require_driver_root(line, "debian") for line in ("535", "550")}
    link = tmp_path / "driver"
    link.symlink_to(trees["535"])
    host = make_host(tmp_path / "host", driver_root=link, gpus=GPUS)
    _set_module_version(host.proc_root, "535")
    return trees, link, host


def _image(tmp_path: Path) -> Path:
    image = fresh_rootfs(tmp_path / "image")
    build_exe(image / "usr/bin", "mapstest", source=MAPS_C)
    return image


def _inodes(root: Path) -> dict[str, int]:
    """stem -> inode of the file its SONAME link leads to in `root` (followed inside it: Debian's alternatives)."""
    return {stem: os.stat(resolve_in_root(str(root), f"{TRIPLET_DIR}/{stem}.1")).st_ino for stem in STEMS}


def _nodes(out: str) -> list[str]:
    return out.splitlines()[0].split() if out else []


def _which_driver(out: str, trees: dict[str, dict[str, int]]) -> str | None:
    """The driver line whose libcuda and libnvidia-ml the probe mapped (None: none, or a mix)."""
    got = mapped(out, STEMS)
    for line, ino in trees.items():
        if got == {stem: {ino[stem]} for stem in STEMS}:
            return line
    return None


def _snapshots(d: Path) -> list[Path]:
    """The node artifacts in `d` (not the build lock beside them)."""
    return sorted(p for p in d.iterdir() if p.name.startswith("inventory-"))


def test_herd_builds_one_snapshot_and_every_container_gets_the_host_driver(tmp_path):
    root = require_driver_root("535", "debian")
    host = make_host(tmp_path / "host", driver_root=root, gpus=GPUS)
    _set_module_version(host.proc_root, "535")
    snap = tmp_path / "host/snapshot"
    snap.mkdir(mode=0o755)
    image = _image(tmp_path)
    want = _inodes(root)

    starts, leaked = run_herd(image, tmp_path / "herd", N, hook=lambda i, where: hook_entry(host.conf),
                              env=lambda i: (f"NVIDIA_VISIBLE_DEVICES={i % GPUS}",), script=SCRIPT)

    assert leaked == []
    for s in starts:
        assert s.rc == 0, (s.index, s.stderr)
        assert _nodes(s.stdout) == ["nvidia-uvm", "nvidia-uvm-tools", f"nvidia{s.index % GPUS}", "nvidiactl"], s
        assert f"cuDriverGetVersion={CUDA_VERSION['535']}" in s.stdout, s.stdout
        assert mapped(s.stdout, STEMS) == {stem: {want[stem]} for stem in STEMS}, (s.stdout, want)
    files = _snapshots(snap)
    assert [p.name for p in files] == [os.path.basename(artifact.artifact_path(load_config(str(host.conf))))]
    # the node artifact is the one file a start keeps there (besides its hidden build lock)
    assert sorted(p.name for p in snap.iterdir() if not p.name.startswith(".")) == [files[0].name]
    inv = artifact.load(load_config(str(host.conf)))
    assert inv.driver_version == driver_version("535") and inv.driver_root == str(root)


def test_driver_upgraded_during_a_herd_gives_each_container_one_driver(tmp_path):
    trees, link, host = _linked_host(tmp_path)
    snap = tmp_path / "host/snapshot"
    snap.mkdir(mode=0o755)
    image = _image(tmp_path)
    inodes = {line: _inodes(tree) for line, tree in trees.items()}

    # the first half starts at once; the upgrade lands when three of them are done, while the rest
    # are in flight; the second half starts after it
    early = N // 2
    upgraded = threading.Event()
    lock = threading.Lock()
    done_before: list[int] = []

    def hold(i: int) -> None:
        if i >= early:
            upgraded.wait()

    def finished(s) -> None:
        with lock:
            if upgraded.is_set():
                return
            done_before.append(s.index)
            if len(done_before) == 3:
                _point(link, trees["550"])
                _set_module_version(host.proc_root, "550")
                upgraded.set()

    starts, leaked = run_herd(image, tmp_path / "herd", N, hook=lambda i, where: hook_entry(host.conf),
                              env=lambda i: (f"NVIDIA_VISIBLE_DEVICES={i % GPUS}",), script=SCRIPT,
                              before=hold, after=finished)

    assert leaked == []
    got = {}
    for s in starts:
        if s.rc != 0:  # caught between the link and the module's version: refused, and said why
            assert s.index < early and s.index not in done_before, (s.index, s.stderr)
            assert "pyxis-hook: error:" in s.stderr and "Traceback" not in s.stderr, s.stderr
            continue
        line = _which_driver(s.stdout, inodes)
        assert line is not None, f"container {s.index} mapped a mix or no host driver: {s.stdout}"
        assert f"cuDriverGetVersion={CUDA_VERSION[line]}" in s.stdout, s.stdout
        assert _nodes(s.stdout) == ["nvidia-uvm", "nvidia-uvm-tools", f"nvidia{s.index % GPUS}", "nvidiactl"], s
        got[s.index] = line
    assert {i: got.get(i) for i in done_before} == dict.fromkeys(done_before, "535")
    assert {i: got.get(i) for i in range(early, N)} == dict.fromkeys(range(early, N), "550")

    # one snapshot file; the last writer may have been a start that took the old tree, which the
    # next start finds stale and replaces
    conf = load_config(str(host.conf))
    assert [p.name for p in _snapshots(snap)] == [os.path.basename(artifact.artifact_path(conf))]
    try:
        inv = artifact.load(conf)
    except ArtifactError as e:
        assert "stale" in str(e)
        inv = artifact.load_or_build(conf)
    assert inv.driver_version == driver_version("550") and inv.driver_root == str(trees["550"])
    assert artifact.load(conf) == inv


def test_driver_upgraded_between_plan_and_apply_gives_the_old_driver_whole(tmp_path):
    trees, link, host = _linked_host(tmp_path)
    old_smi = os.stat(resolve_in_root(str(trees["535"]), "usr/bin/nvidia-smi")).st_ino
    assert old_smi != os.stat(resolve_in_root(str(trees["550"]), "usr/bin/nvidia-smi")).st_ino
    new_version = (f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version('550')}  "
                   "Thu Jan  1 00:00:00 UTC 2026")
    version_file = os.path.join(host.proc_root, "driver/nvidia/version")
    upgrade = (f"ln -sn {shlex.quote(str(trees['550']))} {shlex.quote(str(link))}.new && "
               f"mv -T {shlex.quote(str(link))}.new {shlex.quote(str(link))} && "
               f"echo {shlex.quote(new_version)} > {shlex.quote(version_file)}.new && "
               f"mv {shlex.quote(version_file)}.new {shlex.quote(version_file)}")
    entry = hook_entry(host.conf)
    hook = {"path": sys.executable, "args": [sys.executable, "-I", "-S", str(MIDSTART), "prestart"],
            "env": [*entry["env"], f"PYXIS_MIDSTART={upgrade}"]}
    rootfs = _image(tmp_path / "c")
    bundle = make_bundle(tmp_path / "c/bundle", rootfs, env=("NVIDIA_VISIBLE_DEVICES=2",),
                         args=("/bin/sh", "-c", SCRIPT + "; stat -c 'smi %i' /usr/bin/nvidia-smi"),
                         hooks={"prestart": [hook]})
    r = run_container("runc", bundle, f"pyxis-herd-mid-{os.getpid()}")
    assert mounts_under(tmp_path) == []
    assert os.readlink(link) == str(trees["550"])  # the upgrade did land mid-start
    assert r.rc == 0, r.stderr
    assert _which_driver(r.stdout, {line: _inodes(tree) for line, tree in trees.items()}) == "535", r.stdout
    assert f"cuDriverGetVersion={CUDA_VERSION['535']}" in r.stdout, r.stdout
    assert f"smi {old_smi}" in r.stdout.splitlines(), r.stdout
