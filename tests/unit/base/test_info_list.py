"""`pyxis-hook info` and `list`: text and --json (validated with jsonschema), exit codes on bad hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures import hosttree, realdriver
from fixtures.cli import run_cli as run_pyxis_hook, write_conf
from fixtures.synthdriver import LIB, V, make_driver
from pyxis_hook.spec.schemafiles import load_schema
from schema_check import validate

import jsonschema  # noqa: E402  (install_requires)


def run_cli(tmp_path: Path, *args: str, driver_root: Path, host=None, extra: str = ""):
    proc = str(host.proc_root) if host else str(tmp_path / "no-proc")
    dev = str(host.dev_root) if host else str(tmp_path / "no-dev")
    conf = write_conf(tmp_path / "pyxis.conf", driver_root=driver_root, proc_root=proc, dev_root=dev,
                      snapshot_dir=tmp_path / "snap", extra=extra)
    return run_pyxis_hook(*args, conf=conf)


@pytest.fixture
def driver(tmp_path):
    return make_driver(tmp_path / "root")


def test_info_json_with_gpus(tmp_path, driver):
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    p = run_cli(tmp_path, "info", "--json", driver_root=driver, host=host)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    validate(doc, "info.schema.json")
    assert doc["driver_version"] == V and doc["version_source"] == "procfs" and doc["usable"]
    assert [(g["index"], g["minor"], g["bus_id"]) for g in doc["host"]["gpus"]] == \
        [(0, 0, "0000:06:00.0"), (1, 1, "0000:07:00.0")]


def test_info_text(tmp_path, driver):
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    p = run_cli(tmp_path, "info", driver_root=driver, host=host)
    assert p.returncode == 0, p.stderr
    assert f"driver version: {V} (from kernel module)" in p.stdout
    assert "GPUs: 2" in p.stdout and "0000:07:00.0" in p.stdout
    assert "device majors: nvidia 195, nvidia-uvm 511" in p.stdout


def test_info_without_driver_prints_what_it_found_and_fails(tmp_path):
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    empty = tmp_path / "empty"
    (empty / "etc").mkdir(parents=True)
    p = run_cli(tmp_path, "info", "--json", driver_root=empty, host=host)
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    assert doc["driver_version"] == V and len(doc["host"]["gpus"]) == 2 and not doc["usable"]
    assert f"pyxis-hook: error: {empty}/etc/ld.so.cache" in p.stderr
    assert "Traceback" not in p.stderr


def test_list_json_schema_and_selection(tmp_path, driver):
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    p = run_cli(tmp_path, "list", "--json", "--devices", "1", "--capabilities", "compute",
                driver_root=driver, host=host)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    jsonschema.validate(doc, load_schema("list.schema.json"))
    assert doc["capabilities"] == ["compute"]
    assert {f["capability"] for f in doc["files"] if f["kind"] != "firmware"} == {"compute"}
    assert [f["name"] for f in doc["files"] if f["kind"] == "firmware"] == ["gsp_ga10x.bin"]  # any capability
    assert f"/{LIB}/libcuda.so.{V}" in [f["path"] for f in doc["files"]]
    assert [g["minor"] for g in doc["gpus"]] == [1]
    paths = [d["path"] for d in doc["devices"]]
    assert paths[:2] == ["/dev/nvidiactl", "/dev/nvidia1"] and "/dev/nvidia-uvm" in paths
    assert "/dev/nvidia0" not in paths


def test_list_text_all(tmp_path, driver):
    p = run_cli(tmp_path, "list", driver_root=driver)
    assert p.returncode == 0, p.stderr
    assert "compute:" in p.stdout and "libcuda.so.1" in p.stdout
    assert "libX11.so.6" in p.stdout and "needed by libGLX_nvidia.so.0" in p.stdout


def test_list_bad_device_is_one_line(tmp_path, driver):
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    p = run_cli(tmp_path, "list", "--devices", "GPU-nonexistent", driver_root=driver, host=host)
    assert p.returncode != 0
    assert p.stderr.startswith("pyxis-hook: error:") and "GPU-nonexistent" in p.stderr
    assert "Traceback" not in p.stderr


def test_list_corrupt_cache(tmp_path, driver):
    (driver / "etc/ld.so.cache").write_bytes(b"\0" * 10)
    p = run_cli(tmp_path, "list", "--json", driver_root=driver)
    assert p.returncode == 1
    doc = json.loads(p.stdout)
    jsonschema.validate(doc, load_schema("list.schema.json"))
    assert not doc["usable"] and str(driver / "etc/ld.so.cache") in doc["errors"][0]


@pytest.mark.realdriver
@pytest.mark.slow
@pytest.mark.parametrize("line", ["535", "470"])
def test_list_json_same_set_in_all_layouts(tmp_path, line):
    seen = {}
    for layout in realdriver.LAYOUTS:
        root = realdriver.require_driver_root(line, layout)
        p = run_cli(tmp_path, "list", "--json", driver_root=root)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        jsonschema.validate(doc, load_schema("list.schema.json"))
        seen[layout] = {(f["kind"], f["capability"], f["soname"] or f["name"]) for f in doc["files"]}
    assert all(s == seen["debian"] for s in seen.values())
    assert ("lib", "compute", "libcuda.so.1") in seen["debian"]


def test_info_cuda_text_is_cudaversion_format():
    from pyxis_hook.commands.info import _cuda_text
    from pyxis_hook.host.cudaversion import format_cuda_version

    assert _cuda_text(None) is None
    assert _cuda_text(12020) == format_cuda_version(12020) == "12.2"
    assert _cuda_text(11080) == "11.8"
