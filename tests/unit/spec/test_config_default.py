"""`pyxis-hook config default`: every key at its built-in default, commented, and a valid pyxis.conf."""

from __future__ import annotations

import jsonschema

from fixtures.cli import run_cli
from pyxis_hook.spec.config import Config, parse_config, toml_reader
from pyxis_hook.spec.schemafiles import load_schema


def test_config_default_is_the_defaults_and_validates(tmp_path):
    r = run_cli("config", "default")
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert parse_config(r.stdout.encode(), "default") == Config()
    schema = load_schema("pyxis-conf.schema.json")
    doc = toml_reader().loads(r.stdout)
    jsonschema.validate(doc, schema)
    lines = r.stdout.splitlines()
    for key, prop in schema["properties"].items():
        at = next(i for i, line in enumerate(lines) if line.lstrip("# ").startswith(f"{key} = "))
        assert lines[at - 1].startswith("# "), key  # its description above it
        assert prop.get("description", "").split()[0] in " ".join(lines[max(0, at - 6):at]), key
    assert "log-file" not in doc  # its default is unset: written commented out
    assert all(len(line) <= 101 for line in lines)


def test_config_default_written_where_the_hook_reads_it_changes_nothing(tmp_path):
    conf = tmp_path / "pyxis.conf"
    conf.write_text(run_cli("config", "default").stdout)
    r = run_cli("info", "--json", conf=conf)
    assert "cannot read configuration" not in r.stderr and "Traceback" not in r.stderr
