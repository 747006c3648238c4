"""An image's own copy of a driver library at its SONAME path: the container still loads the host's file.

The host runs the real 535 driver.  The image carries another real driver
line's `libnvidia-ml` and `libcuda` in its lib dir, its ld.so.cache built
by glibc's ldconfig over them, two ways: tesla-470's files as regular files
at the SONAME paths (what a `COPY` of another host's libraries leaves; the
image's cache names them through its `/lib -> usr/lib` link), and 550's
versioned files with SONAME links to them (a newer line: glibc's ldconfig
would point the links back at them).  `ldcheck --bundle` is asked before
the start; inside, a program dlopens both by SONAME and prints the files it
mapped (`/proc/self/maps`: device and inode), which must be the host's.
The same holds for a CDI spec merged into the bundle (no prestart hook): its
create-symlinks hook binds the runtime's mount of the host's file over the
image's regular file.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import pytest

from e2e.conftest import bundle_for, fresh_rootfs, make_host, mount_table, run_container
from fixtures.cli import run_cli
from fixtures.container import make_bundle, merge_cdi
from fixtures.maps import MAPS_C, mapped
from fixtures.realdriver import TRIPLET_DIR, driver_version, require_driver_root
from fixtures.synth import build_exe
from pyxis_hook.rootfs import resolve_in_root

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver]

RUNTIMES = [r for r in ("runc", "crun") if shutil.which(r)]
LIBDIR = "/usr/lib/x86_64-linux-gnu"
STEMS = ("libnvidia-ml.so", "libcuda.so")



def _image_with_copies(bundle, line: str, occupant: str) -> dict[str, bytes]:
    """Put `line`'s libraries into the image's lib dir; return {container path: bytes} of what was put there."""
    tree = require_driver_root(line, "installer")
    version = driver_version(line)
    lib = bundle / "rootfs" / LIBDIR.lstrip("/")
    put = {}
    for stem in STEMS:
        src = tree / TRIPLET_DIR / f"{stem}.{version}"
        soname = f"{stem}.1"
        if occupant == "file":  # a regular file at the SONAME path
            shutil.copyfile(src, lib / soname)
            put[f"{LIBDIR}/{soname}"] = src.read_bytes()
        else:  # the versioned file and the image's SONAME link to it
            shutil.copyfile(src, lib / src.name)
            (lib / soname).symlink_to(src.name)
            put[f"{LIBDIR}/{src.name}"] = src.read_bytes()
    subprocess.run(["ldconfig", "-r", str(bundle / "rootfs")], check=True, capture_output=True)
    return put


@pytest.mark.parametrize("occupant, line", [("file", "470"), ("symlink", "550")])
@pytest.mark.parametrize("ldcache", ["merge", "ldconfig"])
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_container_loads_the_host_driver_not_the_images_copy(tmp_path, runtime, ldcache, occupant, line):
    root, host = _real_host(tmp_path, ldcache)
    version = driver_version("535")
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/mapstest")
    build_exe(bundle / "rootfs/usr/bin", "mapstest", source=MAPS_C)
    put = _image_with_copies(bundle, line, occupant)
    # the host's files: the driver root's SONAME links, followed inside it (Debian's alternatives)
    host_ino = {stem: os.stat(resolve_in_root(str(root), f"{LIBDIR}/{stem}.1")).st_ino for stem in STEMS}

    # ldcheck, before the start, says where each SONAME resolves and what the hook covers
    r = run_cli("ldcheck", "--bundle", str(bundle), "--json", conf=host.conf)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.stderr
    report = json.loads(r.stdout)
    libs = {x["soname"]: x for x in report["libraries"]}
    covered = sorted(f["what"].split(" ", 1)[0] for f in report["findings"] if f["code"] == "image-file-covered")
    for stem in STEMS:
        res = libs[f"{stem}.1"]
        assert res["outcome"] == "host" and res["is_host_file"], res
        assert res["injected"] == f"{LIBDIR}/{stem}.{version}"
    assert covered == (sorted(put) if occupant == "file" else [])

    out = run_container(runtime, bundle, f"pyxis-wins-{os.getpid()}-{tmp_path.name[-12:]}")
    assert not [m for m in mount_table() if str(tmp_path) in m], "a mount leaked onto the host"
    assert out.rc == 0, out.stderr + out.stdout
    assert "cuDriverGetVersion=12020" in out.stdout, out.stdout  # 535's libcuda, not 470's 11040 or 550's 12040
    assert mapped(out.stdout, STEMS) == {stem: {host_ino[stem]} for stem in STEMS}, (out.stdout, host_ino)

    # one warning line per covered file; the image's own files are left as they were
    log = (tmp_path / "hook.log").read_text()
    for path in put:
        warned = [x for x in log.splitlines() if re.search(rf"\] warning: {re.escape(path)}: ", x)]
        assert len(warned) == (1 if occupant == "file" else 0), log
        assert (bundle / "rootfs" / path.lstrip("/")).read_bytes() == put[path]


def _real_host(tmp_path, ldcache: str = "merge"):
    """The fake GPU host running the real 535 user-space files (its /proc version says so)."""
    root = require_driver_root("535", "debian")
    host = make_host(tmp_path, driver_root=root)
    host.write_conf(ldcache=ldcache)
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version('535')}  "
                "Thu Jan  1 00:00:00 UTC 2026\n")
    return root, host


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cdi_container_loads_the_host_driver_not_the_images_copy(tmp_path, runtime):
    """470's files as regular files at the SONAME paths; the spec of `cdi generate` merged into config.json."""
    root, host = _real_host(tmp_path)
    r = run_cli("cdi", "generate", conf=host.conf)
    assert r.returncode == 0, r.stderr
    bundle = tmp_path / "bundle"
    fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle, args=("/bin/sh", "-c", "/usr/bin/mapstest"))
    cfg = bundle / "config.json"
    cfg.write_text(json.dumps(merge_cdi(json.loads(cfg.read_text()), json.loads(r.stdout), "0")))
    build_exe(bundle / "rootfs/usr/bin", "mapstest", source=MAPS_C)
    put = _image_with_copies(bundle, "470", "file")
    host_ino = {stem: os.stat(resolve_in_root(str(root), f"{LIBDIR}/{stem}.1")).st_ino for stem in STEMS}

    out = run_container(runtime, bundle, f"pyxis-cdiwins-{os.getpid()}-{runtime}")
    assert not [m for m in mount_table() if str(tmp_path) in m], "a mount leaked onto the host"
    assert out.rc == 0, out.stderr + out.stdout
    assert "cuDriverGetVersion=12020" in out.stdout, out.stdout
    assert mapped(out.stdout, STEMS) == {stem: {host_ino[stem]} for stem in STEMS}, (out.stdout, host_ino)
    log = (tmp_path / "hook.log").read_text()
    for path in put:
        warned = [x for x in log.splitlines() if re.search(rf"\] warning: {re.escape(path)}: the image's own", x)]
        assert len(warned) == 1, log
        assert (bundle / "rootfs" / path.lstrip("/")).read_bytes() == put[path]
