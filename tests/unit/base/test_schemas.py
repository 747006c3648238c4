"""Our JSON Schemas: each is a valid draft-07 schema with a unique $id, and every $ref resolves."""

from __future__ import annotations

import json

import pytest

from pyxis_hook.spec.schemafiles import schema_dir
from schema_check import lookup, validator

SCHEMAS = sorted(p.name for p in schema_dir().glob("*.json"))


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node["$ref"]
        for v in node.values():
            yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def test_ids_unique_and_named_after_files():
    ids = {}
    for name in SCHEMAS:
        doc = json.loads((schema_dir() / name).read_text())
        assert doc["$id"].endswith("/" + name), name
        assert doc["$id"] not in ids
        ids[doc["$id"]] = name


@pytest.mark.parametrize("name", SCHEMAS)
def test_schema_valid_and_refs_resolve(name):
    v = validator(name)  # check_schema: valid draft-07
    for ref in set(_refs(v.schema)):
        assert lookup(name, ref).contents is not None, (name, ref)
