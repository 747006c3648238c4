"""pyxis.conf loading and validation."""

from __future__ import annotations

import subprocess
import sys

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures import hosttree
from fixtures.cli import run_cli, write_conf
from fixtures.synthdriver import V, make_driver
from pyxis_hook import trust
from pyxis_hook.host import artifact
from pyxis_hook.spec import confcheck
from pyxis_hook.spec.config import (ALL_CAPABILITIES, Config, config_keys, holds, load_config, parse_config,
                                    read_config, toml_reader)
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.errors import ConfigError
from pyxis_hook.sysrecord import FACILITIES

REPO = __import__("pathlib").Path(__file__).resolve().parents[3]


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
    conf = tmp_path / "pyxis.conf"
    conf.write_text('log-level = "warning"\n')
    r = run_cli("config", "check", conf=conf)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"{conf}: valid\n", "")
    conf.write_text('cdi-kind = "nvidia.com"\n')
    r = run_cli("config", "check", conf=conf)
    assert r.returncode == 2 and r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert f"{conf}: key 'cdi-kind': 'nvidia.com' is not a string (matching " in r.stderr


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


# --- the verdict the node artifact records: a start checks a file once, not on every start -------------

@pytest.fixture
def node(tmp_path):
    """A pyxis.conf naming a fake node's driver and GPUs, and a snapshot-dir not made yet (a new node)."""
    root = make_driver(tmp_path / "root")
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    return write_conf(tmp_path / "pyxis.conf", driver_root=root, proc_root=host.proc_root, dev_root=host.dev_root,
                      snapshot_dir=tmp_path / "snap", extra='log-level = "warning"\n')


def _start(conf) -> str:
    """What a GPU start does with its configuration and the node artifact: how it got the inventory."""
    config, stored = read_config(str(conf), environ={})
    return artifact.obtain(config, strict=False, stored=stored)[1]


def _artifact(conf):
    """The node artifact in the configuration's snapshot-dir (the only one there)."""
    (path,) = (conf.parent / "snap").glob("inventory-*.json")
    return path


def _recorded(conf):
    """The artifact's document as stored."""
    import json

    return json.loads(_artifact(conf).read_bytes())


def _checks(monkeypatch) -> list:
    """The schema checks made from now on (each one still made)."""
    calls: list = []
    real = confcheck.problem
    monkeypatch.setattr(confcheck, "problem", lambda data: calls.append(data) or real(data))
    return calls


def test_a_new_nodes_first_start_records_the_verdict_and_the_next_skips_the_check(node, monkeypatch):
    """The first root start checks and builds the artifact with the verdict; the artifact is the one file kept."""
    calls = _checks(monkeypatch)
    assert _start(node) == "built" and len(calls) == 1
    snap = node.parent / "snap"
    assert [p.name for p in snap.iterdir() if not p.name.startswith(".")] == [_artifact(node).name]
    kept = _recorded(node)["pyxis_conf"][0]
    assert kept["text"] == node.read_text()
    assert kept["schema"] == list(confcheck.schema_file()[1])
    assert _start(node) == "read" and len(calls) == 1
    assert load_config(str(node), environ={}).log_level == "warning" and len(calls) == 1


def test_parse_config_alone_always_checks_and_reads_no_artifact(node, monkeypatch):
    """`doctor` and the tests parse bytes: always checked with jsonschema, no artifact read."""
    _start(node)
    monkeypatch.setattr(artifact, "read", lambda config: pytest.fail("artifact read"))
    calls = _checks(monkeypatch)
    parse_config(node.read_bytes(), str(node))
    assert len(calls) == 1


def test_a_steady_load_imports_neither_jsonschema_nor_re_and_reads_no_schema(node):
    watched = ("jsonschema", "pyxis_hook.spec.confcheck", "pyxis_hook.spec.schemafiles", "re")
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); "
            "from pyxis_hook import installpaths; installpaths.add(); "  # as __main__ does
            "from pyxis_hook.spec.config import read_config; from pyxis_hook.host import artifact; "
            f"config, stored = read_config({str(node)!r}, environ={{}}); "
            f"print(sorted(m for m in {watched!r} if m in sys.modules)); "
            "artifact.obtain(config, strict=False, stored=stored)")
    runs = [subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)]
    assert runs == [f"{sorted(watched)}\n", "[]\n"]  # checked and recorded in the build, then the verdict alone


def test_a_changed_file_is_checked_and_its_verdict_rewritten_into_the_fresh_artifact(node, monkeypatch):
    """Another log-level shares the artifact (its key is the discovery's keys): the verdict flips, the inventory stays."""
    _start(node)
    before = _recorded(node)
    node.write_text(node.read_text().replace("warning", "error"))
    calls = _checks(monkeypatch)
    assert _start(node) == "read" and len(calls) == 1
    after = _recorded(node)
    assert after["pyxis_conf"][0]["text"] == node.read_text()
    assert {k: v for k, v in after.items() if k != "pyxis_conf"} == {k: v for k, v in before.items() if k != "pyxis_conf"}
    assert oct(_artifact(node).stat().st_mode & 0o777) == "0o644"
    assert _start(node) == "read" and len(calls) == 1


def test_a_refused_file_is_never_recorded(node):
    _start(node)
    kept = _artifact(node).read_bytes()
    node.write_text(node.read_text().replace("warning", "loud"))
    for _ in range(2):  # refused on every start, by the same check
        with pytest.raises(ConfigError, match="key 'log-level': 'loud' is not one of"):
            _start(node)
    assert _artifact(node).read_bytes() == kept


@pytest.mark.parametrize("tamper", ["schema", "text", "mode", "owner", "format", "symlink", "none"])
def test_a_verdict_holds_only_for_the_same_text_schema_and_a_trusted_artifact(node, tamper):
    _start(node)
    text, path = node.read_text(), _artifact(node)
    config = parse_config(node.read_bytes(), str(node))
    assert holds(artifact.read(config)[1], text)
    doc = _recorded(node)
    if tamper == "schema":  # the schema file was rewritten or reinstalled since: another signature
        doc["pyxis_conf"][0]["schema"][4] += 1
    elif tamper == "text":
        doc["pyxis_conf"][0]["text"] += "# more\n"
    elif tamper == "format":
        doc["format"] = artifact.FORMAT - 1
    elif tamper == "none":  # an artifact built without a pyxis.conf
        doc["pyxis_conf"] = None
    if tamper in ("schema", "text", "format", "none"):
        path.write_text(__import__("json").dumps(doc))
    elif tamper == "mode":
        path.chmod(0o666)
    elif tamper == "owner":
        __import__("os").chown(path, 2001, 2001)
    else:
        target = node.parent / "elsewhere.json"
        target.write_bytes(path.read_bytes())
        path.unlink()
        path.symlink_to(target)
    assert not holds(artifact.read(config)[1], text)


def test_the_schema_file_changed_since_means_another_check(node, tmp_path, monkeypatch):
    """The real file's signature, not a recorded one tampered with: a reinstalled schema is checked against again."""
    import shutil

    schemas = tmp_path / "schemas"
    schemas.mkdir()
    shutil.copy(confcheck.schema_file()[0], schemas)
    monkeypatch.setattr("pyxis_hook.spec.schemafiles._schema_dir", lambda: str(schemas))
    monkeypatch.setattr(confcheck, "_loaded", [])
    _start(node)
    assert _recorded(node)["pyxis_conf"][0]["schema"][0] == str(schemas / confcheck.SCHEMA_FILE)
    calls = _checks(monkeypatch)
    schema = schemas / confcheck.SCHEMA_FILE
    schema.write_bytes(schema.read_bytes())  # rewritten in place: the same inode, a new mtime
    monkeypatch.setattr(confcheck, "_loaded", [])  # as a new process reads it
    assert _start(node) == "read" and len(calls) == 1
    assert _recorded(node)["pyxis_conf"][0]["schema"] == list(confcheck.schema_file()[1])
    assert _start(node) == "read" and len(calls) == 1


def test_only_the_package_owner_records_a_verdict(node, monkeypatch):
    monkeypatch.setattr(trust, "may_write", lambda: False)
    assert _start(node) == "discovered" and not (node.parent / "snap").exists()
    monkeypatch.undo()
    _start(node)
    kept = _artifact(node).read_bytes()
    node.write_text(node.read_text().replace("warning", "error"))
    monkeypatch.setattr(trust, "may_write", lambda: False)
    calls = _checks(monkeypatch)
    assert _start(node) == "read" and _start(node) == "read" and len(calls) == 2  # checked each time, never kept
    assert _artifact(node).read_bytes() == kept


def test_config_check_checks_whatever_verdict_was_recorded(node):
    """A verdict is trusted by a start (root recorded it); `config check` reads the file and checks it anyway."""
    _start(node)
    doc = _recorded(node)
    node.write_text(node.read_text().replace("warning", "loud"))
    doc["pyxis_conf"][0]["text"] = node.read_text()
    _artifact(node).write_text(__import__("json").dumps(doc))
    assert load_config(str(node), environ={}).log_level == "loud"
    r = run_cli("config", "check", conf=node)
    assert r.returncode == 2 and "key 'log-level': 'loud'" in r.stderr


def test_refresh_records_the_verdict(node):
    assert run_cli("refresh", conf=node).returncode == 0
    assert _recorded(node)["pyxis_conf"][0]["text"] == node.read_text()
    node.write_text(node.read_text().replace("warning", "error"))
    r = run_cli("refresh", conf=node)
    assert r.returncode == 0 and r.stdout.endswith(": fresh\n"), r.stdout
    assert _recorded(node)["pyxis_conf"][0]["text"] == node.read_text()


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


def _changed(conf) -> None:
    """pyxis.conf edited after the artifact recorded its verdict."""
    conf.write_text(conf.read_text().replace('log-level = "warning"', 'log-level = "error"'))


def test_a_no_gpu_start_records_a_changed_files_verdict(node, tmp_path, monkeypatch):
    """A start that ends at the no-GPU exit reads no artifact further, and still records the verdict it checked."""
    from fixtures.container import make_bundle
    from fixtures.oci_state import state_json
    from pyxis_hook import pipeline

    _start(node)
    _changed(node)
    config, stored = read_config(str(node), environ={})
    bundle = make_bundle(tmp_path / "bundle", env=("NVIDIA_VISIBLE_DEVICES=void",))
    assert pipeline.prestart(config, state_json(bundle).encode(), stored=stored) == 0
    assert _recorded(node)["pyxis_conf"][0]["text"] == node.read_text()
    calls = _checks(monkeypatch)
    load_config(str(node), environ={})
    assert calls == []


def test_an_enroot_no_gpu_start_records_a_changed_files_verdict(node, tmp_path, monkeypatch):
    """enroot's hook, ending at the no-GPU exit (the job asked for none), records the verdict it checked too."""
    import os

    from pyxis_hook import pipeline

    _start(node)
    _changed(node)
    config, stored = read_config(str(node), environ={})
    (tmp_path / "rootfs").mkdir()
    environ = tmp_path / "environ"
    environ.write_text("NVIDIA_VISIBLE_DEVICES=void\n")
    assert pipeline.enroot(config, {"ENROOT_PID": str(os.getpid()), "ENROOT_ROOTFS": str(tmp_path / "rootfs"),
                                    "ENROOT_ENVIRON": str(environ)}, stored) == 0
    assert _recorded(node)["pyxis_conf"][0]["text"] == node.read_text()


def test_a_rebuild_keeps_the_verdicts_whoever_asks_for_it(node):
    """A stale artifact rebuilt for a caller that read pyxis.conf itself (precreate, plan, `cdi generate` pass no
    Stored) keeps the verdicts it recorded: users' starts do not go back to checking the file."""
    import os

    from pyxis_hook.spec.config import load_config as load

    assert _start(node) == "built"
    before = _recorded(node)
    os.utime(before["inventory"]["sources"][0][0], (1, 1))  # a driver file changed: the artifact is stale
    assert artifact.obtain(load(str(node), environ={}), strict=False)[1] == "built"
    after = _recorded(node)
    assert after["inventory"]["sources"] != before["inventory"]["sources"]
    assert after["pyxis_conf"] == before["pyxis_conf"]


def test_a_command_records_a_changed_files_verdict(node):
    """A CDI hook step is a command (cli.main): it records the verdict it checked, as a start does."""
    _start(node)
    _changed(node)
    r = run_cli("info", "--json", conf=node)
    assert r.returncode == 0, r.stderr
    assert _recorded(node)["pyxis_conf"][0]["text"] == node.read_text()


def test_two_files_sharing_one_artifact_keep_both_verdicts(node, monkeypatch):
    """Files differing only in keys discovery does not read share one artifact: neither undoes the other's verdict."""
    other = node.with_name("other.conf")
    other.write_text(node.read_text().replace('log-level = "warning"', 'log-level = "info"'))
    _start(node)
    _start(other)
    assert [v["text"] for v in _recorded(node)["pyxis_conf"]] == [other.read_text(), node.read_text()]
    calls = _checks(monkeypatch)
    for _ in range(3):
        assert _start(node) == "read" and _start(other) == "read"
    assert calls == []


def test_at_most_verdicts_kept_texts_newest_first(node):
    from pyxis_hook.spec.config import VERDICTS_KEPT

    _start(node)
    for i in range(VERDICTS_KEPT + 2):
        node.write_text(node.read_text() + f"# edit {i}\n")
        _start(node)
    texts = [v["text"] for v in _recorded(node)["pyxis_conf"]]
    assert len(texts) == VERDICTS_KEPT and texts[0] == node.read_text()


def test_config_check_records_the_verdict_that_users_starts_then_take(node, monkeypatch):
    """Under Pyxis only users start containers and none may write: the admin's `config check` records it for them."""
    _start(node)
    _changed(node)
    r = run_cli("config", "check", conf=node)
    assert r.returncode == 0 and "valid" in r.stdout, r.stderr
    monkeypatch.setattr(trust, "may_write", lambda: False)  # a job's user, as the artifact's reader only
    calls = _checks(monkeypatch)
    assert _start(node) == "read" and calls == []
