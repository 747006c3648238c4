"""pyxis.conf loading and validation."""

from __future__ import annotations

import posix
import stat
import subprocess
import sys

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.cli import run_cli
from pyxis_hook import trust
from pyxis_hook.spec import confcheck, confverdict
from pyxis_hook.spec.config import ALL_CAPABILITIES, Config, config_keys, load_config, parse_config, toml_reader
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.errors import ConfigError
from pyxis_hook.sysrecord import FACILITIES

REPO = __import__("pathlib").Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def _private_default_snapshot_dir(tmp_path, monkeypatch):
    """A file naming no snapshot-dir keeps its verdict in a private one, not the node's /var/cache/pyxis-hook."""
    monkeypatch.setattr("pyxis_hook.spec.config.DEFAULT_SNAPSHOT_DIR", str(tmp_path / "default-snapshot"))


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
        (b'default-capabilities = ["compute", "compute"]', "key 'default-capabilities': ['compute', 'compute'] repeats"),
        (b'default-capabilities = "compute"', "key 'default-capabilities': 'compute' is not a list of one of compute"),
        (b'path = ["/bin", "bin"]', "key 'path[1]': 'bin' is not a string (an absolute path)"),
        (b'ldconfig = "sbin/ldconfig"', "key 'ldconfig': 'sbin/ldconfig' is not a string (an absolute path, '@' first"),
        (b'cdi-kind = "Nvidia.com/gpu"', "key 'cdi-kind': 'Nvidia.com/gpu' is not a string (matching ^[a-z0-9]"),
        (b'log-file = "/var/log/a\\nb"', "key 'log-file': '/var/log/a\\nb' is not a string (an absolute path or"),
        (b'ldcache = "fast"', "key 'ldcache'"),
        (b"[driver-root]\nx = 1", "key 'driver-root': {'x': 1} is not a string"),
        (b"log-level = 1979-05-27", "key 'log-level': datetime.date(1979, 5, 27) is not one of"),
        (b'log-level = "loud"\nbogus = 1', "key 'log-level'"),
        (b'bogus = 1\nlog-level = "loud"', "unknown key 'bogus' (known keys: cdi-kind, cuda-compat,"),
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


@pytest.mark.parametrize("text, needle", [
    ('bogus = true\n', "unknown key 'bogus'"),
    ("no-cgroups = 1\n", "key 'no-cgroups': 1 is not a boolean"),
    ('snapshot-dir = "var/cache"\n', "key 'snapshot-dir': 'var/cache' is not a string (an absolute path)"),
])
def test_a_gpu_start_refuses_a_bad_config_in_one_line(tmp_path, text, needle):
    """The runtime's own command line (`__main__.py prestart`, no site scan): the same line, nothing else."""
    conf = tmp_path / "pyxis.conf"
    conf.write_text(text)
    (tmp_path / "config.json").write_text('{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}')
    from fixtures.oci_state import state_json

    r = subprocess.run([sys.executable, "-I", "-S", str(REPO / "pyxis_hook/__main__.py"), "prestart"],
                       input=state_json(tmp_path), capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "PYXIS_HOOK_CONFIG": str(conf)})
    assert r.returncode == 2, r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"{conf}: {needle}" in r.stderr


def test_config_check(tmp_path):
    conf, snap = _conf(tmp_path)
    r = run_cli("config", "check", conf=conf)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{conf}: valid\n", "")
    conf.write_text('cdi-kind = "nvidia.com"\n')
    r = run_cli("config", "check", conf=conf)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert f"{conf}: key 'cdi-kind': 'nvidia.com' is not a string (matching " in r.stderr


def test_config_check_checks_whatever_verdict_was_kept(tmp_path):
    """A verdict is trusted by a start (root kept it); `config check` reads the file and checks it anyway."""
    conf, snap = _conf(tmp_path, 'log-level = "loud"\n')
    schema, signature, _ = confcheck.schema_file()
    confverdict.keep(conf.read_bytes(), str(conf), str(snap), schema, signature)
    assert load_config(str(conf), environ={}).log_level == "loud"
    r = run_cli("config", "check", conf=conf)
    assert r.returncode == 2 and "key 'log-level': 'loud'" in r.stderr


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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_docs)
def test_every_refusal_is_one_line_naming_a_key_of_the_file(doc):
    """jsonschema decides; what a refusal says is one line naming the first bad key in the file's order."""
    problem = confcheck.problem(doc)
    assert (problem is None) == jsonschema.Draft7Validator(load_schema("pyxis-conf.schema.json")).is_valid(doc)
    if problem is not None:
        assert "\n" not in problem
        named = [k for k in doc if f"key '{k}'" in problem or f"key '{k}[" in problem]
        assert named, problem
        first_bad = next(k for k in doc if confcheck.problem({k: doc[k]}))
        assert named[0] == first_bad, (problem, doc)


def test_the_schema_names_what_the_code_takes():
    """The enums the code acts on are the schema's: a facility log.configure knows, a capability the planner knows."""
    props = load_schema("pyxis-conf.schema.json")["properties"]
    assert props["syslog-facility"]["enum"] == list(FACILITIES)
    assert props["default-capabilities"]["items"]["enum"] == list(ALL_CAPABILITIES)
    assert props["supported-capabilities"]["items"]["enum"] == list(ALL_CAPABILITIES)


# --- the kept verdict: a start checks a file once, not on every start -------------------------------

def _conf(tmp_path, text='log-level = "warning"\n'):
    """A pyxis.conf and its snapshot-dir, which the node artifact's first build would have made."""
    snap = tmp_path / "snap"
    snap.mkdir(mode=0o755, exist_ok=True)
    conf = tmp_path / "pyxis.conf"
    conf.write_text(f'snapshot-dir = "{snap}"\n' + text)
    return conf, snap


def _verdict(conf, snap):
    from pathlib import Path

    return Path(confverdict.verdict_path(str(conf), str(snap)))


def test_a_checked_file_keeps_its_verdict_and_the_next_load_skips_the_check(tmp_path, monkeypatch):
    conf, snap = _conf(tmp_path)
    assert load_config(str(conf), environ={}).log_level == "warning"
    verdict = _verdict(conf, snap)
    assert verdict.read_bytes().endswith(conf.read_bytes())
    assert oct(verdict.stat().st_mode & 0o777) == "0o644"
    monkeypatch.setattr(confcheck, "problem", lambda data: pytest.fail("checked again"))
    assert load_config(str(conf), environ={}).log_level == "warning"


def test_parse_config_alone_neither_reads_nor_keeps_a_verdict(tmp_path, monkeypatch):
    """`doctor` and the tests parse bytes: always checked with jsonschema, nothing written."""
    conf, snap = _conf(tmp_path)
    parse_config(conf.read_bytes(), str(conf))
    assert not _verdict(conf, snap).exists()
    load_config(str(conf), environ={})
    calls = []
    monkeypatch.setattr(confcheck, "problem", lambda data: calls.append(data))
    parse_config(conf.read_bytes(), str(conf))
    assert len(calls) == 1


def test_a_steady_load_imports_neither_jsonschema_nor_re_and_reads_no_schema(tmp_path):
    conf, _ = _conf(tmp_path)
    watched = ("jsonschema", "pyxis_hook.spec.confcheck", "pyxis_hook.spec.schemafiles", "re")
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            "from pyxis_hook import installpaths; installpaths.add(); "  # as __main__ does
            f"from pyxis_hook.spec.config import load_config; load_config({str(conf)!r}, environ={{}}); "
            f"print(sorted(m for m in {watched!r} if m in sys.modules))")
    runs = [subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs == [f"{sorted(watched)}\n", "[]\n"]  # checked and kept, then the verdict alone


def test_a_changed_file_is_checked_again(tmp_path):
    conf, snap = _conf(tmp_path)
    load_config(str(conf), environ={})
    conf.write_text(f'snapshot-dir = "{snap}"\nlog-level = "loud"\n')
    with pytest.raises(ConfigError, match="key 'log-level': 'loud' is not one of"):
        load_config(str(conf), environ={})
    assert b"loud" not in _verdict(conf, snap).read_bytes()  # the refused bytes are never kept


@pytest.mark.parametrize("tamper", ["schema", "mode", "owner", "body", "format", "symlink"])
def test_a_verdict_holds_only_for_the_same_bytes_schema_and_a_trusted_file(tmp_path, tamper):
    conf, snap = _conf(tmp_path)
    load_config(str(conf), environ={})
    raw, verdict = conf.read_bytes(), _verdict(conf, snap)
    assert confverdict.holds(raw, str(conf), str(snap))
    kept = verdict.read_bytes()
    if tamper == "schema":  # the schema file was rewritten or reinstalled since: another signature
        schema_path, _, _ = confcheck.schema_file()
        verdict.write_bytes(kept.replace(kept.split(b"\n")[1], f"0 0 0 0 0 {schema_path}".encode()))
    elif tamper == "mode":
        verdict.chmod(0o666)
    elif tamper == "owner":
        __import__("os").chown(verdict, 2001, 2001)
    elif tamper == "body":
        verdict.write_bytes(kept + b"# more\n")
    elif tamper == "format":
        verdict.write_bytes(kept.replace(b"verdict 1", b"verdict 0", 1))
    else:
        target = tmp_path / "elsewhere.ok"
        target.write_bytes(kept)
        verdict.unlink()
        verdict.symlink_to(target)
    assert not confverdict.holds(raw, str(conf), str(snap))


def test_only_the_package_owner_keeps_a_verdict(tmp_path, monkeypatch):
    conf, snap = _conf(tmp_path)
    monkeypatch.setattr(trust, "may_write", lambda: False)
    assert load_config(str(conf), environ={}).log_level == "warning"
    assert not _verdict(conf, snap).exists()


def test_a_new_nodes_first_check_makes_snapshot_dir_and_keeps_its_verdict(tmp_path):
    """One level, mode 0755 whatever the umask, so the second start already skips the check."""
    conf, snap = _conf(tmp_path)
    snap.rmdir()
    old = posix.umask(0o077)
    try:
        assert load_config(str(conf), environ={}).log_level == "warning"
    finally:
        posix.umask(old)
    assert snap.is_dir() and stat.S_IMODE(snap.stat().st_mode) == 0o755
    assert confverdict.holds(conf.read_bytes(), str(conf), str(snap))


def test_no_verdict_where_snapshot_dirs_parent_is_missing(tmp_path):
    conf, snap = _conf(tmp_path)
    snap.rmdir()
    deep = tmp_path / "no" / "such" / "dir"
    conf.write_text(conf.read_text().replace(str(snap), str(deep)))
    assert load_config(str(conf), environ={}).log_level == "warning"
    assert not (tmp_path / "no").exists()


def test_a_missing_schema_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(confcheck, "_loaded", [])
    monkeypatch.setattr("pyxis_hook.spec.schemafiles._schema_dir", lambda: str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"nowhere/pyxis-conf.schema.json: cannot read the configuration's schema: "):
        parse_config(b'log-level = "info"\n', "p.conf")


@pytest.mark.parametrize("site, share", [
    ("p/lib/python3.11/site-packages", "p/share/pyxis-hook/schemas"),  # pip --prefix, a venv, /usr/local
    ("usr/lib/python3/dist-packages", "usr/share/pyxis-hook/schemas"),  # a .deb
    ("usr/lib/python3.11/site-packages", "usr/share/pyxis-hook/schemas"),  # an .rpm
    ("home/u/.local/lib/python3.11/site-packages", "home/u/.local/share/pyxis-hook/schemas"),  # pip --user
    ("t", "t/share/pyxis-hook/schemas"),  # pip --target
])
def test_installed_schemas_found_by_walking_up_from_the_package(tmp_path, site, share):
    """An installed copy: the wheel's data files (or a distribution package's) in <prefix>/share, found from the
    package under -I -S, and pyxis.conf checked against them."""
    import shutil

    shutil.copytree(REPO / "pyxis_hook", tmp_path / site / "pyxis_hook", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "schemas", tmp_path / share)
    code = (f"import sys; sys.path.insert(0, {str(tmp_path / site)!r}); "
            "from pyxis_hook import installpaths; installpaths.add(); "
            "from pyxis_hook.spec.schemafiles import schema_dir; from pyxis_hook.spec import confcheck; "
            "print(schema_dir()); print(confcheck.problem({'log-level': 'loud'}))")
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == [str(tmp_path / share), "key 'log-level': 'loud' is not one of debug, info, warning, error"]


def test_a_nul_byte_in_a_value_names_the_key():
    for text, key in ((b'log-file = "/tmp/a\\u0000b"\n', "log-file"), (b'path = ["/bin", "/x\\u0000"]\n', "path")):
        with pytest.raises(ConfigError, match=f"^p.conf: key '{key}': contains a NUL byte$"):
            parse_config(text, "p.conf")


def test_without_jsonschema_a_changed_file_is_refused_in_one_line(monkeypatch):
    """A node python3 without jsonschema: the file cannot be checked, so it is not used, and the line says why."""
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # import jsonschema raises ImportError
    with pytest.raises(ConfigError) as e:
        parse_config(b'log-level = "info"\n', "/etc/pyxis-hook/pyxis.conf")
    assert str(e.value).startswith("/etc/pyxis-hook/pyxis.conf: cannot be checked: ")
    assert "python3-jsonschema" in str(e.value) and "\n" not in str(e.value)
