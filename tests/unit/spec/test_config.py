"""pyxis.conf loading and validation."""

from __future__ import annotations

import subprocess
import sys

import jsonschema
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fixtures.cli import run_cli
from pyxis_hook.spec.config import SCHEMA, Config, config_keys, load_config, parse_config, toml_reader, validate
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.errors import ConfigError


def test_defaults_when_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr("pyxis_hook.spec.config.DEFAULT_CONFIG_PATH", str(tmp_path / "absent.conf"))
    cfg = load_config(None, environ={})
    assert cfg == Config()
    assert cfg.driver_root == "/" and cfg.proc_root == "/proc" and cfg.ldconfig == "@/sbin/ldconfig"
    assert cfg.default_capabilities == ("utility", "compute")


def test_precedence_explicit_env_default(tmp_path, monkeypatch):
    a, b, c = (tmp_path / n for n in ("a.conf", "b.conf", "c.conf"))
    a.write_text('driver-root = "/a"\n')
    b.write_text('driver-root = "/b"\n')
    c.write_text('driver-root = "/c"\n')
    monkeypatch.setattr("pyxis_hook.spec.config.DEFAULT_CONFIG_PATH", str(c))
    assert load_config(str(a), environ={"PYXIS_HOOK_CONFIG": str(b)}).driver_root == "/a"
    assert load_config(None, environ={"PYXIS_HOOK_CONFIG": str(b)}).driver_root == "/b"
    assert load_config(None, environ={}).driver_root == "/c"


def test_values_parsed(tmp_path):
    cfg = parse_config(b'driver-root = "/x"\nno-cgroups = true\ndefault-capabilities = ["compute"]\n', "f")
    assert cfg.driver_root == "/x" and cfg.no_cgroups is True
    assert cfg.default_capabilities == ("compute",)
    assert cfg.source == "f"


@pytest.mark.parametrize(
    "text, needle",
    [
        (b'driver-rot = "/x"', "unknown key 'driver-rot'"),
        (b"no-cgroups = 1", "key 'no-cgroups': 1 is not a boolean"),
        (b'log-level = "loud"', "key 'log-level': 'loud' is not one of debug, info, warning, error"),
        (b'driver-root = "relative"', "key 'driver-root': 'relative' is not a string (an absolute path)"),
        (b'default-capabilities = ["compute", "gfx"]', "key 'default-capabilities[1]': 'gfx'"),
        (b'ldcache = "fast"', "key 'ldcache'"),
        (b"driver-root = ", "not valid TOML"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_config_is_one_line(text, needle):
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "/etc/pyxis-hook/pyxis.conf")
    msg = str(exc.value)
    assert needle in msg
    assert msg.startswith("/etc/pyxis-hook/pyxis.conf: ")
    assert "\n" not in msg


def test_cli_bad_config_exit_2_no_traceback(tmp_path):
    conf = tmp_path / "pyxis.conf"
    conf.write_text('log-level = "loud"\n')
    r = run_cli("info", conf=conf)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert str(conf) in r.stderr and "log-level" in r.stderr


def test_cli_missing_config_file(tmp_path):
    r = run_cli("info", conf=tmp_path / "nope")
    assert r.returncode == 2
    assert "nope: cannot read configuration" in r.stderr


def test_the_toml_reader_is_tomllib_else_tomli_else_one_line(monkeypatch):
    """Python >= 3.11 reads with tomllib; before, tomli; without tomli, a non-flat file is a ConfigError naming it."""
    assert toml_reader().__name__ == ("tomllib" if sys.version_info >= (3, 11) else "tomli")
    monkeypatch.setitem(sys.modules, "tomli", None)  # as if not installed
    flat, beyond = b'driver-root = "/opt/nvidia"\n', b'driver-root = "/opt/nv\\u0069dia"\n'
    assert parse_config(flat, "x.conf").driver_root == "/opt/nvidia"  # flattoml's: no reader asked
    if sys.version_info >= (3, 11):
        assert parse_config(beyond, "x.conf").driver_root == "/opt/nvidia"
    else:
        with pytest.raises(ConfigError, match=r"^x\.conf: .*tomli: it is not installed$"):
            parse_config(beyond, "x.conf")


def test_every_config_field_is_in_schema():
    schema = load_schema("pyxis-conf.schema.json")
    assert set(config_keys()) == set(schema["properties"])


def test_version():
    r = run_cli("--version")
    from pyxis_hook import __version__

    assert r.stdout.strip() == f"pyxis-hook {__version__}"


_scalars = st.one_of(st.booleans(), st.integers(-3, 3), st.text(max_size=6),
                     st.sampled_from(["/", "/x", "@/sbin/ldconfig", "merge", "debug", "compute", "gfx", ""]))
_values = st.one_of(_scalars, st.lists(_scalars, max_size=3))
_docs = st.dictionaries(st.sampled_from(list(config_keys()) + ["bogus", "log_level"]), _values, max_size=4)


@settings(max_examples=300, deadline=None)
@given(_docs)
def test_our_validator_agrees_with_jsonschema(doc):
    """The hot-path validator accepts exactly what jsonschema accepts for our schema."""
    schema = load_schema("pyxis-conf.schema.json")
    ours = validate(doc) is None  # the code's copy of the schema, as a start validates
    theirs = jsonschema.Draft7Validator(schema).is_valid(doc)
    assert ours == theirs, (doc, validate(doc))


#: what `validate` reads of a schema; every other keyword of the file must be one that constrains nothing
_VALIDATION = {"type", "enum", "pattern", "items", "uniqueItems", "additionalProperties", "properties"}
_ANNOTATIONS = {"$schema", "$id", "title", "description", "default"}


def _as_validated(node, where="schema"):
    """`node` (a schema) with only what `validate` reads; AssertionError for a keyword it would ignore."""
    unknown = set(node) - _VALIDATION - _ANNOTATIONS
    assert not unknown, f"{where}: validate() does not implement {sorted(unknown)}"
    out = {k: v for k, v in node.items() if k in _VALIDATION}
    if "items" in out:
        out["items"] = _as_validated(out["items"], f"{where}.items")
    if "properties" in out:
        out["properties"] = {k: _as_validated(v, f"{where}.{k}") for k, v in out["properties"].items()}
    return out


def test_the_code_schema_is_the_file_schema():
    """A start validates against config.SCHEMA, not the file: an edit to either must be made to both."""
    assert SCHEMA == _as_validated(load_schema("pyxis-conf.schema.json"))


def test_a_changed_schema_file_is_told_apart():
    """The check above fails for an enum value added to the file, and for a keyword validate() ignores."""
    import copy

    schema = copy.deepcopy(load_schema("pyxis-conf.schema.json"))
    schema["properties"]["log-level"]["enum"].append("trace")
    assert SCHEMA != _as_validated(schema)
    schema = copy.deepcopy(load_schema("pyxis-conf.schema.json"))
    schema["properties"]["log-file"]["maxLength"] = 10
    with pytest.raises(AssertionError, match="maxLength"):
        _as_validated(schema)


def test_a_start_reads_no_schema_file(tmp_path, monkeypatch):
    """Loading pyxis.conf opens only pyxis.conf: the schema it checks against is code."""
    import builtins

    conf = tmp_path / "pyxis.conf"
    conf.write_text('driver-root = "/x"\nlog-level = "loud"\n')
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: opened.append(f) or real_open(f, *a, **k))
    with pytest.raises(ConfigError, match="log-level"):
        load_config(str(conf), environ={})
    assert not any("schema" in str(f) for f in opened)


def test_installed_schemas_found_by_walking_up_from_the_package(tmp_path):
    """A --prefix (or /usr/local, or venv) install: schemas in <prefix>/share, found from the package, under -I -S."""
    import shutil
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    site = tmp_path / "p/lib/python3.11/site-packages"
    shutil.copytree(repo / "pyxis_hook", site / "pyxis_hook", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(repo / "schemas", tmp_path / "p/share/pyxis-hook/schemas")
    code = f"import sys; sys.path.insert(0, {str(site)!r}); from pyxis_hook.spec.schemafiles import schema_dir; print(schema_dir())"
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == str(tmp_path / "p/share/pyxis-hook/schemas")


def _schema_patterns(node) -> set[str]:
    if isinstance(node, dict):
        return ({node["pattern"]} if "pattern" in node else set()) | set().union(*map(_schema_patterns, node.values()))
    if isinstance(node, list):
        return set().union(*map(_schema_patterns, node))
    return set()


def test_every_schema_pattern_has_a_string_check():
    """The hook validates pyxis.conf on every start without importing re: a new pattern needs its check."""
    from pyxis_hook.spec.config import PATTERN_CHECKS

    assert _schema_patterns(load_schema("pyxis-conf.schema.json")) == set(PATTERN_CHECKS)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="/@aZ09._-:é \n\t", max_size=12), st.sampled_from(sorted(_schema_patterns(
    load_schema("pyxis-conf.schema.json")))))
@example("nvidia.com/gpu", "^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
@example("nvidia.com/gpu\n", "^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
@example("Nvidia.com/gpu", "^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
@example("n/g/x", "^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
@example("/var/log/x\n", "^(/.*)?$")
@example("/a\nb", "^(/.*)?$")
@example("@/sbin/ldconfig", "^@?/")
def test_string_checks_agree_with_re_search(value, pattern):
    import re

    from pyxis_hook.spec.config import PATTERN_CHECKS

    assert PATTERN_CHECKS[pattern](value) == (re.search(pattern, value) is not None)


def test_a_nul_byte_in_a_value_names_the_key():
    for text, key in ((b'log-file = "/tmp/a\\u0000b"\n', "log-file"), (b'path = ["/bin", "/x\\u0000"]\n', "path")):
        with pytest.raises(ConfigError, match=f"^p.conf: key '{key}': contains a NUL byte$"):
            parse_config(text, "p.conf")
