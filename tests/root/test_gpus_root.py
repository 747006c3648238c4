"""Root tests: host/gpuscan.py: procfs/dev discovery against fixture trees written like the kernel module's.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/host/test_gpus.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import stat
import pytest
from fixtures.hosttree import make_host_tree
from unit.host.test_gpus import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    discover,
)


@pytest.mark.root
def test_wrong_device_numbers_are_reported(tmp_path):
    tree = make_host_tree(tmp_path)
    dev = tmp_path / "dev"
    (dev / "nvidia1").unlink()
    os.mknod(dev / "nvidia1", 0o666 | stat.S_IFCHR, os.makedev(195, 7))
    (dev / "nvidia-uvm").unlink()
    (dev / "nvidia-uvm").write_text("")
    host = discover(tree)
    text = "\n".join(host.warnings)
    assert f"{dev}/nvidia1: invalid device node: is 195:7, expected 195:1" in text
    assert f"{dev}/nvidia-uvm: not a character device" in text
    ok = host.node("/dev/nvidia0")
    assert ok.exists and ok.problem is None and ok.mode == 0o666


@pytest.mark.root
def test_fixture_params_and_nodes(tmp_path):
    tree = make_host_tree(tmp_path, modify_device_files=True)
    params = (tmp_path / "proc/driver/nvidia/params").read_text()
    assert "ModifyDeviceFiles: 1" in params.splitlines()
    assert (tmp_path / "proc/driver/nvidia/registry").is_file()
    st_ = os.stat(tmp_path / "dev/nvidiactl")
    assert stat.S_ISCHR(st_.st_mode) and (os.major(st_.st_rdev), os.minor(st_.st_rdev)) == (195, 255)
    assert sorted(os.path.basename(p) for p in tree.nodes_made) == sorted(
        ["nvidiactl", "nvidia0", "nvidia1", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"])
    assert tree.nodes_skipped is None
