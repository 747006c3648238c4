"""`pyxis-hook precreate`: config.json in, config.json with GPU devices out.

Checked against runc itself: the transformed config (no hook at all) gives
a container whose allowed nodes open as far as the absent driver (ENXIO)
while a node outside the selection is refused by the device cgroup (EPERM).
"""

from __future__ import annotations

import json

import pytest

from e2e.conftest import make_host
from fixtures.cli import run_cli
from fixtures.container import make_bundle


def _config(tmp_path, env, args=("/bin/true",)):
    bundle = tmp_path / "bundle"
    make_bundle(bundle, env=tuple(env), args=args)
    return bundle, (bundle / "config.json").read_bytes()


def _precreate(host, data: bytes, cwd):
    return run_cli("precreate", conf=host.conf, input=data, cwd=cwd, text=False)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return make_host(tmp_path_factory.mktemp("prehost"))


@pytest.mark.parametrize("env", [(), ("NVIDIA_VISIBLE_DEVICES=void",), ("NVIDIA_VISIBLE_DEVICES=",)])
def test_void_request_is_byte_identical(host, tmp_path, env):
    bundle, data = _config(tmp_path, env)
    data = data.replace(b'"ociVersion"', b'"x-unknown": {"kept": [1, 2]},\n  "ociVersion"')  # odd layout kept
    r = _precreate(host, data, bundle)
    assert r.returncode == 0, r.stderr
    assert r.stdout == data


def test_selected_gpus_become_devices_and_allow_rules(host, tmp_path):
    bundle, data = _config(tmp_path, ("NVIDIA_VISIBLE_DEVICES=0,2",))
    r = _precreate(host, data, bundle)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    devs = {d["path"]: d for d in doc["linux"]["devices"]}
    assert set(devs) == {"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    assert devs["/dev/nvidia2"] == {"path": "/dev/nvidia2", "type": "c", "major": 195, "minor": 2,
                                    "fileMode": 0o666, "uid": 0, "gid": 0}
    rules = doc["linux"]["resources"]["devices"]
    assert rules[0] == {"allow": False, "access": "rwm"}  # the runtime's deny-all stays first
    assert {"allow": True, "type": "c", "major": 195, "minor": 0, "access": "rwm"} in rules
    assert not any(r.get("minor") == 1 and r.get("major") == 195 for r in rules)
    # everything else is untouched
    orig = json.loads(data)
    for key in ("process", "root", "mounts", "hooks"):
        assert doc[key] == orig[key]
    # idempotent: a second pass adds nothing
    again = json.loads(_precreate(host, r.stdout, bundle).stdout)
    assert again == doc


def test_slurm_allocation_sets_local_cuda_visible_devices(host, tmp_path):
    env = ("NVIDIA_VISIBLE_DEVICES=all", "SLURM_STEP_GPUS=2,3", "CUDA_VISIBLE_DEVICES=2,3")
    bundle, data = _config(tmp_path, env)
    r = _precreate(host, data, bundle)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    gpus = sorted(d["path"] for d in doc["linux"]["devices"] if d["path"][len("/dev/nvidia"):].isdigit())
    assert gpus == ["/dev/nvidia2", "/dev/nvidia3"]
    cvd = [e for e in doc["process"]["env"] if e.startswith("CUDA_VISIBLE_DEVICES=")]
    assert cvd == ["CUDA_VISIBLE_DEVICES=0,1"]


def test_no_allocation_leaves_cuda_visible_devices(host, tmp_path):
    bundle, data = _config(tmp_path, ("NVIDIA_VISIBLE_DEVICES=1", "CUDA_VISIBLE_DEVICES=0"))
    doc = json.loads(_precreate(host, data, bundle).stdout)
    assert [e for e in doc["process"]["env"] if e.startswith("CUDA_")] == ["CUDA_VISIBLE_DEVICES=0"]


def test_errors_are_one_line(host, tmp_path):
    bundle, data = _config(tmp_path, ("NVIDIA_VISIBLE_DEVICES=9",))
    r = _precreate(host, data, bundle)
    assert r.returncode != 0 and r.stdout == b""
    err = r.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("pyxis-hook: error:") and "9" in err
    r = _precreate(host, b"{", bundle)
    assert r.returncode != 0 and r.stderr.decode().count("\n") == 1


def test_documented_hooks_d_file_is_valid():
    """docs/podman.md's precreate file: valid oci-hooks 1.0.0, and the same shape the e2e test installs."""
    import re
    from pathlib import Path

    import jsonschema

    repo = Path(__file__).resolve().parents[3]
    text = (repo / "docs/podman.md").read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    doc = json.loads(block)
    schema = json.loads((repo / "schemas/oci-hooks-1.0.0.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert doc["stages"] == ["precreate"] and doc["hook"]["args"][1:] == ["-I", "-m", "pyxis_hook", "precreate"]
    assert doc["hook"]["args"][0] == doc["hook"]["path"]
