"""Root tests: doctor: each host cause gives its exact finding, on fixture hosts (hosttree.py + fakedriver.py).

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/diag/test_doctor.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
import jsonschema
import pytest
from pyxis_hook import cli
from pyxis_hook.diag import doctor
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.host.discovery import discover
from unit.diag.test_doctor import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _conf,
    by_code,
    driver,
    host_config,
    only,
)


@pytest.mark.root
def test_device_nodes_ok(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    fs = doctor.check_devices(discover(cfg, strict=False).host, cfg)
    assert [f.code for f in fs] == ["device-nodes"]
    assert fs[0].what.startswith("6 device node(s) present")  # ctl, nvidia0, nvidia1, uvm, uvm-tools, modeset


@pytest.mark.root
def test_device_node_missing_wrong_and_too_strict(tmp_path, driver):
    cfg = host_config(tmp_path, driver)
    dev = Path(cfg.dev_root) / "dev"
    (dev / "nvidia0").unlink()
    (dev / "nvidia1").unlink()
    os.mknod(dev / "nvidia1", 0o666 | 0o020000, os.makedev(195, 7))
    os.chmod(dev / "nvidiactl", 0o660)
    fs = doctor.check_devices(discover(cfg, strict=False).host, cfg)
    nodes = {f.what for f in by_code(fs, "device-node")}
    assert nodes == {f"{dev}/nvidia0: missing (expected char 195:0)",
                     f"{dev}/nvidia1: invalid device node: is 195:7, expected 195:1 (expected char 195:1)"}
    f = only(fs, "device-permissions")
    assert f.severity == "warning" and f.what == f"{dev}/nvidiactl has mode 0660"
    assert "NVreg_DeviceFileMode=0666" in f.fix


@pytest.mark.root
def test_cli_healthy_host_exits_zero(tmp_path, driver, capsys, monkeypatch):
    cfg = host_config(tmp_path, driver)
    conf = _conf(tmp_path, cfg)
    assert cli.main(["--config", str(conf), "doctor", "--json"]) == 0, capsys.readouterr()
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, load_schema("doctor.schema.json"))
    assert doc["ok"] and not [f for f in doc["findings"] if f["severity"] == "error"]
    assert {"driver", "device-nodes", "host-ldcache", "ldconfig", "config"} <= {f["code"] for f in doc["findings"]}
