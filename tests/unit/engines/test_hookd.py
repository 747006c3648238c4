"""The hooks.d file: shape (validated against our oci-hooks 1.0.0 schema) and install."""

from __future__ import annotations

import json
import os
import subprocess
from pyxis_hook.record import replace
from pathlib import Path

import jsonschema

from fixtures.cli import run_cli
from fixtures.oci_state import state_json
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.spec.config import Config
from pyxis_hook.engines.hookd import HOOK_ENV_PATH, hook_document, hook_env

REPO = Path(__file__).resolve().parents[3]


def _validate(doc):
    jsonschema.Draft7Validator(load_schema("oci-hooks-1.0.0.schema.json")).validate(doc)


def test_repo_hook_file_is_valid():
    _validate(json.loads((REPO / "hook.d/pyxis-hook.json").read_text()))


def test_generated_document_runs_this_interpreter_isolated():
    doc = hook_document()
    _validate(doc)
    assert os.path.isabs(doc["hook"]["path"]) and os.access(doc["hook"]["path"], os.X_OK)
    assert "shims" not in doc["hook"]["path"]
    args = doc["hook"]["args"]
    assert args[0] == doc["hook"]["path"] and args[1:3] == ["-I", "-S"] and args[-1] == "prestart"
    assert args[3].endswith("pyxis_hook/__main__.py") and os.path.isfile(args[3])
    assert doc["stages"] == ["prestart"] and doc["when"] == {"always": True}
    assert any(e.startswith("PATH=") for e in doc["hook"]["env"])


def test_create_runtime_stage_and_config_env():
    doc = hook_document("createRuntime", hook_env(replace(Config(), source="/etc/pyxis-hook/site.conf")))
    _validate(doc)
    assert doc["stages"] == ["createRuntime"] and doc["hook"]["args"][-1] == "createRuntime"
    assert "PYXIS_HOOK_CONFIG=/etc/pyxis-hook/site.conf" in doc["hook"]["env"]


def test_bad_schema_documents_rejected():
    bad = hook_document()
    bad["stages"] = ["prestrt"]
    try:
        _validate(bad)
    except jsonschema.ValidationError:
        pass
    else:
        raise AssertionError("unknown stage accepted")


def test_cli_install(tmp_path):
    r = run_cli("hookd", "--install", str(tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "pyxis-hook.json").read_text())
    _validate(doc)
    # the installed hook actually starts: a void request exits 0 at once
    state = state_json(tmp_path, id="x", pid=os.getpid())
    (tmp_path / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "root": {"path": "rootfs"},
                                                      "process": {"env": ["PATH=/bin"], "args": ["sh"], "cwd": "/"}}))
    r = subprocess.run([doc["hook"]["path"], *doc["hook"]["args"][1:]], input=state, text=True,
                       capture_output=True, env=dict(e.split("=", 1) for e in doc["hook"]["env"]))
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""


def test_cli_install_missing_dir(tmp_path):
    r = run_cli("hookd", "--install", str(tmp_path / "no"))
    assert r.returncode == 2 and "not a directory" in r.stderr


def test_cli_install_precreate_next_to_prestart(tmp_path):
    for stage in ("prestart", "precreate"):
        r = run_cli("hookd", "--stage", stage, "--install", str(tmp_path))
        assert r.returncode == 0, r.stderr
    pre = json.loads((tmp_path / "pyxis-hook-precreate.json").read_text())
    _validate(pre)
    assert pre["stages"] == ["precreate"] and pre["hook"]["args"][-1] == "precreate"
    assert json.loads((tmp_path / "pyxis-hook.json").read_text())["stages"] == ["prestart"]


# ------------------------------------------------------------ one hook environment, absolute config


def test_hook_env_defaults_have_no_config():
    assert hook_env(Config()) == [HOOK_ENV_PATH]


def test_relative_config_is_registered_absolute(tmp_path):
    """`pyxis-hook --config pyxis.conf hookd` typed in /etc/pyxis-hook: the runtime runs hooks elsewhere."""
    (tmp_path / "pyxis.conf").write_text("")
    r = run_cli("hookd", conf="pyxis.conf", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    env = json.loads(r.stdout)["hook"]["env"]
    assert env == [HOOK_ENV_PATH, f"PYXIS_HOOK_CONFIG={tmp_path}/pyxis.conf"]


def test_install_text_needs_an_existing_dir(tmp_path):
    import pytest

    from pyxis_hook.errors import UsageError
    from pyxis_hook.engines.install import install_text

    with pytest.raises(UsageError, match=f"^{tmp_path}/no: not a directory$"):
        install_text(str(tmp_path / "no/pyxis-hook.json"), "{}")
    with pytest.raises(TypeError):
        install_text(str(tmp_path / "x.json"), "{}", require_dir=False)  # no such knob any more
    assert Path(install_text(str(tmp_path / "x.json"), "{}\n")).read_text() == "{}\n"
