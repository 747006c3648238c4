"""Inventory on the real NVIDIA user-space driver (Debian 12's 535 and tesla-470, Debian 13's 550), four layouts.

The trees come from tests/fixtures/realdriver.py (downloaded once into the
cache, caches built by glibc's `ldconfig -r`).  In CI a failed download fails
these tests; elsewhere they are skipped.
"""

from __future__ import annotations

import os
import shutil
from pyxis_hook.record import replace
from pathlib import Path

import pytest

from fixtures import hosttree, realdriver
from pyxis_hook.spec.config import Config
from pyxis_hook.host.inventory import Inventory
from pyxis_hook.host.discovery import discover

pytestmark = [pytest.mark.realdriver, pytest.mark.slow]

LINES = ("535", "470", "550")


def config_for(root: Path, tmp_path: Path, host=None) -> Config:
    return replace(Config(), driver_root=str(root),
                   proc_root=str(host.proc_root) if host else str(tmp_path / "no-proc"),
                   dev_root=str(host.dev_root) if host else str(tmp_path / "no-dev"),
                   snapshot_dir=str(tmp_path / "snap"))


_cache: dict[tuple[str, str], Inventory] = {}


def inventory(line: str, layout: str, tmp_path: Path) -> Inventory:
    if (line, layout) not in _cache:
        root = realdriver.require_driver_root(line, layout)
        _cache[(line, layout)] = discover(config_for(root, tmp_path))
    return _cache[(line, layout)]


def logical(inv: Inventory) -> set[tuple[str, str, str]]:
    """What must not depend on the layout: kind, capability, SONAME (or file name) of each file."""
    return {(f.kind, f.capability, f.soname or f.name) for f in inv.files}


@pytest.mark.parametrize("line", LINES)
def test_same_logical_set_in_every_layout(line, tmp_path):
    sets = {layout: logical(inventory(line, layout, tmp_path)) for layout in realdriver.LAYOUTS}
    reference = sets["debian"]
    for layout, got in sets.items():
        assert got == reference, f"{line}/{layout} differs from debian: {got ^ reference}"
    version = realdriver.driver_version(line)
    for layout in realdriver.LAYOUTS:
        inv = inventory(line, layout, tmp_path)
        assert inv.driver_version == version and inv.version_source == "files"
        assert inv.usable, inv.errors
        assert all(f.name.endswith(f".so.{version}") for f in inv.files if f.kind == "lib")
        # every host path lies inside the tree and is a regular file (links resolved there)
        assert {f.elfclass for f in inv.files if f.kind == "lib32"} == {32}
        for f in inv.files:
            assert f.host_path.startswith(inv.driver_root + "/")
            assert os.path.isfile(f.host_path) and not os.path.islink(f.host_path)
    want = {("lib", "compute", "libcuda.so.1"), ("lib", "utility", "libnvidia-ml.so.1"),
            ("lib", "compute", "libnvidia-ptxjitcompiler.so.1"), ("lib", "video", "libnvcuvid.so.1"),
            ("lib", "video", "libnvidia-encode.so.1"), ("lib", "graphics", "libGLX_nvidia.so.0"),
            ("lib", "graphics", "libEGL_nvidia.so.0"), ("bin", "utility", "nvidia-smi"),
            ("lib32", "compute", "libcuda.so.1"), ("lib32", "utility", "libnvidia-ml.so.1")}
    assert want <= reference


@pytest.mark.parametrize("line", ["535", "550"])
def test_debian_layout_follows_alternatives_links(line, tmp_path):
    inv = inventory(line, "debian", tmp_path)
    v = realdriver.driver_version(line)
    cuda = next(f for f in inv.files if f.soname == "libcuda.so.1")
    assert cuda.path == f"/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.{v}"
    assert ("libcuda.so.1", f"libcuda.so.{v}") in cuda.links
    smi = next(f for f in inv.files if f.kind == "bin" and f.name == "nvidia-smi")
    assert smi.path == "/usr/lib/nvidia/current/nvidia-smi"


@pytest.mark.parametrize("line", LINES)
def test_prefix_layout_binaries_found_without_configuration(line, tmp_path):
    """/usr/local/nvidia, known only through ld.so.conf.d: the default `path` lacks its bin dir, yet
    nvidia-smi and the MPS binaries are found there, next to the libraries."""
    assert "/usr/local/nvidia/bin" not in Config().path
    inv = inventory(line, "prefix", tmp_path)
    bins = {f.name: f.path for f in inv.files if f.kind == "bin"}
    assert bins["nvidia-smi"] == "/usr/local/nvidia/bin/nvidia-smi"
    assert bins == {name: f"/usr/local/nvidia/bin/{name}" for name in bins}
    assert {f.name for f in inv.files if f.kind == "bin"} == \
        {f.name for f in inventory(line, "debian", tmp_path).files if f.kind == "bin"}


@pytest.mark.parametrize("line", LINES)
def test_glx_closure_and_libx11(line, tmp_path):
    """libGLX_nvidia needs libnvidia-glsi/-tls/-glcore (driver files) and libX11.so.6 (not one)."""
    version = realdriver.driver_version(line)
    for layout in realdriver.LAYOUTS:
        inv = inventory(line, layout, tmp_path)
        glx = next(f for f in inv.files if f.soname == "libGLX_nvidia.so.0")
        inner = {f"libnvidia-glsi.so.{version}", f"libnvidia-tls.so.{version}", f"libnvidia-glcore.so.{version}"}
        assert inner <= set(glx.needed)
        have = {f.name for f in inv.files if f.kind == "lib" and f.capability == "graphics"}
        assert inner <= have
        x11 = next(d for d in inv.non_driver_deps if d.name == "libX11.so.6")
        assert "libGLX_nvidia.so.0" in x11.needed_by and x11.host_path is None
        assert not any(f.name.startswith("libX11") for f in inv.files)
        enc = next(f for f in inv.files if f.soname == "libnvidia-encode.so.1")
        assert "libnvcuvid.so.1" in enc.needed


def test_gsp_firmware_and_icd_files(tmp_path):
    inv = inventory("535", "rhel", tmp_path)
    fw = sorted(f.path for f in inv.files if f.kind == "firmware")
    assert fw == ["/lib/firmware/nvidia/535.309.01/gsp_ga10x.bin", "/lib/firmware/nvidia/535.309.01/gsp_tu10x.bin"]
    icd = {f.path for f in inv.files if f.kind == "icd"}
    assert {"/usr/share/glvnd/egl_vendor.d/10_nvidia.json", "/usr/share/vulkan/icd.d/nvidia_icd.json",
            "/etc/OpenCL/vendors/nvidia.icd"} <= icd
    assert not any(f.inject for f in inv.files if f.kind == "icd")


@pytest.mark.parametrize("layout, listed_under", [
    ("debian", "/lib/firmware"),       # merged-/usr trixie host: /lib -> usr/lib
    ("rhel", "/lib/firmware"),         # merged-/usr too
    ("installer", "/usr/lib/firmware"),  # the packaged location, no /lib link
    ("prefix", "/usr/lib/firmware"),
])
def test_550_gsp_firmware_from_merged_usr_packages(layout, listed_under, tmp_path):
    """trixie ships the GSP firmware in /usr/lib/firmware/nvidia/<ver>: found with or without /lib -> usr/lib."""
    version = realdriver.driver_version("550")
    inv = inventory("550", layout, tmp_path)
    fw = sorted((f.path, f.host_path) for f in inv.files if f.kind == "firmware")
    real = f"{inv.driver_root}/usr/lib/firmware/nvidia/{version}"
    assert fw == [(f"{listed_under}/nvidia/{version}/gsp_{chip}.bin", f"{real}/gsp_{chip}.bin")
                  for chip in ("ga10x", "tu10x")]
    assert not any("no GSP firmware" in w for w in inv.warnings)


@pytest.mark.parametrize("layout", realdriver.LAYOUTS)
def test_550_libnvidia_gpucomp_serves_graphics_and_compute(layout, tmp_path):
    """550's new DT_NEEDED chain: libnvidia-glcore/-eglcore (graphics) -> libnvidia-gpucomp (a compute-list library)."""
    version = realdriver.driver_version("550")
    inv = inventory("550", layout, tmp_path)
    gpucomp = f"libnvidia-gpucomp.so.{version}"
    for core in ("libnvidia-glcore.so", "libnvidia-eglcore.so"):
        lib = next(f for f in inv.files if f.kind == "lib" and f.name == f"{core}.{version}")
        assert gpucomp in lib.needed
    recs = [f for f in inv.files if f.kind == "lib" and f.name == gpucomp]
    assert {f.capability for f in recs} == {"compute", "graphics"}
    assert len({f.host_path for f in recs}) == 1 and recs[0].soname == gpucomp
    assert gpucomp in {f.name for f in inv.select(["graphics"])}
    assert gpucomp in {f.name for f in inv.select(["compute"])}
    assert not any(f.name == gpucomp for f in inv.select(["utility", "video"]))


@pytest.mark.parametrize("line", LINES)
def test_cuda_version_of_each_line(line, tmp_path):
    """cuDriverGetVersion of the real libcuda: 535 = CUDA 12.2, 470 = 11.4, 550 = 12.4."""
    for layout in ("installer", "debian"):
        assert inventory(line, layout, tmp_path).cuda_version == realdriver.CUDA_VERSION[line]


def _mixed_tree(tmp_path: Path) -> Path:
    """The 535 installer tree plus leftovers of 470, re-cached by ldconfig.

    The 470 libcuda/libnvidia-ml sit in their own directory (listed in
    ld.so.conf.d, as a second flavor would be), so the cache holds two
    libcuda.so.1 entries; 470's libnvidia-glcore/-tls, whose SONAMEs carry the
    full version, sit in the same flat directory as 535's.
    """
    src535 = realdriver.require_driver_root("535", "installer")
    src470 = realdriver.require_driver_root("470", "installer")
    root = tmp_path / "mixed"
    shutil.copytree(src535, root, symlinks=True, copy_function=os.link)
    lib = "usr/lib/x86_64-linux-gnu"
    v470 = realdriver.driver_version("470")
    (root / "usr/lib/nvidia-470").mkdir(parents=True)
    for stem in ("libcuda.so", "libnvidia-ml.so"):
        os.link(src470 / lib / f"{stem}.{v470}", root / "usr/lib/nvidia-470" / f"{stem}.{v470}")
    for stem in ("libnvidia-glcore.so", "libnvidia-tls.so"):
        os.link(src470 / lib / f"{stem}.{v470}", root / lib / f"{stem}.{v470}")
    (root / "etc/ld.so.conf.d/nvidia-470.conf").write_text("/usr/lib/nvidia-470\n")
    (root / "etc/ld.so.cache").unlink()
    realdriver.run_ldconfig(root)
    return root


def _loader_choice(root: Path, soname: str) -> str:
    """The file glibc's loader would open for `soname`: first `ldconfig -p` line for it, resolved."""
    import subprocess

    out = subprocess.run([realdriver.ldconfig_binary(), "-p", "-C", str(root / "etc/ld.so.cache")],
                         capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if x.strip().startswith(soname + " "))
    return os.path.basename(os.path.realpath(root / line.split("=> ")[1].lstrip("/")))


def test_leftover_other_version_is_skipped_with_kernel_module(tmp_path):
    root = _mixed_tree(tmp_path)
    v535, v470 = realdriver.driver_version("535"), realdriver.driver_version("470")
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=v535, make_nodes=False)
    inv = discover(config_for(root, tmp_path, host))
    assert inv.driver_version == v535 and inv.version_source == "procfs"
    assert not any(v470 in f.name for f in inv.files)
    assert v470 in inv.other_versions
    assert any(f"libnvidia-glcore.so.{v470}: skipping: not driver version {v535}" in w for w in inv.warnings)
    assert logical(inv) == logical(inventory("535", "installer", tmp_path))


def test_two_versions_without_kernel_module_follow_libcuda_so_1(tmp_path):
    root = _mixed_tree(tmp_path)
    inv = discover(config_for(root, tmp_path))
    assert _loader_choice(root, "libcuda.so.1").endswith(inv.driver_version)
    assert all(f.name.endswith(inv.driver_version) for f in inv.files if f.kind == "lib")
    assert any("several driver versions" in w for w in inv.warnings)


def test_download_failure_fails_in_ci_and_skips_elsewhere(monkeypatch):
    def broken(line):
        raise realdriver.DownloadError("apt-get update failed (100): no network")

    monkeypatch.setattr(realdriver, "extract", broken)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="unavailable in CI"):
        realdriver.require_driver_root("535", "debian")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        realdriver.require_driver_root("535", "debian")


@pytest.mark.parametrize("line", LINES)
def test_dpkg_x_tree_without_ld_so_cache_is_indexed_by_scanning(line, tmp_path):
    """`dpkg -x` of the packages, ldconfig never run, no alternatives links: the same libraries are found."""
    tree = realdriver.extract(line)
    assert not (tree / "etc/ld.so.cache").exists()
    inv = discover(config_for(tree, tmp_path))
    assert logical(inv) == logical(inventory(line, "debian", tmp_path))  # nvidia-smi: /usr/lib/nvidia/<flavour>
    assert inv.driver_version == realdriver.driver_version(line)
    assert any("indexed the driver libraries by scanning" in w for w in inv.warnings)
    cuda = next(f for f in inv.files if f.kind == "lib" and f.soname == "libcuda.so.1")
    assert "/nvidia/" in cuda.path  # found in Debian's nvidia/<flavour> dir, no alternatives link needed


def test_scanned_tree_snapshot_goes_stale_when_a_library_is_added(tmp_path):
    """The scanned directories are stat-signed: a new file there rebuilds the snapshot."""
    from fixtures.fakedriver import make_fake_driver
    from pyxis_hook.host import artifact

    root = make_fake_driver(tmp_path / "drv", version="535.216.03")
    (root / "etc/ld.so.cache").unlink()
    cfg = config_for(root, tmp_path)
    inv = artifact.load_or_build(cfg, strict=False)
    assert inv.usable and artifact.load(cfg).driver_version == "535.216.03"
    (root / "usr/lib/x86_64-linux-gnu/libnvidia-extra.so.535.216.03").write_bytes(b"\x7fELF")
    with pytest.raises(Exception, match="stale"):
        artifact.load(cfg)


def test_stale_host_cache_without_driver_entries_is_completed_by_scanning(tmp_path):
    """ldconfig ran before the driver was unpacked: the cache lists no driver library; scanning adds them."""
    tree = tmp_path / "root"
    shutil.copytree(realdriver.extract("535"), tree, symlinks=True)
    (tree / "etc").mkdir(exist_ok=True)
    (tree / "usr/lib/x86_64-linux-gnu/libfoo.so.1").write_bytes(b"")  # any cache; no driver entry in it
    realdriver.run_ldconfig(tree)  # indexes usr/lib/x86_64-linux-gnu, not nvidia/current
    from pyxis_hook.loader import ldcache

    cache = ldcache.read_cache(str(tree / "etc/ld.so.cache"))
    assert not any(e.key.startswith("libcuda.so") for e in cache.entries)
    inv = discover(config_for(tree, tmp_path))
    assert any(f.soname == "libcuda.so.1" for f in inv.files)
    assert any("lists no NVIDIA driver library" in w for w in inv.warnings)


def test_scan_survives_a_looping_soname_link(tmp_path):
    """A symlink loop in an uncached driver root: indexed anyway (info/list print what they find)."""
    from fixtures.fakedriver import make_fake_driver

    root = make_fake_driver(tmp_path / "drv", version="535.216.03")
    (root / "etc/ld.so.cache").unlink()
    lib = root / "usr/lib/x86_64-linux-gnu"
    (lib / "libcuda.so.1").unlink()
    (lib / "libcuda.so.1").symlink_to("libcuda.so.1")  # loops
    inv = discover(config_for(root, tmp_path))
    assert any(f.soname == "libcuda.so.1" and f.host_path.endswith("libcuda.so.535.216.03") for f in inv.files)


def test_libscan_index_equals_glibc_ldconfig_over_the_same_dirs(tmp_path):
    """Oracle: our scan of an uncached driver tree gives the entries glibc's ldconfig writes for the same dirs."""
    from pyxis_hook.loader import ldcache
    from pyxis_hook.host.libscan import candidate_dirs, driver_name, scan_root

    tree = tmp_path / "root"
    shutil.copytree(realdriver.extract("535"), tree, symlinks=True)
    # a non-PIE executable named like a library: ldconfig skips it (ET_EXEC, not ET_DYN), so must we
    import subprocess

    src = tmp_path / "main.c"
    src.write_text("int main(void) { return 0; }\n")
    subprocess.run(["gcc", "-no-pie", str(src), "-o", str(tree / "usr/lib/x86_64-linux-gnu/libnvidia-notalib.so.1")],
                   check=True)
    ours, _ = scan_root(str(tree))
    dirs = candidate_dirs(str(tree))
    (tree / "etc").mkdir(exist_ok=True)
    (tree / "etc/ld.so.conf").write_text("".join(f"{d}\n" for d in dirs))
    realdriver.run_ldconfig(tree)
    theirs = ldcache.read_cache(str(tree / "etc/ld.so.cache"))

    def rows(entries):
        return sorted((e.key, e.value, e.flags) for e in entries if driver_name(e.key) and not e.key.endswith(".so"))

    assert rows(ours.entries) == rows(theirs.entries)
    assert rows(ours.entries)  # not vacuous
    assert not any(e.key.startswith("libnvidia-notalib") for e in ours.entries)
