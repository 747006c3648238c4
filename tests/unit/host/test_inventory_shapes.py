"""Inventory shapes first seen in the real 550 driver (Debian 13), rebuilt on synthetic trees.

- libnvidia-glcore/-eglcore (graphics) need libnvidia-gpucomp, which the
  capability lists (LNC's too) file under compute: the DT_NEEDED closure must
  hand it to graphics as well, or a graphics-only container cannot load them.
- trixie's packages are merged-/usr: the GSP firmware is shipped in
  /usr/lib/firmware/nvidia/<version>; a host reaches it as /lib/firmware
  through /lib -> usr/lib, a `dpkg -x` tree has no such link.

glibc's own loader (`ld.so --list`) is the oracle for "loads".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.realdriver import run_ldconfig
from fixtures.synth import build_lib
from fixtures.synthdriver import LIB, V, make_driver
from pyxis_hook.spec.config import Config
from pyxis_hook.host.inventory import Inventory
from pyxis_hook.host.discovery import discover
from pyxis_hook.record import replace

LDSO = "/lib64/ld-linux-x86-64.so.2"


def cfg(root: Path) -> Config:
    return replace(Config(), driver_root=str(root), proc_root=str(root / "no-proc"), dev_root=str(root / "no-dev"),
                   snapshot_dir=str(root.parent / "snap"))


def gpucomp_driver(root: Path) -> Path:
    """The synthetic driver with 550's chain: glcore, eglcore -> gpucomp -> an internal library."""
    make_driver(root, ldconfig=False)
    d = root / LIB
    build_lib(d, f"libnvidia-gpucomp.so.{V}", needed=(f"libnvidia-internal.so.{V}",))
    build_lib(d, f"libnvidia-glcore.so.{V}", needed=(f"libnvidia-tls.so.{V}", f"libnvidia-gpucomp.so.{V}"))
    build_lib(d, f"libnvidia-eglcore.so.{V}", needed=(f"libnvidia-glsi.so.{V}", f"libnvidia-gpucomp.so.{V}"))
    run_ldconfig(root)
    return root


def loads(files, soname: str, tmp: Path) -> str:
    """`ld.so --list` of `soname` with only `files` on the library path (as the container would have them)."""
    d = tmp / "container-lib"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    for f in files:
        shutil.copy2(f.host_path, d / f.name)
        for link, target in f.links:
            if not (d / link).exists():
                os.symlink(target, d / link)
    p = subprocess.run([LDSO, "--library-path", str(d), "--list", str(d / soname)], capture_output=True, text=True)
    return p.stdout + p.stderr


def test_a_compute_library_needed_by_graphics_serves_graphics_too(tmp_path):
    inv = discover(cfg(gpucomp_driver(tmp_path / "root")))
    gpucomp = [f for f in inv.files if f.kind == "lib" and f.name == f"libnvidia-gpucomp.so.{V}"]
    assert {(f.capability, f.source) for f in gpucomp} == {
        ("compute", f"ldcache:libnvidia-gpucomp.so.{V}"),
        ("graphics", f"needed-by:libnvidia-eglcore.so.{V}"),  # the first graphics library reaching it
    }
    assert len({f.host_path for f in gpucomp}) == 1
    # transitively: what gpucomp needs comes with graphics too
    internal = {f.capability for f in inv.files if f.name == f"libnvidia-internal.so.{V}"}
    assert internal == {"compute", "graphics"}
    graphics = {f.name for f in inv.select(["graphics"])}
    assert {f"libnvidia-gpucomp.so.{V}", f"libnvidia-internal.so.{V}"} <= graphics
    assert f"libcuda.so.{V}" not in graphics
    # each host file once, whatever the request
    both = [f.host_path for f in inv.select(["graphics", "compute"])]
    assert len(both) == len(set(both))
    assert not any("gpucomp" in f.name for f in inv.select(["utility"]))


def test_graphics_selection_satisfies_glibcs_loader(tmp_path):
    """Oracle: with only the graphics files on its path, ld.so resolves glcore and eglcore completely."""
    inv = discover(cfg(gpucomp_driver(tmp_path / "root")))
    files = inv.select(["graphics"], kinds=("lib",))
    for soname in (f"libnvidia-glcore.so.{V}", f"libnvidia-eglcore.so.{V}"):
        out = loads(files, soname, tmp_path)
        assert "not found" not in out and f"libnvidia-gpucomp.so.{V} =>" in out, out
    # and the same check notices a gap: without gpucomp the loader reports it missing
    out = loads([f for f in files if "gpucomp" not in f.name], f"libnvidia-glcore.so.{V}", tmp_path)
    assert f"libnvidia-gpucomp.so.{V}: cannot open shared object file" in out


def test_no_cross_capability_needs_keeps_one_record_per_file(tmp_path):
    """The 535 shape (no cross-capability DT_NEEDED): one record per library, as before."""
    inv = discover(cfg(make_driver(tmp_path / "root")))
    libs = [f.host_path for f in inv.files if f.kind == "lib"]
    assert len(libs) == len(set(libs))


def _firmware_in_usr(root: Path) -> None:
    """Move make_driver's /lib/firmware to /usr/lib/firmware (where trixie's packages put it)."""
    (root / "usr/lib").mkdir(parents=True, exist_ok=True)
    shutil.move(str(root / "lib/firmware"), str(root / "usr/lib/firmware"))
    (root / "lib").rmdir()


def test_firmware_in_usr_lib_without_a_lib_link(tmp_path):
    root = make_driver(tmp_path / "root")
    _firmware_in_usr(root)
    inv = discover(cfg(root))
    fw = [(f.path, f.host_path) for f in inv.files if f.kind == "firmware"]
    real = str(root / f"usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin")
    assert fw == [(f"/usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin", real)]
    assert not any("no GSP firmware" in w for w in inv.warnings)


def test_merged_usr_firmware_listed_once_under_lib(tmp_path):
    root = make_driver(tmp_path / "root")
    _firmware_in_usr(root)
    (root / "lib").symlink_to("usr/lib")
    inv = discover(cfg(root))
    fw = [(f.path, f.host_path) for f in inv.files if f.kind == "firmware"]
    assert fw == [(f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", str(root / f"usr/lib/firmware/nvidia/{V}/gsp_ga10x.bin"))]


def test_firmware_in_two_real_dirs_is_listed_once_per_name(tmp_path):
    """/lib/firmware and /usr/lib/firmware as two real dirs with the same files: the /lib copy only
    (two mounts of one name would stack on one file in a merged-/usr image)."""
    root = make_driver(tmp_path / "root")
    (root / "usr/lib").mkdir(parents=True, exist_ok=True)
    shutil.copytree(root / "lib/firmware", root / "usr/lib/firmware")
    inv = discover(cfg(root))
    fw = [(f.path, f.host_path) for f in inv.files if f.kind == "firmware"]
    assert fw == [(f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", str(root / f"lib/firmware/nvidia/{V}/gsp_ga10x.bin"))]


def test_no_firmware_anywhere_warns_about_lib_firmware(tmp_path):
    root = make_driver(tmp_path / "root")
    shutil.rmtree(root / "lib/firmware")
    inv: Inventory = discover(cfg(root))
    assert not any(f.kind == "firmware" for f in inv.files)
    assert any(w.endswith(f"/lib/firmware/nvidia/{V}: no GSP firmware (gsp*.bin)") for w in inv.warnings)


@pytest.mark.parametrize("where", ["lib", "usr/lib"])
def test_firmware_outside_the_root_is_never_followed(tmp_path, where):
    """A firmware link aimed at a host path resolves inside the driver root, in both directories."""
    root = make_driver(tmp_path / "root")
    if where == "usr/lib":
        _firmware_in_usr(root)
    fw = root / where / f"firmware/nvidia/{V}"
    secret = tmp_path / "host-blob.bin"
    secret.write_bytes(b"secret")
    (fw / "gsp_ga10x.bin").unlink()
    (fw / "gsp_ga10x.bin").symlink_to(secret)  # absolute host path: missing inside the root
    inv = discover(cfg(root))
    assert not any(f.kind == "firmware" for f in inv.files)


def test_a_shared_librarys_outside_dependency_reaches_every_capability_it_serves(tmp_path):
    """gpucomp (compute, and graphics through glcore) needing a library the driver does not ship:
    a graphics-only request hears of it too (list, ldcheck)."""
    root = make_driver(tmp_path / "root", ldconfig=False)
    d = root / LIB
    build_lib(d, f"libnvidia-gpucomp.so.{V}", needed=("libzstd-fake.so.1",))
    build_lib(d, f"libnvidia-glcore.so.{V}", needed=(f"libnvidia-tls.so.{V}", f"libnvidia-gpucomp.so.{V}"))
    run_ldconfig(root)
    inv = discover(cfg(root))
    rows = sorted((x.name, x.capability) for x in inv.non_driver_deps if x.name == "libzstd-fake.so.1")
    assert rows == [("libzstd-fake.so.1", "compute"), ("libzstd-fake.so.1", "graphics")]
    for caps in (("graphics",), ("compute",), ("compute", "graphics")):
        assert [x.name for x in inv.deps_for(caps)].count("libzstd-fake.so.1") == 1
