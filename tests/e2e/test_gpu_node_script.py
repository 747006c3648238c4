"""tests/gpu-node/check.sh's mechanics, on the fake host (the real verdict needs a GPU node).

With fixture roots the hook must succeed and the in-container query must
reach the injected (fake) libcuda, which answers like a node without the
kernel module — so the verdict is FAIL, for exactly that reason.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from e2e.conftest import make_host

pytestmark = [pytest.mark.e2e, pytest.mark.root]

SCRIPT = Path(__file__).resolve().parents[1] / "gpu-node" / "check.sh"


def test_check_script_on_fake_host(tmp_path):
    host = make_host(tmp_path)
    extra = tmp_path / "extra.conf"
    extra.write_text(f'driver-root = "{host.driver_root}"\ndev-root = "{host.dev_root}"\n'
                     f'proc-root = "{host.proc_root}"\n')
    r = subprocess.run(["bash", str(SCRIPT), "--config", str(extra)], capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "hook exit 0" in out, out
    assert "cuDriverGetVersion 0 12020" in out
    assert "cuInit 100" in out
    assert "couldn't communicate with the NVIDIA driver" in out
    assert "verdict: FAIL" in out and r.returncode == 1
