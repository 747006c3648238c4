"""Validate documents against our JSON Schemas, with cross-schema `$ref`s resolved.

Every schema in schemas/ is registered under its `$id`, so `{"$ref": "gpus.schema.json"}`
inside info.schema.json resolves to the file next to it.
"""

from __future__ import annotations

import functools
import json

import jsonschema
from referencing import Registry, Resource

from pyxis_hook.spec.schemafiles import load_schema, schema_dir


@functools.lru_cache(maxsize=None)
def _registry() -> Registry:
    resources = []
    for path in sorted(schema_dir().glob("*.json")):
        doc = json.loads(path.read_text())
        resources.append((doc["$id"], Resource.from_contents(doc)))
    return Registry().with_resources(resources)


def validator(name: str) -> jsonschema.Draft7Validator:
    schema = load_schema(name)
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema, registry=_registry())


def validate(doc, name: str) -> None:
    """Raise jsonschema.ValidationError unless `doc` is valid against schemas/`name`."""
    validator(name).validate(doc)


def lookup(name: str, ref: str):
    """Resolve `ref` as it appears in schemas/`name` (raises referencing.exceptions.Unresolvable)."""
    base = load_schema(name)["$id"]
    return _registry().resolver(base_uri=base).lookup(ref)
