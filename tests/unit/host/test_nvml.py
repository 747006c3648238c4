"""host/nvml.py: MIG device UUIDs from the driver's NVML (a fake libnvidia-ml built with gcc)."""

from __future__ import annotations

import os
import subprocess
import sys

from fixtures.hosttree import fake_gpus, fake_uuid, make_host_tree
from fixtures.nvml import build_fake_nvml
from pyxis_hook.host import nvml
from pyxis_hook.host.gpuscan import discover_gpus
from pyxis_hook.host.inventory import Inventory

ROOT = os.geteuid() == 0


def test_nvml_absent_leaves_mig_uuids_unknown(tmp_path):
    tree = make_host_tree(tmp_path, mig={0: {2: [0]}}, make_nodes=ROOT)
    library = str(tmp_path / "no-such-libnvidia-ml.so.1")
    host = nvml.fill_mig_uuids(discover_gpus(tree.proc_root, tree.dev_root), library)
    assert host.mig_devices[0].uuid is None
    assert any(w.startswith(f"{library}: MIG device UUIDs unknown: cannot load") for w in host.warnings)


def test_nvml_fills_mig_uuids(tmp_path):
    lib = build_fake_nvml(tmp_path / "libnvidia-ml.so.1", fake_uuid(0))
    tree = make_host_tree(tmp_path / "host", gpus=fake_gpus(1), mig={0: {2: [0, 1, 3]}}, make_nodes=ROOT)
    before = discover_gpus(tree.proc_root, tree.dev_root)
    host = nvml.fill_mig_uuids(before, str(lib))
    uuids = [(d.gi, d.ci, d.uuid) for d in host.mig_devices]
    assert uuids == [(2, 0, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000000"),
                     (2, 1, "MIG-aaaaaaaa-bbbb-cccc-dddd-000000000001"),
                     (2, 3, None)]
    assert host.warnings == before.warnings  # NVML answered: nothing to warn about
    assert nvml.fill_mig_uuids(host, "/nonexistent").mig_devices == host.mig_devices


def test_gpus_no_longer_loads_ctypes_nor_nvml():
    """procfs discovery is one module, NVML (ctypes) another that only a MIG UUID request loads."""
    code = ("import sys, pyxis_hook.host.gpus, pyxis_hook.host.gpuscan as g; "
            "print(sorted(m for m in ('ctypes', 'pyxis_hook.host.nvml') if m in sys.modules), hasattr(g, 'nvml_mig_uuids'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]


def test_mig_uuids_are_asked_of_the_driver_roots_nvml_only(tmp_path, monkeypatch):
    """Without a libnvidia-ml in the driver inventory the hook loads none (not one its own loader finds)."""
    from pyxis_hook.plan import prepare as hook

    tree = make_host_tree(tmp_path, mig={0: {2: [0]}}, make_nodes=ROOT)
    host = discover_gpus(tree.proc_root, tree.dev_root)
    inv = Inventory(driver_version="535.0", cuda_version=None, host=host, files=(), warnings=())
    loaded = []
    monkeypatch.setattr(nvml, "nvml_mig_uuids", lambda library: loaded.append(library) or ({}, "x"))
    assert hook.with_mig_uuids(inv) is inv
    assert loaded == []
    assert host.mig_devices[0].uuid is None
