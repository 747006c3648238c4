"""Driver inventory and its snapshot, on synthetic driver roots (gcc-built libs, glibc's ldconfig).

What the real packages lack is made here: broken symlinks, wrong-class
files, a truncated ELF, two driver versions side by side, libnvidia-tls with
and without its ABI note, 32-bit libraries, a missing cache.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pyxis_hook.record import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures import hosttree
from fixtures.realdriver import run_ldconfig
from fixtures.synth import build_lib
from fixtures.synthdriver import LIB, OLD, V, make_driver
from pyxis_hook.host import artifact
from pyxis_hook.spec.config import Config
from pyxis_hook.errors import DriverError, ArtifactError
from pyxis_hook.host.inventory import DriverFile, Inventory
from pyxis_hook.host.discovery import discover
from pyxis_hook.host.artifact import load_or_build
from schema_check import validate


def cfg(root: Path, host=None, **kw) -> Config:
    proc = str(host.proc_root) if host else str(root / "no-proc")
    dev = str(host.dev_root) if host else str(root / "no-dev")
    return replace(Config(), driver_root=str(root), proc_root=proc, dev_root=dev,
                   snapshot_dir=str(root.parent / "snap"), **kw)


def names(inv: Inventory, kind: str = "lib") -> dict[str, str]:
    return {f.name: f.capability for f in inv.files if f.kind == kind}


def test_basic_inventory_with_procfs(tmp_path):
    root = make_driver(tmp_path / "root")
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    inv = discover(cfg(root, host))
    assert inv.driver_version == V and inv.version_source == "procfs"
    libs = names(inv)
    assert libs[f"libcuda.so.{V}"] == "compute"
    assert libs[f"libnvidia-ml.so.{V}"] == "utility"
    assert libs[f"libnvcuvid.so.{V}"] == "video"
    assert libs[f"libGLX_nvidia.so.{V}"] == "graphics"
    cuda = next(f for f in inv.files if f.name == f"libcuda.so.{V}")
    assert cuda.soname == "libcuda.so.1" and cuda.elfclass == 64
    assert ("libcuda.so.1", f"libcuda.so.{V}") in cuda.links
    assert ("libcuda.so", "libcuda.so.1") in cuda.links
    assert cuda.path == f"/{LIB}/libcuda.so.{V}" and cuda.host_path == str(root / LIB / f"libcuda.so.{V}")
    glx = next(f for f in inv.files if f.name == f"libGLX_nvidia.so.{V}")
    assert ("libGLX_indirect.so.0", f"libGLX_nvidia.so.{V}") in glx.links
    assert names(inv, "bin") == {"nvidia-smi": "utility", "nvidia-cuda-mps-control": "compute"}
    assert names(inv, "firmware") == {"gsp_ga10x.bin": "utility"}
    assert [f.inject for f in inv.files if f.kind == "icd"] == [False]
    assert len(inv.host.gpus) == 2
    assert "utility: libnvidia-cfg.so" in inv.missing


def test_version_inferred_from_file_names_without_kernel_module(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    inv = discover(cfg(root))
    assert inv.driver_version == V and inv.version_source == "files"
    assert any("kernel module is not loaded" in w for w in inv.warnings)


def test_dt_needed_closure_and_non_driver_deps(tmp_path):
    inv = discover(cfg(make_driver(tmp_path / "root")))
    internal = next(f for f in inv.files if f.name == f"libnvidia-internal.so.{V}")
    assert internal.capability == "compute" and internal.source == "needed-by:libcuda.so.1"
    dep = next(d for d in inv.non_driver_deps if d.name == "libX11.so.6")
    assert dep.needed_by == ("libGLX_nvidia.so.0",) and dep.capability == "graphics" and dep.host_path is None
    assert not any(f.name.startswith("libX11") for f in inv.files)


def test_leftover_library_of_another_version_is_skipped(tmp_path):
    root = make_driver(tmp_path / "root", ldconfig=False)
    build_lib(root / LIB, "libnvidia-cfg.so.1", filename=f"libnvidia-cfg.so.{OLD}")
    run_ldconfig(root)
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    inv = discover(cfg(root, host))
    assert f"libnvidia-cfg.so.{OLD}" not in names(inv)
    assert any(f"libnvidia-cfg.so.{OLD}: skipping: not driver version {V}" in w for w in inv.warnings)
    assert OLD in inv.other_versions


def test_two_versions_side_by_side_pick_the_kernel_module(tmp_path):
    root = make_driver(tmp_path / "root", extra=False, ldconfig=False)
    make_driver(root, OLD, libdir="usr/lib/nvidia-old", extra=False, ldconfig=False)
    run_ldconfig(root)
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=OLD, make_nodes=False)
    inv = discover(cfg(root, host))
    assert inv.driver_version == OLD
    assert all(f.name.endswith(OLD) for f in inv.files if f.kind == "lib")
    assert f"libcuda.so.{OLD}" in names(inv)
    assert V in inv.other_versions
    assert any("also installed" in w and V in w for w in inv.warnings)
    # without a kernel module: the version libcuda.so.1 leads to, with a warning
    inv2 = discover(cfg(root))
    cache_target = subprocess.run(["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")],
                                  capture_output=True, text=True).stdout
    line = next(x for x in cache_target.splitlines() if x.strip().startswith("libcuda.so.1 "))
    linked = os.path.realpath(root / line.split("=> ")[1].lstrip("/"))
    assert linked.endswith(inv2.driver_version)
    assert any("several driver versions" in w for w in inv2.warnings)


def test_broken_symlink_in_cache_is_a_warning(tmp_path):
    root = make_driver(tmp_path / "root", extra=False, ldconfig=False)
    build_lib(root / LIB, "libnvidia-cfg.so.1", filename=f"libnvidia-cfg.so.{V}")
    run_ldconfig(root)
    (root / LIB / f"libnvidia-cfg.so.{V}").unlink()  # libnvidia-cfg.so.1 now dangles
    inv = discover(cfg(root))
    assert any("broken symbolic link" in w and "libnvidia-cfg.so.1" in w for w in inv.warnings)
    assert f"libcuda.so.{V}" in names(inv)


def test_wrong_class_file_is_skipped(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    target = root / LIB / f"libnvidia-ptxjitcompiler.so.{V}"
    m32 = build_lib(tmp_path / "m32", "libnvidia-ptxjitcompiler.so.1", m32=True)
    target.write_bytes(m32.read_bytes())
    inv = discover(cfg(root))
    assert f"libnvidia-ptxjitcompiler.so.{V}" not in names(inv)
    assert any(str(target) in w and "ELF class 32-bit, expected 64-bit" in w for w in inv.warnings)


def test_truncated_elf_is_a_warning_naming_the_file(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    target = root / LIB / f"libnvidia-ptxjitcompiler.so.{V}"
    target.write_bytes(target.read_bytes()[:200])
    inv = discover(cfg(root))
    assert f"libnvidia-ptxjitcompiler.so.{V}" not in names(inv)
    assert any(w.startswith(str(target)) and "skipping" in w for w in inv.warnings)
    assert inv.usable


def test_tls_without_abi_note_is_a_hard_error(tmp_path):
    root = make_driver(tmp_path / "root", tls_note=False)
    with pytest.raises(DriverError, match="libnvidia-tls.so.*ABI note"):
        discover(cfg(root))
    inv = discover(cfg(root), strict=False)
    assert not inv.usable and f"libnvidia-tls.so.{V}" not in names(inv)
    ok = discover(cfg(make_driver(tmp_path / "ok")))
    assert names(ok)[f"libnvidia-tls.so.{V}"] == "graphics"


def test_compat32_libraries(tmp_path):
    root = make_driver(tmp_path / "root", extra=False, ldconfig=False)
    build_lib(root / "usr/lib/i386-linux-gnu", "libcuda.so.1", filename=f"libcuda.so.{V}", m32=True)
    run_ldconfig(root)
    inv = discover(cfg(root))
    lib32 = [f for f in inv.files if f.kind == "lib32"]
    assert [(f.name, f.capability, f.elfclass) for f in lib32] == [(f"libcuda.so.{V}", "compute", 32)]
    assert not any(f.kind == "lib32" for f in inv.select(("compute",)))
    assert [f.name for f in inv.select(("compute",)) if f.kind == "firmware"] == ["gsp_ga10x.bin"]
    assert not inv.select(())
    assert any(f.kind == "lib32" for f in inv.select(("compute", "compat32")))


def test_no_driver_is_one_clear_error(tmp_path):
    root = tmp_path / "empty"
    (root / "etc").mkdir(parents=True)
    with pytest.raises(DriverError) as e:
        discover(cfg(root))
    msg = str(e.value)
    assert "\n" not in msg and str(root / "etc/ld.so.cache") in msg
    inv = discover(cfg(root), strict=False)
    assert inv.driver_version is None and not inv.files and inv.errors


def test_corrupt_cache_names_the_file(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    (root / "etc/ld.so.cache").write_bytes(b"glibc-ld.so.cache1.1garbage")
    with pytest.raises(DriverError, match=str(root / "etc/ld.so.cache")):
        discover(cfg(root))


def test_half_installed_driver(tmp_path):
    """The kernel module says V, the cache only holds other versions: unusable, one line."""
    root = make_driver(tmp_path / "root", OLD, extra=False)
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    with pytest.raises(DriverError, match=f"no driver library of version {V}"):
        discover(cfg(root, host))


def test_ipc_sockets_and_mps_dir(tmp_path):
    root = make_driver(tmp_path / "r", extra=False)
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    (root / "var").mkdir(exist_ok=True)
    os.symlink("/run", root / "var/run")  # resolved inside the root
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "run/nvidia-persistenced/socket"))
    (root / "tmp/nvidia-mps").mkdir(parents=True)
    try:
        inv = discover(cfg(root))
    finally:
        s.close()
    ipc = {(f.path, f.capability) for f in inv.files if f.kind == "ipc"}
    assert ipc == {("/run/nvidia-persistenced/socket", "utility"), ("/tmp/nvidia-mps", "compute"),
                   ("/tmp/nvidia-mps", "video")}


def test_icd_files_injected_only_when_configured(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    inv = discover(cfg(root, graphics_config_files=True))
    icd = [f for f in inv.files if f.kind == "icd"]
    assert [(f.path, f.inject) for f in icd] == [("/usr/share/vulkan/icd.d/nvidia_icd.json", True)]
    assert icd[0] in inv.select(("graphics",))


def test_to_dict_round_trip_and_schema(tmp_path):
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    inv = discover(cfg(make_driver(tmp_path / "root"), host))
    d = json.loads(json.dumps(inv.to_dict()))
    validate(d, "inventory.schema.json")
    assert Inventory.from_dict(d) == inv


def test_from_dict_with_fresh_gpus_is_with_host_of_the_saved_one(tmp_path):
    """A snapshot load passes the GPU facts it just read: the saved GPUs are skipped, not merged."""
    from pyxis_hook.host.gpuscan import discover_gpus
    from pyxis_hook.host.inventory import with_host

    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    inv = discover(cfg(make_driver(tmp_path / "root"), host))
    inv = replace(inv, warnings=tuple(inv.warnings) + ("driver: a warning of its own",))
    assert inv.host.warnings  # the saved host's own warnings (no nodes): not carried over
    fresh = discover_gpus(str(host.proc_root), "/nonexistent-dev")
    fresh = replace(fresh, gpus=fresh.gpus[:1], warnings=("fresh: one GPU left",))
    d = json.loads(json.dumps(inv.to_dict()))
    got = Inventory.from_dict(d, fresh)
    assert got == with_host(Inventory.from_dict(d), fresh)
    assert got.host is fresh and got.warnings == ("fresh: one GPU left", "driver: a warning of its own")


# --- snapshot -----------------------------------------------------------------------------


def test_a_snapshot_rebuild_turns_the_gc_back_on_and_a_load_does_not(tmp_path):
    """prestart turns the cyclic GC off for a start; a rebuild (pyelftools over the driver) runs with it on."""
    import gc

    c = cfg(make_driver(tmp_path / "root"))
    try:
        gc.disable()
        load_or_build(c)  # no snapshot yet: built
        assert gc.isenabled()
        gc.disable()
        load_or_build(c)  # the snapshot is valid: loaded
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_snapshot_saved_atomically_with_modes_and_reused(tmp_path):
    root = make_driver(tmp_path / "root")
    c = cfg(root)
    inv = load_or_build(c)
    path = Path(artifact.artifact_path(c))
    assert path.is_file()
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)
    assert oct(path.parent.stat().st_mode & 0o777) == oct(0o755)
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert artifact.load(c) == inv
    assert load_or_build(c) == inv


def test_a_start_waits_for_the_one_building_the_snapshot_and_loads_it(tmp_path, monkeypatch):
    """A herd on a fresh node: the start that finds the build lock held waits, then loads what the
    holder saved, instead of running discovery itself."""
    import fcntl
    import threading

    from pyxis_hook.host import discovery

    root = make_driver(tmp_path / "root")
    c = cfg(root)
    built = discover(c)
    os.makedirs(c.snapshot_dir, mode=0o755, exist_ok=True)
    held = os.open(artifact.lock_path(c), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)

    def holder_finishes():
        artifact.save(c, built)
        os.close(held)  # releases the lock

    calls = []
    monkeypatch.setattr(discovery, "discover", lambda *a, **k: calls.append(1) or built)
    timer = threading.Timer(0.3, holder_finishes)
    timer.start()
    try:
        inv = load_or_build(c)
    finally:
        timer.join()
    assert calls == [] and inv.files == built.files
    assert sorted(p.name for p in Path(c.snapshot_dir).iterdir() if not p.name.startswith(".")) == \
        [os.path.basename(artifact.artifact_path(c))]


def test_a_lock_held_too_long_does_not_stop_the_start(tmp_path, monkeypatch):
    import fcntl

    root = make_driver(tmp_path / "root")
    c = cfg(root)
    os.makedirs(c.snapshot_dir, mode=0o755, exist_ok=True)
    held = os.open(artifact.lock_path(c), os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    monkeypatch.setattr(artifact, "BUILD_WAIT_S", 0.1)
    try:
        inv = load_or_build(c)  # builds without the lock
    finally:
        os.close(held)
    assert inv.usable and artifact.load(c) == inv


def test_snapshot_stale_when_a_library_changes(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    c = cfg(root)
    load_or_build(c)
    lib = root / LIB / f"libnvidia-ptxjitcompiler.so.{V}"
    lib.write_bytes(lib.read_bytes()[:300])  # size and mtime change
    with pytest.raises(Exception, match="stale"):
        artifact.load(c)
    inv = load_or_build(c)
    assert f"libnvidia-ptxjitcompiler.so.{V}" not in names(inv)


def test_snapshot_stale_when_kernel_module_changes(tmp_path):
    root = make_driver(tmp_path / "root", extra=False, ldconfig=False)
    make_driver(root, OLD, libdir="usr/lib/nvidia-old", extra=False, ldconfig=False)
    run_ldconfig(root)
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    c = cfg(root, host)
    assert load_or_build(c).driver_version == V
    hosttree.make_host_tree(tmp_path / "host", driver_version=OLD, make_nodes=False)
    with pytest.raises(Exception, match="stale"):
        artifact.load(c)
    assert load_or_build(c).driver_version == OLD


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"format": 1}', b"[1, 2]",
                                     b'{"format": 1, "key": null, "inventory": {}}'])
def test_corrupt_snapshot_is_rebuilt(tmp_path, content):
    root = make_driver(tmp_path / "root", extra=False)
    c = cfg(root)
    good = load_or_build(c)
    path = Path(artifact.artifact_path(c))
    path.write_bytes(content)
    with pytest.raises(ArtifactError):
        artifact.load(c)
    assert load_or_build(c) == good
    assert artifact.load(c) == good


def test_snapshot_for_other_config_or_world_writable_not_trusted(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    c = cfg(root)
    load_or_build(c)
    path = Path(artifact.artifact_path(c))
    os.chmod(path, 0o666)
    with pytest.raises(Exception, match="writable"):
        artifact.load(c)
    os.chmod(path, 0o644)
    assert artifact.load(c).usable
    os.chmod(path.parent, 0o777)
    with pytest.raises(Exception, match="writable by group or others"):
        artifact.load(c)
    os.chmod(path.parent, 0o755)
    other = replace(c, mps_pipe_dir="/elsewhere")
    assert artifact.artifact_path(other) != str(path)
    with pytest.raises(ArtifactError):
        artifact.load(other)


def test_driver_root_link_flipped_keeps_each_inventory_on_one_tree(tmp_path):
    """A driver root that is a link swapped to another driver (an upgrade by a link flip): an
    inventory taken before the flip still names the files of the tree it was taken from (what the
    hook opens later is one driver, never the old version's names over the new one's files), and
    the snapshot taken then is stale after the flip, so the next start takes the new tree."""
    old = make_driver(tmp_path / "old", OLD, extra=False)
    new = make_driver(tmp_path / "new", V, extra=False)
    link = tmp_path / "driver"
    link.symlink_to(old)
    c = cfg(link)
    inv = load_or_build(c)
    assert inv.driver_version == OLD
    flipped = tmp_path / "driver.new"
    flipped.symlink_to(new)
    flipped.rename(link)
    for f in inv.files:
        if f.kind in ("lib", "bin"):
            assert os.stat(f.host_path).st_ino == os.stat(old / f.path.lstrip("/")).st_ino, f
    with pytest.raises(ArtifactError, match="stale"):
        artifact.load(c)
    again = load_or_build(c)
    assert again.driver_version == V
    assert {f.host_path for f in again.files if f.kind == "lib"} == \
        {str(new / f.path.lstrip("/")) for f in again.files if f.kind == "lib"}
    assert artifact.load(c) == again


def test_snapshot_save_failure_is_a_warning(tmp_path, capsys):
    root = make_driver(tmp_path / "root", extra=False)
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = replace(cfg(root), snapshot_dir=str(blocker / "snap"))
    inv = load_or_build(c)
    assert inv.usable
    assert "cannot save the node artifact" in capsys.readouterr().err


def test_snapshot_load_imports_neither_pyelftools_nor_jsonschema(tmp_path):
    root = make_driver(tmp_path / "root", extra=False)
    c = cfg(root)
    load_or_build(c)
    code = f"""
import sys
from pyxis_hook.record import replace
from pyxis_hook.spec.config import Config
from pyxis_hook.host import artifact
c = replace(Config(), driver_root={str(root)!r}, proc_root={c.proc_root!r}, dev_root={c.dev_root!r},
            snapshot_dir={c.snapshot_dir!r})
inv = artifact.load_or_build(c)
assert inv.driver_version == {V!r}
bad = sorted(m for m in sys.modules if m.split('.')[0] in ('elftools', 'jsonschema') or m == 'pyxis_hook.loader.elf')
print(bad)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_snapshot_load_takes_the_gpus_as_they_are_now(tmp_path):
    """A GPU gone since the snapshot was built (reset, unbound) is not in the loaded inventory."""
    import shutil

    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    c = cfg(make_driver(tmp_path / "root"), host)
    built = load_or_build(c)
    assert len(built.host.gpus) == 2
    gpus_dir = Path(host.proc_root) / "driver/nvidia/gpus"
    shutil.rmtree(gpus_dir / sorted(os.listdir(gpus_dir))[1])
    loaded = artifact.load(c)
    assert [g.bus_id for g in loaded.host.gpus] == [built.host.gpus[0].bus_id]
    assert loaded.files == built.files


def test_snapshot_rechecks_ipc_sockets_on_load(tmp_path):
    """A daemon started after the snapshot was built still gets its socket injected."""
    root = make_driver(tmp_path / "r", extra=False)
    c = cfg(root)
    load_or_build(c)
    (root / "run/nvidia-persistenced").mkdir(parents=True)
    (root / "var").mkdir(exist_ok=True)
    os.symlink("/run", root / "var/run")
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(root / "run/nvidia-persistenced/socket"))
    try:
        inv = artifact.load(c)
    finally:
        s.close()
    assert [f.path for f in inv.files if f.kind == "ipc"] == ["/run/nvidia-persistenced/socket"]


_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789._-", min_size=1, max_size=20)


@given(st.lists(st.builds(
    DriverFile,
    kind=st.sampled_from(("lib", "lib32", "bin", "firmware", "ipc", "icd")),
    capability=st.sampled_from(("compute", "utility", "graphics", "video", "ngx")),
    path=_name.map(lambda n: "/usr/lib/" + n), host_path=_name.map(lambda n: "/host/usr/lib/" + n),
    name=_name, soname=st.none() | _name, elfclass=st.sampled_from((None, 32, 64)),
    links=st.lists(st.tuples(_name, _name), max_size=3).map(tuple), source=_name,
    needed=st.lists(_name, max_size=3).map(tuple), inject=st.booleans()), max_size=5))
def test_inventory_dict_round_trip_property(files):
    """Whatever files discovery records survive the snapshot's JSON round trip unchanged."""
    from pyxis_hook.host.gpuscan import discover_gpus

    host = discover_gpus("/nonexistent-proc", "/nonexistent-dev")
    inv = Inventory(driver_version=V, cuda_version=12020, host=host, files=tuple(files),
                    sources=(("/x", 1, 2, 3, 4),))
    assert Inventory.from_dict(json.loads(json.dumps(inv.to_dict()))) == inv


def test_untrusted_snapshot_dir_is_not_written_and_says_so(tmp_path, capsys):
    """A dir load would refuse: save refuses too, with a warning, instead of a silent rebuild every start."""
    from pyxis_hook import log
    from pyxis_hook.errors import ArtifactError

    root = make_driver(tmp_path / "root", extra=False)
    c = cfg(root)
    os.makedirs(c.snapshot_dir, exist_ok=True)
    os.chmod(c.snapshot_dir, 0o777)
    with pytest.raises(ArtifactError, match="writable by group or others"):
        artifact.save(c, discover(c))
    log.configure(stderr_level="warning")
    assert load_or_build(c).usable
    assert "writable by group or others" in capsys.readouterr().err
    assert not list(Path(c.snapshot_dir).glob("inventory-*.json"))


def test_icd_and_firmware_links_resolved_inside_the_root(tmp_path):
    """An ICD file that is a link (Debian's alternatives) keeps its listed path in the container; its source
    is resolved inside the driver root, and a link aimed at a host file never reaches the host file."""
    root = make_driver(tmp_path / "root", extra=False)
    (root / "usr/share/vulkan/icd.d/nvidia_icd.json").unlink()
    outside = tmp_path / "host-secret.json"
    outside.write_text('{"host": true}\n')
    (root / "usr/share/nvidia").mkdir(parents=True)
    (root / "usr/share/nvidia/icd.json").write_text("{}\n")
    vk = root / "etc/vulkan/icd.d"
    vk.mkdir(parents=True)
    (vk / "nvidia_icd.json").symlink_to("/usr/share/nvidia/icd.json")  # absolute: inside the root
    egl = root / "usr/share/egl/egl_external_platform.d"
    egl.mkdir(parents=True)
    (egl / "15_nvidia_gbm.json").symlink_to(outside)  # a host path: must resolve inside the root (missing)
    fw = root / f"lib/firmware/nvidia/{V}"
    (fw / "gsp_ga10x.bin").unlink()
    (root / "blob.bin").write_bytes(b"\0")
    (fw / "gsp_ga10x.bin").symlink_to("/blob.bin")
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    inv = discover(replace(cfg(root, host), graphics_config_files=True))
    icd = {f.path: f.host_path for f in inv.files if f.kind == "icd"}
    assert icd == {"/etc/vulkan/icd.d/nvidia_icd.json": str(root / "usr/share/nvidia/icd.json")}
    fwf = [f for f in inv.files if f.kind == "firmware"]
    assert [(f.path, f.host_path) for f in fwf] == [(f"/lib/firmware/nvidia/{V}/gsp_ga10x.bin", str(root / "blob.bin"))]


def test_a_snapshot_written_by_an_older_discovery_is_rebuilt(tmp_path):
    """Same driver files, same config, older FORMAT: after an upgrade the old result is not trusted
    (format 1 lacked the per-capability closure, e.g. libnvidia-gpucomp for graphics on 550)."""
    import json as json_mod

    root = make_driver(tmp_path / "root", extra=False)
    c = cfg(root)
    good = load_or_build(c)
    path = Path(artifact.artifact_path(c))
    doc = json_mod.loads(path.read_bytes())
    assert doc["format"] == artifact.FORMAT
    doc["format"] = artifact.FORMAT - 1
    doc["inventory"]["files"] = []  # what an older discovery might have found: must not be used
    path.write_text(json_mod.dumps(doc))
    with pytest.raises(Exception, match=f"format {artifact.FORMAT - 1}, expected {artifact.FORMAT}"):
        artifact.load(c)
    assert load_or_build(c) == good


def test_deps_for_reports_a_shared_librarys_dependency_once_to_either_capability():
    from pyxis_hook.host.inventory import Inventory, NonDriverDep

    inv = Inventory(driver_version=V, cuda_version=None, host=None, files=(), non_driver_deps=(
        NonDriverDep("libzstd.so.1", ("libnvidia-gpucomp.so.550.1",), "compute", 64),
        NonDriverDep("libzstd.so.1", ("libnvidia-gpucomp.so.550.1",), "graphics", 64),
        NonDriverDep("libX11.so.6", ("libGLX_nvidia.so.0",), "graphics", 64)))
    assert [d.name for d in inv.deps_for(("compute",))] == ["libzstd.so.1"]
    assert [d.name for d in inv.deps_for(("graphics",))] == ["libzstd.so.1", "libX11.so.6"]
    assert [d.name for d in inv.deps_for(("compute", "graphics"))] == ["libzstd.so.1", "libX11.so.6"]
    assert inv.deps_for(("video",)) == ()


def test_binaries_of_a_prefix_install_found_next_to_its_libraries(tmp_path):
    """A driver under /opt/nvidia (libraries known only through ld.so.conf.d): with the default `path`
    its binaries are found in <prefix>/bin and <prefix>/sbin; only regular executables inside the root."""
    root = make_driver(tmp_path / "root", extra=False, libdir="opt/nvidia/lib64")
    for sub, name in (("bin", "nvidia-smi"), ("sbin", "nvidia-cuda-mps-control")):
        (root / "opt/nvidia" / sub).mkdir(parents=True, exist_ok=True)
        os.rename(root / "usr/bin" / name, root / "opt/nvidia" / sub / name)
    host_exe = tmp_path / "host-persistenced"
    host_exe.write_text("#!/bin/sh\n")
    host_exe.chmod(0o755)
    (root / "opt/nvidia/bin/nvidia-persistenced").symlink_to(host_exe)  # a host path: resolved inside the root
    (root / "opt/nvidia/bin/nvidia-debugdump").write_text("not executable\n")
    (root / "opt/nvidia/sbin/nv-fabricmanager").mkdir()
    inv = discover(cfg(root))
    assert Config().path == cfg(root).path  # nothing configured
    bins = {f.name: (f.capability, f.path, f.host_path, f.source) for f in inv.files if f.kind == "bin"}
    assert bins == {
        "nvidia-smi": ("utility", "/opt/nvidia/bin/nvidia-smi", str(root / "opt/nvidia/bin/nvidia-smi"),
                       "path:/opt/nvidia/bin"),
        "nvidia-cuda-mps-control": ("compute", "/opt/nvidia/sbin/nvidia-cuda-mps-control",
                                    str(root / "opt/nvidia/sbin/nvidia-cuda-mps-control"), "path:/opt/nvidia/sbin"),
    }


def test_a_binary_on_path_wins_over_the_library_prefix(tmp_path):
    """`path` and the vendor dirs come first; the prefix of the library dirs only adds where they find nothing."""
    root = make_driver(tmp_path / "root", extra=False, libdir="opt/nvidia/lib64")
    (root / "opt/nvidia/bin").mkdir(parents=True)
    for name in ("nvidia-smi", "nvidia-debugdump"):
        (root / "opt/nvidia/bin" / name).write_text("#!/bin/sh\nexit 9\n")
        (root / "opt/nvidia/bin" / name).chmod(0o755)
    bins = {f.name: f.path for f in discover(cfg(root)).files if f.kind == "bin"}
    assert bins == {"nvidia-smi": "/usr/bin/nvidia-smi", "nvidia-cuda-mps-control": "/usr/bin/nvidia-cuda-mps-control",
                    "nvidia-debugdump": "/opt/nvidia/bin/nvidia-debugdump"}


def test_the_snapshot_file_name_is_stable_and_differs_per_configuration():
    """The name is a digest of the key (the key itself is checked inside): the same across runs and
    Python versions, so an upgrade or a restart finds the snapshot it wrote; pinned here because a
    changed digest would leave every node's snapshot behind and rebuild it."""
    c = replace(Config(), driver_root="/", proc_root="/proc", dev_root="/dev", snapshot_dir="/var/cache/x",
                path=("/usr/bin",), mps_pipe_dir="/tmp/nvidia-mps")
    name = os.path.basename(artifact.artifact_path(c))
    raw = repr(sorted(artifact.config_key(c).items())).encode()
    assert name == f"inventory-{int.from_bytes(raw, 'big') % (2**32 - 5):08x}.json"
    code = ("from pyxis_hook.host import artifact; from pyxis_hook.spec.config import Config; "
            "from pyxis_hook.record import replace; "
            "print(artifact.artifact_path(replace(Config(), driver_root='/', proc_root='/proc', dev_root='/dev', "
            "snapshot_dir='/var/cache/x', path=('/usr/bin',), mps_pipe_dir='/tmp/nvidia-mps')))")
    for seed in ("1", "2"):  # another process, another str hash seed: the same name
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "PYTHONHASHSEED": seed})
        assert r.stdout.strip() == artifact.artifact_path(c), r.stderr
    others = {artifact.artifact_path(replace(c, **{k: v})) for k, v in
              (("mps_pipe_dir", "/elsewhere"), ("dev_root", "/dev2"), ("path", ("/bin",)),
               ("graphics_config_files", not c.graphics_config_files))}
    assert len(others | {artifact.artifact_path(c)}) == 5


def test_obtain_says_how_it_got_the_inventory(tmp_path, capsys):
    """built (discovered and saved), then read; a driver root with no driver is discovered, never saved."""
    c = cfg(make_driver(tmp_path / "root", extra=False))
    inv, how = artifact.obtain(c)
    assert how == "built" and inv.usable
    assert artifact.obtain(c) == (inv, "read")
    empty = tmp_path / "empty"
    empty.mkdir()
    none = replace(c, driver_root=str(empty), snapshot_dir=str(tmp_path / "snap2"))
    inv, how = artifact.obtain(none, strict=False)
    assert how == "discovered" and not inv.usable
    assert not list(tmp_path.glob("snap2/inventory-*.json"))
    assert "warning" not in capsys.readouterr().err  # an unusable driver is no save failure to warn about
