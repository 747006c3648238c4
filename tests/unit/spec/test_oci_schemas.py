"""What the tests hand the hook, and what `install` registers, against the OCI runtime spec's own schemas.

The fixtures' config.json and state JSON stand in for what runc, crun and
podman give a hook: if they drifted from the runtime spec, every test built
on them would test a shape no runtime makes.  The schemas are the runtime
spec's, unmodified (tests/fixtures/upstream-schemas/README.md names the commit).
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from fixtures.container import make_bundle
from fixtures.oci_state import state_json

OCI = Path(__file__).resolve().parents[2] / "fixtures" / "upstream-schemas" / "oci-runtime-spec"


def _validator(name: str) -> jsonschema.Draft4Validator:
    registry = Registry()
    for path in OCI.glob("*.json"):
        registry = registry.with_resource(path.name, Resource.from_contents(json.loads(path.read_text()),
                                                                           default_specification=DRAFT4))
    return jsonschema.Draft4Validator(json.loads((OCI / name).read_text()), registry=registry)


def test_fixture_config_json_is_a_runtime_spec_config(tmp_path):
    hook = {"path": "/usr/libexec/pyxis-hook/pyxis-hook", "args": ["pyxis-hook", "prestart"], "timeout": 30}
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=0",), hooks={"prestart": [hook]},
                         annotations={"org.example/a": "b"})
    config = json.loads((Path(bundle) / "config.json").read_text())
    _validator("config-schema.json").validate(config)
    config["hooks"]["prestart"][0]["timeout"] = 0  # the spec says a timeout is greater than zero
    assert not _validator("config-schema.json").is_valid(config)


def test_fixture_state_is_a_runtime_spec_state(tmp_path):
    doc = json.loads(state_json(tmp_path, id="c1", pid=42, annotations={"a": "b"}))
    _validator("state-schema.json").validate(doc)
    doc["status"] = "starting"  # not one of the spec's states
    assert not _validator("state-schema.json").is_valid(doc)


def test_installed_hook_entry_is_a_runtime_spec_hook():
    from pyxis_hook.engines.hookd import hook_document, hook_env
    from pyxis_hook.spec.config import load_config

    for stage in ("prestart", "createRuntime"):
        hook = hook_document(stage, hook_env(load_config(None)), timeout=10)["hook"]
        assert _validator("defs.json").evolve(schema={"$ref": "defs.json#/definitions/Hook"}).is_valid(hook), hook
