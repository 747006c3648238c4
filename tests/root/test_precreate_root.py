"""Root tests: `pyxis-hook precreate`: config.json in, config.json with GPU devices out.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/engines/test_precreate.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import json
import os
import pytest
from e2e.conftest import fresh_rootfs, run_container
from unit.engines.test_precreate import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _config,
    _precreate,
    host,
)


@pytest.mark.root
@pytest.mark.e2e
def test_runc_honours_the_transformed_config(host, tmp_path):
    """No hook: runc alone makes the nodes and the device cgroup from what precreate wrote."""
    script = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; "
              "cat /dev/nvidia2 2>&1 | head -1; "
              "mknod /dev/x1 c 195 1 2>&1 && cat /dev/x1 2>&1 | head -1")
    bundle, data = _config(tmp_path, ("NVIDIA_VISIBLE_DEVICES=2",), args=("/bin/sh", "-c", script))
    fresh_rootfs(bundle / "rootfs")
    r = _precreate(host, data, bundle)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    doc["process"]["capabilities"] = {k: v + ["CAP_MKNOD"] for k, v in doc["process"]["capabilities"].items()}
    (bundle / "config.json").write_text(json.dumps(doc))
    res = run_container("runc", bundle, f"pyxis-pre-{os.getpid()}")
    assert res.rc == 0, res.stderr
    lines = res.stdout.splitlines()
    assert set(lines[0].split()) == {"nvidia-uvm", "nvidia-uvm-tools", "nvidia2", "nvidiactl"}
    assert "No such device or address" in lines[1]  # allowed by the cgroup, no driver behind it
    assert "Operation not permitted" in lines[2]  # GPU 1 is not in the cgroup
