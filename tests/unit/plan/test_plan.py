"""The planner: Request + Inventory + container facts -> Plan, and `pyxis-hook plan`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pyxis_hook.record import replace

import pytest

from fixtures.container import make_bundle
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus, make_host_tree
from pyxis_hook import errors
from pyxis_hook.host import gpuscan, inventory
from pyxis_hook.spec import oci
from pyxis_hook.host import discovery
from pyxis_hook.spec.config import Config
from pyxis_hook.host.gpuscan import read_proc_driver_files
from pyxis_hook.plan.prepare import prepare
from pyxis_hook.plan.build import ContainerFacts, build_plan, patch_params
from pyxis_hook.spec.request import resolve_request
from schema_check import validate

VERSION = "535.216.03"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    base = tmp_path_factory.mktemp("plan")
    tree = make_host_tree(base / "host", gpus=fake_gpus(4), driver_version=VERSION)
    driver = make_fake_driver(base / "driver", version=VERSION)
    config = Config(driver_root=str(driver), dev_root=str(tree.dev_root), proc_root=str(tree.proc_root),
                    snapshot_dir=str(base / "snap"), source=str(base / "pyxis.conf"))
    inv = discovery.discover(config, strict=False)
    return base, tree, config, inv


def _plan(world, env, facts=None, config=None, proc=True):
    base, tree, cfg, inv = world
    cfg = config or cfg
    host = inv.host
    req = resolve_request(env, {}, host, cfg, cuda_version="12.2")
    facts = facts or ContainerFacts(rootfs=str(base / "rootfs"))
    return req, build_plan(req, inv, facts, cfg, proc_files=read_proc_driver_files(cfg.proc_root) if proc else None)


def test_void_plan_is_empty(world):
    for env in ({}, {"NVIDIA_VISIBLE_DEVICES": "void"}, {"NVIDIA_VISIBLE_DEVICES": ""}):
        _, plan = _plan(world, env)
        assert plan.empty and not plan.cgroup_rules and plan.ldcache.mode == "none"


def test_subset_devices_mounts_links(world):
    _, tree, _, _ = world
    req, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0,2"})
    assert [d.path for d in plan.devices] == ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia2",
                                              "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert all(d.host_path.startswith(str(tree.dev_root)) for d in plan.devices)
    targets = {m.container_path for m in plan.mounts}
    assert f"/usr/lib/x86_64-linux-gnu/libcuda.so.{VERSION}" in targets
    assert "/usr/bin/nvidia-smi" in targets
    assert f"/lib/firmware/nvidia/{VERSION}/gsp_ga10x.bin" in targets
    assert all("ro" in m.options and "nosuid" in m.options and "nodev" in m.options for m in plan.mounts)
    links = {(s.container_path, s.target) for s in plan.symlinks}
    assert ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", f"libcuda.so.{VERSION}") in links
    assert [(r.major, r.minor) for r in plan.cgroup_rules] == [(d.major, d.minor) for d in plan.devices]
    assert plan.proc_driver is not None and len(plan.proc_driver.gpu_dirs) == 2
    assert dict(plan.env)["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert not plan.problems


def test_utility_only_has_no_cuda_and_no_uvm(world):
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "1", "NVIDIA_DRIVER_CAPABILITIES": "utility"})
    names = {m.container_path.rsplit("/", 1)[1] for m in plan.mounts}
    assert not any(n.startswith("libcuda") for n in names)
    assert any(n.startswith("libnvidia-ml") for n in names)
    assert not any("uvm" in d.path for d in plan.devices)


def test_none_has_control_nodes_only(world):
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "none"})
    assert [d.path for d in plan.devices] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert plan.mounts and plan.proc_driver is not None and plan.proc_driver.gpu_dirs == ()


def test_non_debian_image_gets_lib64(world):
    base = world[0]
    facts = ContainerFacts(rootfs=str(base / "r"), lib_dir="/usr/lib64", lib32_dir="")
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, facts=facts)
    libs = [m.container_path for m in plan.mounts if ".so." in m.container_path]
    assert libs and all(p.startswith("/usr/lib64/") for p in libs)
    assert plan.ldcache.lib_dirs == ("/usr/lib64",)


def test_no_cgroups_and_no_proc_view(world):
    cfg = replace(world[2], no_cgroups=True)
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, config=cfg, proc=False)
    # one decision: the rules stay in the plan (what `plan` shows), cgroup_mode says apply writes none
    assert [(r.major, r.minor) for r in plan.cgroup_rules] == [(d.major, d.minor) for d in plan.devices]
    assert plan.cgroup_mode == "none"
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, proc=False)
    assert plan.cgroup_mode == "auto" and plan.cgroup_rules
    assert plan.proc_driver is None
    assert any("kernel module not loaded" in n for n in plan.notes)


def test_missing_required_node_is_a_problem(world, tmp_path):
    _, tree, cfg, inv = world
    host = gpuscan.discover_gpus(cfg.proc_root, str(tmp_path))  # a dev-root without nodes
    inv2 = inventory.with_host(inv, host)
    req = resolve_request({"NVIDIA_VISIBLE_DEVICES": "0"}, {}, host, cfg, cuda_version="12.2")
    plan = build_plan(req, inv2, ContainerFacts(rootfs="/r"), cfg, proc_files=None)
    assert any("nvidiactl: missing" in p for p in plan.problems)
    assert any("nvidia0" in p for p in plan.problems)


def test_image_without_ld_so_conf_falls_back_to_ldconfig(world):
    facts = ContainerFacts(rootfs="/r", has_ld_so_conf=False)
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, facts=facts, config=replace(world[2], ldcache="merge"))
    assert plan.ldcache.mode == "ldconfig"


@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_ldconfig_in_the_image_is_a_problem_never_the_hosts(world, mode):
    """`ldconfig = "/sbin/ldconfig"` (no '@') names the image's binary: refused by name, never swapped for the host's."""
    cfg = replace(world[2], ldconfig="/sbin/ldconfig", ldcache=mode)
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, config=cfg)
    assert plan.ldcache.ldconfig == ""
    assert any("ldconfig = '/sbin/ldconfig'" in p and "names a binary in the image" in p
               and "'@/sbin/ldconfig'" in p for p in plan.problems), plan.problems
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, config=replace(cfg, ldconfig="@/sbin/ldconfig"))
    assert plan.ldcache.ldconfig.startswith("/sbin/ldconfig") and not plan.problems
    # nothing to refresh, nothing refused
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, config=replace(cfg, ldcache="none"))
    assert plan.ldcache.mode == "none" and not plan.problems


def test_merge_rows_only_in_merge_mode(world):
    _, tree, cfg, inv = world
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, config=replace(cfg, ldcache="merge"))
    rows = {r[2]: r for r in plan.ldcache.libs}
    d, name, soname, flags = rows["libcuda.so.1"]
    assert (d, name) == ("/usr/lib/x86_64-linux-gnu", f"libcuda.so.{VERSION}") and flags == 0x303
    assert all(r[0] in plan.ldcache.lib_dirs for r in plan.ldcache.libs)
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, config=replace(cfg, ldcache="ldconfig"))
    assert plan.ldcache.mode == "ldconfig" and plan.ldcache.libs == ()


def test_ldcache_update_for_ready_rows(world):
    """The CDI update-ldcache hook's entry: rows already carry their flags; no rows or no ld.so.conf -> ldconfig."""
    from pyxis_hook.plan.build import ldcache_update

    cfg = replace(world[2], ldcache="merge", ldconfig="@/sbin/ldconfig")
    row = ("/usr/lib64", "libcuda.so.1.2", "libcuda.so.1", 0x303)
    up, problems = ldcache_update(cfg, ContainerFacts(rootfs="/r"), ("/usr/lib64",), (row,))
    assert (up.mode, up.libs, up.lib_dirs, problems) == ("merge", (row,), ("/usr/lib64",), ())
    up, _ = ldcache_update(cfg, ContainerFacts(rootfs="/r"), ("/usr/lib64",), ())
    assert up.mode == "ldconfig" and up.libs == ()
    up, _ = ldcache_update(cfg, ContainerFacts(rootfs="/r", has_ld_so_conf=False), ("/usr/lib64",), (row,))
    assert up.mode == "ldconfig" and "no /etc/ld.so.conf" in up.why


def test_patch_params():
    text = "ResmanDebugLevel: 1\nModifyDeviceFiles: 1\nDeviceFileMode: 438\n"
    assert patch_params(text) == "ResmanDebugLevel: 1\nModifyDeviceFiles: 0\nDeviceFileMode: 438\n"
    assert patch_params("") == ""


def test_prepare_matches_build_plan_and_json_schema(world, tmp_path):
    base, tree, cfg, inv = world
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=3",))
    (tmp_path / "b/rootfs/etc").mkdir(parents=True)
    (tmp_path / "b/rootfs/etc/debian_version").write_text("12\n")
    prepared = prepare(cfg, oci.load_bundle(str(bundle)))
    assert [g.index for g in prepared.request.gpus] == [3]
    assert "/dev/nvidia3" in [d.path for d in prepared.plan.devices]
    from pyxis_hook.commands.plan import to_json

    doc = to_json(prepared)
    validate(doc, "plan.schema.json")


@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_plan_shows_a_refused_loader_config(world, tmp_path, no_hang, mode):
    """An image whose ld.so.conf includes itself: `plan` says the hook would refuse it, in both modes."""
    from pyxis_hook.commands.plan import render, to_json

    base, tree, cfg, inv = world
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=0",))
    (tmp_path / "b/rootfs/etc").mkdir(parents=True)
    (tmp_path / "b/rootfs/etc/debian_version").write_text("12\n")
    (tmp_path / "b/rootfs/etc/ld.so.conf").write_text("include /etc/ld.so.conf\n")
    prepared = prepare(replace(cfg, ldcache=mode), oci.load_bundle(str(bundle)))
    text = render(prepared)
    assert "✗ the image's loader configuration is refused (/etc/ld.so.conf" in text, text
    assert "includes itself" in text and "merge cannot model" not in text
    doc = to_json(prepared)
    validate(doc, "plan.schema.json")
    assert "includes itself" in doc["plan"]["ldcache"]["refused"]
    assert doc["plan"]["ldcache"].get("merge_fallback") is None
    (tmp_path / "b/rootfs/etc/ld.so.conf").write_text("/opt/lib\n")
    assert to_json(prepared)["plan"]["ldcache"]["refused"] is None


def test_plan_cli_text_json_and_errors(world, tmp_path):
    base, tree, cfg, inv = world
    conf = tmp_path / "pyxis.conf"
    conf.write_text(f'driver-root = "{cfg.driver_root}"\ndev-root = "{cfg.dev_root}"\n'
                    f'proc-root = "{cfg.proc_root}"\nsnapshot-dir = "{tmp_path}/snap"\n')
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=0,2",))
    run = [sys.executable, "-m", "pyxis_hook", "--config", str(conf), "plan", "--bundle", str(bundle)]
    r = subprocess.run(run, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "request: list" in r.stdout and "/dev/nvidia2  c 195:2" in r.stdout and "reasons:" in r.stdout
    r = subprocess.run(run + ["--json"], capture_output=True, text=True)
    validate(json.loads(r.stdout), "plan.schema.json")
    # --env adds after process.env: the last duplicate wins
    r = subprocess.run(run + ["--env", "NVIDIA_VISIBLE_DEVICES=9"], capture_output=True, text=True)
    assert r.returncode == errors.FAILED and r.stderr.count("\n") == 1 and "9" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(run[:-1] + [str(tmp_path / "nope")], capture_output=True, text=True)
    assert r.returncode != 0 and "config.json" in r.stderr and r.stderr.count("\n") == 1


def test_mig_uuid_request_asks_the_drivers_nvml(tmp_path):
    """procfs has no MIG UUIDs: a request naming one makes prepare ask the driver root's libnvidia-ml."""
    from fixtures.hosttree import fake_uuid
    from fixtures.nvml import build_fake_nvml

    tree = make_host_tree(tmp_path / "host", gpus=fake_gpus(1), mig={0: {2: [0, 1]}}, driver_version=VERSION)
    driver = make_fake_driver(tmp_path / "driver", version=VERSION)
    # built outside the driver root (no stray source file there), then put in place of its NVML
    nvml = build_fake_nvml(tmp_path / "libnvidia-ml.so.1", fake_uuid(0))
    shutil.copyfile(nvml, driver / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{VERSION}")
    cfg = Config(driver_root=str(driver), dev_root=str(tree.dev_root), proc_root=str(tree.proc_root),
                 snapshot_dir=str(tmp_path / "snap"))
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001",))
    prepared = prepare(cfg, oci.load_bundle(str(bundle)))
    assert [(m.gi, m.ci) for m in prepared.request.mig_devices] == [(2, 1)]
    paths = [d.path for d in prepared.plan.devices]
    assert "/dev/nvidia0" in paths and any(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in paths)
    # without a MIG UUID in the request NVML is never loaded
    bundle2 = make_bundle(tmp_path / "b2", env=("NVIDIA_VISIBLE_DEVICES=0:0",))
    p2 = prepare(cfg, oci.load_bundle(str(bundle2)))
    assert all(m.uuid is None for m in p2.inventory.host.mig_devices)


def test_container_facts_survive_a_looping_link(tmp_path):
    """A hostile image whose /etc/debian_version loops is read as a non-Debian image, not an error."""
    from pyxis_hook.plan.container import container_facts

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/debian_version").symlink_to("debian_version")
    facts = container_facts(str(tmp_path))
    assert facts.lib_dir == "/usr/lib64" and not facts.has_ld_so_conf


def test_prepare_is_bounded_by_the_hooks_device_cgroup(world, tmp_path, monkeypatch):
    """Inside a Slurm step the hook's own device cgroup lists the allocated GPUs: `all` means those."""
    from pyxis_hook.host import cgroup

    base, tree, cfg, inv = world
    seen = []

    def allowed(proc_root, pid, candidates, major, mountinfo=None):
        seen.append((sorted(candidates), major, mountinfo))
        return cgroup.GpuBound(frozenset({1, 3}), "GPUs from the device cgroup")

    monkeypatch.setattr(cgroup, "gpu_bound", allowed)
    bundle = oci.load_bundle(str(make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=all",))))
    assert prepare(cfg, bundle).request.gpu_minors == (1, 3)
    assert seen == [([0, 1, 2, 3], 195, None)]
    # the mount table the start read already (pinning's) is the one the v1 cgroup's mount is looked up in
    assert prepare(cfg, bundle, own_table="22 1 8:1 / / rw - ext4 /dev/sda1 rw\n").request.gpu_minors == (1, 3)
    assert seen[-1] == ([0, 1, 2, 3], 195, "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n")
    assert prepare(cfg, bundle, confine=False).request.gpu_minors == (0, 1, 2, 3)
    monkeypatch.setattr(cgroup, "gpu_bound",  # not confined
                        lambda *a, **k: cgroup.GpuBound(frozenset({0, 1, 2, 3}), "GPUs from the device cgroup"))
    assert prepare(cfg, bundle).request.gpu_minors == (0, 1, 2, 3)


def test_each_request_warning_is_one_note(world):
    """The request's reasons already carry its warnings: the plan does not add them again."""
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "7,9"})
    warnings = [n for n in plan.notes if n.startswith("warning: ")]
    assert warnings and len(warnings) == len(set(warnings))


def test_image_files_at_link_paths_are_covered_with_the_hosts_file(world, tmp_path):
    """The image's own file where a driver library's SONAME link goes (a COPY of another host's libraries,
    here through a symlinked lib dir): a read-only bind of the host's file over it and a warning naming it;
    a directory there cannot be covered: skipped, said.  Every other link is made as usual."""
    from pyxis_hook.commands.plan import to_json
    from pyxis_hook.plan.build import LIB_OPTIONS, MountEdit

    base, tree, cfg, inv = world
    lib = "/usr/lib/x86_64-linux-gnu"
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=0",))
    root = tmp_path / "b/rootfs"
    for d in ("etc", "opt/multiarch", "usr/lib"):
        (root / d).mkdir(parents=True)
    (root / "etc/debian_version").write_text("12\n")
    (root / lib.lstrip("/")).symlink_to("/opt/multiarch")
    (root / "opt/multiarch/libnvidia-ml.so.1").write_bytes(b"the image's copy")
    (root / "opt/multiarch/libcuda.so.1").mkdir()
    prepared = prepare(cfg, oci.load_bundle(str(bundle)))
    plan = prepared.plan
    nvml = next(f for f in inv.files if f.kind == "lib" and f.soname == "libnvidia-ml.so.1")
    note = (f"{lib}/libnvidia-ml.so.1: the image's own regular file is covered by the host's {nvml.host_path} "
            "(a driver library must match the host's kernel module)")
    covers = [m for m in plan.mounts if m.covers]
    assert covers == [MountEdit(nvml.host_path, f"{lib}/libnvidia-ml.so.1", "file", LIB_OPTIONS, nvml.capability,
                                nvml.source, covers=note)]
    links = {s.container_path for s in plan.symlinks}
    assert f"{lib}/libnvidia-ml.so.1" not in links and f"{lib}/libcuda.so.1" not in links
    assert f"{lib}/libcuda.so.1" not in {m.container_path for m in plan.mounts}
    assert f"{lib}/libnvidia-ptxjitcompiler.so.1" in links
    warnings = [n for n in plan.notes if n.startswith("warning: ")]
    assert ("warning: " + note) in warnings
    assert any(n.startswith(f"warning: {lib}/libcuda.so.1: a directory of the image is there") for n in warnings)
    assert not plan.problems
    validate(to_json(prepared), "plan.schema.json")


def test_an_unreadable_proc_driver_file_is_said_in_the_log(tmp_path, monkeypatch):
    """The start goes on without the file (the container's view lacks it); the hook's log says which and why."""
    from pyxis_hook import log

    base = tmp_path / "driver/nvidia"
    base.mkdir(parents=True)
    (base / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.216.03\n")
    (base / "params").mkdir()  # unreadable as a file: EISDIR
    said = []
    monkeypatch.setattr(log, "warning", said.append)
    files = read_proc_driver_files(str(tmp_path))
    assert [name for name, _ in files] == ["version"]
    assert len(said) == 1 and said[0].startswith(f"{base}/params: cannot read (Is a directory)")
