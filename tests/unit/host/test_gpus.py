"""host/gpus.py, host/gpufiles.py and host/gpuscan.py: the parsers, and discovery against fixture trees written like the kernel module's."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from fixtures.hosttree import FakeGpu, fake_gpus, fake_uuid, make_host_tree
from pyxis_hook.host import gpufiles, probe
from pyxis_hook.host.gpuscan import discover_gpus
from schema_check import validate
from pyxis_hook.host.gpus import HostGpus, device_nodes_for, normalize_bus_id, parse_bus_id
from pyxis_hook.host.gpufiles import parse_driver_version, parse_information, parse_mig_minors, parse_proc_devices

ROOT = os.geteuid() == 0


def discover(tree, **kw) -> HostGpus:
    return discover_gpus(tree.proc_root, tree.dev_root, **kw)


# ------------------------------------------------------------------ parsers

@pytest.mark.parametrize("line,version", [
    ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.135  Tue Nov 12 19:07:32 UTC 2024", "550.135"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  565.77  Release Build  "
     "(dvs-builder@U16-I3-B03-4-3)  Wed Nov 27 23:33:08 UTC 2024", "565.77"),
    ("NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.54.14  Thu Feb 22 01:25:25 UTC 2024", "550.54.14"),
    ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build  (x@y)  date", "570.86.15"),
])
def test_driver_version_shapes(line, version):
    assert parse_driver_version(line + "\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n") == version


def test_driver_version_garbage_is_none():
    assert parse_driver_version("hello\n") is None
    assert parse_driver_version("NVRM version: something else\n") is None


def test_information_splits_at_first_colon():
    info = parse_information("Model: \t\t Tesla T4\nBus Location: \t 0000:3b:00.0\nDevice Minor: \t 3\nnocolon\n")
    assert info == {"Model": "Tesla T4", "Bus Location": "0000:3b:00.0", "Device Minor": "3"}


@pytest.mark.parametrize("text,norm", [
    ("0000:06:00.0", "0000:06:00.0"),
    ("00000000:06:00.0", "0000:06:00.0"),
    ("00000000:3B:00.0", "0000:3b:00.0"),
    ("06:00.0", "0000:06:00.0"),
    ("0001:81:1f.7", "0001:81:1f.7"),
    ("0001a3c4:00:00.0", "1a3c4:00:00.0"),  # 32-bit Azure domain keeps its digits
])
def test_normalize_bus_id(text, norm):
    assert normalize_bus_id(text) == norm


@pytest.mark.parametrize("bad", ["", "0", "GPU-1234", "0000:06:00", "0000:06:20.0", "0000:06:00.8", "x0000:06:00.0"])
def test_normalize_bus_id_rejects(bad):
    assert normalize_bus_id(bad) is None


@given(st.integers(0, 0xFFFF), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7))
def test_bus_id_procfs_and_nvml_forms_agree(dom, bus, dev, fn):
    procfs = f"{dom:04x}:{bus:02x}:{dev:02x}.{fn}"
    nvml = f"{dom:08X}:{bus:02X}:{dev:02X}.{fn}"
    assert normalize_bus_id(procfs) == normalize_bus_id(nvml) == procfs
    assert parse_bus_id(nvml) == (dom, bus, dev, fn)


def test_proc_devices_char_section_only_and_frontend_fallback():
    text = ("Character devices:\n  1 mem\n195 nvidia\n236 nvidia-uvm\n\n"
            "Block devices:\n  8 sd\n237 nvidia-caps\n")
    names = parse_proc_devices(text)
    assert names == {"mem": 1, "nvidia": 195, "nvidia-uvm": 236}
    majors = gpufiles.majors_from_devices(names)
    assert (majors.nvidia, majors.uvm, majors.caps, majors.imex) == (195, 236, None, None)
    assert majors.names == (("nvidia", 195), ("nvidia-uvm", 236))


def test_mig_minors_lines():
    assert parse_mig_minors("config 1\nmonitor 2\ngpu0/gi0/access 3\ngpu0/gi0/ci0/access 4\nbogus\n") == (
        ("config", 1), ("monitor", 2), ("gpu0/gi0/access", 3), ("gpu0/gi0/ci0/access", 4))


# ------------------------------------------------------------------ discovery


def test_default_tree(tmp_path):
    tree = make_host_tree(tmp_path, make_nodes=ROOT)
    host = discover(tree)
    assert host.driver_version == "535.216.03"
    assert [(g.index, g.minor, g.bus_id, g.uuid) for g in host.gpus] == [
        (0, 0, "0000:06:00.0", fake_uuid(0)), (1, 1, "0000:07:00.0", fake_uuid(1))]
    assert host.gpus[0].model == "NVIDIA A100-SXM4-80GB"
    assert host.gpus[0].proc_name == "0000:06:00.0"
    assert (host.majors.nvidia, host.majors.uvm, host.majors.caps, host.majors.imex) == (195, 511, 510, 509)
    # MIG's management capabilities exist on every node; their nodes only once nvidia-modprobe made them
    assert host.mig_devices == () and (host.mig_config_minor, host.mig_monitor_minor) == (1, 2)
    if ROOT:
        assert host.warnings == ()
        on_demand = {"/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-caps/nvidia-cap2"}  # made by nvidia-modprobe
        assert all(n.exists and n.problem is None for n in host.nodes if n.path not in on_demand)
        assert {n.path for n in host.nodes if n.problem == "missing"} == on_demand


def test_open_module_aarch64(tmp_path):
    tree = make_host_tree(tmp_path, driver_version="570.86.15", open_module=True, arch="aarch64", make_nodes=False)
    assert discover(tree).driver_version == "570.86.15"


def test_zero_gpus(tmp_path):
    tree = make_host_tree(tmp_path, gpus=[], make_nodes=ROOT)
    host = discover(tree)
    assert host.gpus == () and host.driver_version == "535.216.03"
    if ROOT:
        assert host.warnings == ()


def test_64_gpus_index_is_pci_rank_not_minor(tmp_path):
    minors = list(range(64))
    random.Random(7).shuffle(minors)
    tree = make_host_tree(tmp_path, gpus=fake_gpus(64, minors=minors, first_bus=0x10), make_nodes=ROOT)
    host = discover(tree)
    assert len(host.gpus) == 64
    assert [g.index for g in host.gpus] == list(range(64))
    assert [g.minor for g in host.gpus] == minors
    assert host.gpu_by_index(5).minor == minors[5]
    if ROOT:
        assert host.warnings == ()


def test_pci_order_uses_integers_and_domains(tmp_path):
    # bus 0x0a sorts after 0x09 numerically; domain 0001 after every 0000 bus
    g = [FakeGpu(0, "0001:01:00.0", fake_uuid(0)), FakeGpu(7, "0000:0a:00.0", fake_uuid(7)),
         FakeGpu(3, "0000:09:00.0", fake_uuid(3)), FakeGpu(4, "0000:09:00.1", fake_uuid(4))]
    host = discover(make_host_tree(tmp_path, gpus=g, make_nodes=False))
    assert [(g.index, g.minor) for g in host.gpus] == [(0, 3), (1, 4), (2, 7), (3, 0)]
    assert host.gpu_by_bus_id("00000001:01:00.0").minor == 0
    assert host.gpu_by_uuid(fake_uuid(7)).index == 2
    assert host.gpu_by_minor(3).bus_id == "0000:09:00.0"


def test_excluded_gpu_gets_no_index(tmp_path):
    tree = make_host_tree(tmp_path, gpus=fake_gpus(3), excluded=[1], make_nodes=False)
    host = discover(tree)
    assert [(g.index, g.minor, g.excluded) for g in host.gpus] == [(0, 0, False), (None, 1, True), (1, 2, False)]
    # an excluded GPU is never injected, so its node is not checked
    assert host.node("/dev/nvidia1") is None and host.node("/dev/nvidia2") is not None
    assert not any("/dev/nvidia1:" in w for w in host.warnings)


def test_no_kernel_module_is_a_warning_not_an_error(tmp_path):
    tree = make_host_tree(tmp_path, kernel_module=False, make_nodes=False)
    host = discover(tree)
    assert host.driver_version is None and host.gpus == () and host.nodes == ()
    assert len(host.warnings) == 1
    assert f"{tree.proc_root}/driver/nvidia: missing" in host.warnings[0]
    assert host.majors.nvidia is None


def test_nothing_at_all(tmp_path):
    host = discover_gpus(str(tmp_path / "proc"), str(tmp_path))
    assert host.driver_version is None
    assert any(str(tmp_path / "proc" / "devices") in w for w in host.warnings)


def test_unreadable_and_broken_files_become_warnings(tmp_path):
    tree = make_host_tree(tmp_path, gpus=fake_gpus(3), make_nodes=False)
    nv = tmp_path / "proc/driver/nvidia"
    info1 = nv / "gpus/0000:07:00.0/information"
    info1.unlink()
    info1.mkdir()  # reading a directory fails even as root
    info2 = nv / "gpus/0000:08:00.0/information"
    info2.write_text("Model: X\nGPU UUID: GPU-x\n")
    (nv / "version").write_text("garbage\n")
    host = discover(tree)
    assert [g.minor for g in host.gpus] == [0]
    text = "\n".join(host.warnings)
    assert f"{info1}: cannot read" in text
    assert f"{info2}: no usable 'Bus Location' or 'Device Minor'" in text
    assert f"{nv}/version: no driver version" in text
    assert host.driver_version is None


def test_missing_nodes_are_warnings(tmp_path):
    tree = make_host_tree(tmp_path, make_nodes=False, modeset=False)
    host = discover(tree)
    text = "\n".join(host.warnings)
    for name in ("nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm"):
        assert f"{tmp_path}/dev/{name}: missing" in text
    # optional nodes are recorded but not warned about
    assert "nvidia-modeset" not in text and "nvidia-uvm-tools" not in text
    assert host.node("/dev/nvidia-modeset").problem == "missing"


def test_mig(tmp_path):
    tree = make_host_tree(tmp_path, gpus=fake_gpus(2, minors=[3, 1]), mig={3: {2: [0, 1], 9: []}, 1: {0: [0]}},
                          make_nodes=ROOT)
    host = discover(tree)
    t = tree.mig_minors
    assert host.mig_config_minor == 1 and host.mig_monitor_minor == 2
    devs = [(d.gpu_minor, d.gi, d.ci, d.access_minors, d.mig_index, d.uuid) for d in host.mig_devices]
    assert devs == [
        (3, 2, 0, (t["gpu3/gi2/access"], t["gpu3/gi2/ci0/access"]), 0, None),
        (3, 2, 1, (t["gpu3/gi2/access"], t["gpu3/gi2/ci1/access"]), 1, None),
        (1, 0, 0, (t["gpu1/gi0/access"], t["gpu1/gi0/ci0/access"]), 0, None),
    ]
    d = host.mig_devices[1]
    assert d.parent_uuid == fake_uuid(3)
    assert d.proc_paths == ("/proc/driver/nvidia/capabilities/gpu3/mig/gi2/access",
                            "/proc/driver/nvidia/capabilities/gpu3/mig/gi2/ci1/access")
    for p in d.proc_paths:
        assert os.path.isfile(tree.proc_root + p[len("/proc"):])
    if ROOT:
        assert host.warnings == ()
        assert host.node(f"/dev/nvidia-caps/nvidia-cap{t['gpu3/gi2/ci1/access']}").problem is None


def test_imex_channels(tmp_path):
    tree = make_host_tree(tmp_path, imex_channels=[0, 5], make_nodes=ROOT)
    host = discover(tree)
    assert host.imex_channels == (0, 5)
    if ROOT:
        assert host.node("/dev/nvidia-caps-imex-channels/channel5").problem is None


def test_device_nodes_for_selection(tmp_path):
    tree = make_host_tree(tmp_path, gpus=fake_gpus(2, minors=[3, 1]), mig={3: {2: [0]}}, imex_channels=[4],
                          make_nodes=ROOT)
    host = discover(tree)
    mig = host.mig_devices[0]
    nodes = device_nodes_for(host, [1], [mig], uvm=True, mig_config=True, imex_channels=[4, 9])
    paths = [n.path for n in nodes]
    assert paths == ["/dev/nvidiactl", "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                     f"/dev/nvidia-caps/nvidia-cap{mig.access_minors[0]}",
                     f"/dev/nvidia-caps/nvidia-cap{mig.access_minors[1]}",
                     "/dev/nvidia-caps/nvidia-cap1",
                     "/dev/nvidia-caps-imex-channels/channel4", "/dev/nvidia-caps-imex-channels/channel9"]
    assert nodes[1].major == 195 and nodes[1].minor == 1
    assert nodes[3].major == 511
    assert nodes[-1].problem == "missing" and nodes[-1].major == 509
    assert [n.path for n in device_nodes_for(host)] == ["/dev/nvidiactl"]


# ------------------------------------------------------------------ serialisation


def test_round_trip_through_json_and_schema(tmp_path):
    tree = make_host_tree(tmp_path, gpus=fake_gpus(3, minors=[2, 0, 1], domain=2), mig={2: {1: [0]}},
                          imex_channels=[1], excluded=[0], make_nodes=ROOT)
    host = discover(tree)
    d = json.loads(json.dumps(host.to_dict()))
    validate(d, "gpus.schema.json")
    again = HostGpus.from_dict(d)
    assert again == host
    assert again.to_dict() == d


def test_schema_accepts_empty_host(tmp_path):
    host = discover_gpus(str(tmp_path / "proc"), str(tmp_path))
    d = json.loads(json.dumps(host.to_dict()))
    validate(d, "gpus.schema.json")
    assert HostGpus.from_dict(d) == host


def test_import_is_cheap():
    code = "import sys, pyxis_hook.host.gpus; print(sorted(m for m in ('ctypes','json','logging','subprocess') if m in sys.modules))"
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------------------------ properties and the fixture itself

gpu_sets = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 0xFF), st.integers(0, 0x1F), st.integers(0, 7)),
    min_size=0, max_size=12, unique=True)


@settings(max_examples=25, deadline=None)
@given(gpu_sets, st.randoms(use_true_random=False))
def test_index_is_rank_of_pci_id(buses, rnd):
    import tempfile

    minors = rnd.sample(range(256), len(buses))
    fg = [FakeGpu(m, f"{d:04x}:{b:02x}:{dv:02x}.{f}", fake_uuid(m)) for m, (d, b, dv, f) in zip(minors, buses)]
    with tempfile.TemporaryDirectory() as d:
        host = discover(make_host_tree(d, gpus=fg, make_nodes=False))
    by_pci = sorted(fg, key=lambda g: parse_bus_id(g.bus_id))
    assert [(g.index, g.minor) for g in host.gpus] == [(i, g.minor) for i, g in enumerate(by_pci)]


def test_fixture_without_root_skips_nodes_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    tree = make_host_tree(tmp_path, imex_channels=[2])
    assert tree.nodes_made == [] and "not root" in tree.nodes_skipped
    assert not (tmp_path / "dev" / "nvidiactl").exists()
    host = discover(tree)
    assert host.imex_channels == (2,)  # listed from the directory even as plain files


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300) | st.text(alphabet="ab:\r\n\t é", max_size=200).map(lambda t: t.encode()))
def test_reader_reads_what_a_text_mode_open_reads(tmp_path_factory, data):
    """Discovery reads procfs with `os` calls (fewer syscalls per GPU): the same text `open` gives,
    newlines translated and bad UTF-8 replaced."""
    path = tmp_path_factory.mktemp("r") / "information"
    path.write_bytes(data)
    with open(path, encoding="utf-8", errors="replace") as f:
        expected = f.read()
    r = probe.Reader()
    assert r.read(str(path)) == expected and r.warnings == []


def test_mig_config_and_monitor_minors_come_from_their_capability_files_then_the_table(tmp_path):
    # the module's mig-minors table lists every GPU it could drive (4,322 lines on every node): the
    # two minors a start needs come from their own capability files, the table only when those are absent
    tree = make_host_tree(tmp_path, gpus=fake_gpus(1), mig={0: {}}, make_nodes=False)
    caps = Path(tree.proc_root) / "driver/nvidia/capabilities/mig"
    (Path(tree.proc_root) / "driver/nvidia-caps/mig-minors").write_text("config 7\nmonitor 8\ngpu0/gi0/access 9\n")
    host = discover(tree)
    assert (host.mig_config_minor, host.mig_monitor_minor) == (1, 2)
    (caps / "monitor").unlink()
    host = discover(tree)
    assert (host.mig_config_minor, host.mig_monitor_minor) == (1, 8)
    (caps / "config").unlink()
    host = discover(tree)
    assert (host.mig_config_minor, host.mig_monitor_minor) == (7, 8)


def test_the_mig_table_is_not_read_while_the_capability_files_answer(tmp_path):
    """A start reads the module's table (every GPU it could drive, on every node) only for a missing file:
    here an unreadable table costs no warning until a capability file is gone."""
    tree = make_host_tree(tmp_path, gpus=fake_gpus(1), make_nodes=False)
    table = Path(tree.proc_root) / "driver/nvidia-caps/mig-minors"
    table.unlink()
    table.mkdir()  # reading it fails
    assert not [w for w in discover(tree).warnings if "mig-minors" in w]
    (Path(tree.proc_root) / "driver/nvidia/capabilities/mig/monitor").unlink()
    assert [w for w in discover(tree).warnings if "mig-minors" in w and "cannot read" in w]
