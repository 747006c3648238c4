"""A real `pip install .` into a fresh venv: the registered hook command works from there.

The hook runs as `python -I -S <site-packages>/pyxis_hook/__main__.py`: no site
scan, so the venv's own site-packages (pyelftools, for the snapshot build)
and `share/pyxis-hook/schemas` must be found without `site`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.conftest import make_host
from fixtures.oci_state import state_json

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
    r = subprocess.run([str(d / "bin/pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


def test_installed_hook_command_builds_snapshot_and_plans(venv, tmp_path):
    host = make_host(tmp_path)
    doc = json.loads(subprocess.run([str(venv / "bin/pyxis-hook"), "hookd"], capture_output=True, text=True,
                                    check=True).stdout)
    argv = doc["hook"]["args"]
    # the venv's own interpreter link (python or python3: whichever pip's script names), not the base one
    assert argv[0].startswith(str(venv / "bin") + "/python") and argv[1:3] == ["-I", "-S"]
    assert argv[3].startswith(str(venv)) and argv[3].endswith("pyxis_hook/__main__.py")
    env = {"PATH": "/usr/bin:/bin", "PYXIS_HOOK_CONFIG": str(host.conf)}
    # `plan` through the same -I -S entry: config schema (share/), snapshot build (pyelftools) both found
    bundle = tmp_path / "b"
    from fixtures.container import make_bundle

    make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=0",))
    r = subprocess.run([*argv[:4], "plan", "--bundle", str(bundle), "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert "/dev/nvidia0" in [d["path"] for d in plan["devices"]]
    assert list((host.base / "snapshot").glob("inventory-*.json")), "snapshot not written"
    # the void path from the installed copy
    state = state_json(bundle, id="x")
    make_bundle(bundle, env=())
    r = subprocess.run(argv, input=state, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stderr == ""
