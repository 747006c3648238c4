"""oci.py: state JSON and config.json parsing, validated with one-line errors."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.container import make_bundle
from pyxis_hook.errors import OciError, PyxisHookError
from pyxis_hook.oci import (
    MAX_CONFIG_BYTES,
    StateError,
    env_map,
    load_bundle,
    parse_config,
    parse_state,
)


def state(**fields) -> bytes:
    doc = {"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 4242, "bundle": "/run/b"}
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


# --- state -------------------------------------------------------------------


def test_state_runc_shape():
    s = parse_state(state(annotations={"a": "1"}))
    assert (s.oci_version, s.id, s.status, s.pid, s.bundle) == ("1.0.2", "c1", "creating", 4242, "/run/b")
    assert s.annotation_map() == {"a": "1"}


def test_state_crun_shape_with_extra_root_field():
    s = parse_state(state(ociVersion="1.0", status="created", root="/run/b/rootfs"))
    assert s.status == "created" and s.bundle == "/run/b"


def test_state_legacy_bundle_path():
    s = parse_state(state(bundle=..., bundlePath="/old/b"))
    assert s.bundle == "/old/b"


def test_state_bundle_wins_over_bundle_path():
    assert parse_state(state(bundlePath="/old")).bundle == "/run/b"


@pytest.mark.parametrize(
    "data, words",
    [
        (state(bundle=...), "'bundle' is missing"),
        (state(bundle="rel/b"), "absolute path"),
        (state(bundle=7), "absolute path"),
        (state(pid=...), "'pid' is missing"),
        (state(pid=0), "positive integer"),
        (state(pid=-3), "positive integer"),
        (state(pid="12"), "positive integer"),
        (state(pid=True), "positive integer"),
        (state(id=5), "'id' must be a string"),
        (state(annotations=["x"]), "annotations"),
        (state(annotations={"k": 1}), "annotations"),
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b"\xff\xfe", "not UTF-8"),
        (b"", "empty"),
    ],
)
def test_state_rejects(data, words):
    with pytest.raises(StateError) as e:
        parse_state(data)
    msg = str(e.value)
    assert words in msg and "\n" not in msg
    assert e.value.exit_code == 2


def test_state_pid_optional_for_plan():
    assert parse_state(state(pid=...), require_pid=False).pid is None
    with pytest.raises(StateError):
        parse_state(state(pid=0), require_pid=False)


@settings(max_examples=200)
@given(st.binary(max_size=200) | st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.sampled_from(["bundle", "pid", "id", "annotations",
                                                                          "bundlePath", "status"]), c, max_size=4),
    max_leaves=8).map(lambda v: json.dumps(v).encode()))
def test_state_never_raises_anything_else(data):
    try:
        s = parse_state(data)
    except PyxisHookError as e:
        assert "\n" not in str(e)
    else:
        assert s.bundle.startswith("/") and s.pid > 0


# --- env ---------------------------------------------------------------------


def test_env_last_duplicate_wins():
    env = env_map(["A=1", "NVIDIA_VISIBLE_DEVICES=all", "B=", "NVIDIA_VISIBLE_DEVICES=0,1"])
    assert env == {"A": "1", "B": "", "NVIDIA_VISIBLE_DEVICES": "0,1"}


def test_env_value_may_contain_equals():
    assert env_map(["X=a=b"]) == {"X": "a=b"}


def test_env_without_equals_is_error():
    with pytest.raises(OciError, match="invalid environment variable 'JUSTNAME'"):
        env_map(["A=1", "JUSTNAME"])


def test_env_pairs_accepted():
    assert env_map([("A", "1"), ("A", "2")]) == {"A": "2"}


@given(st.lists(st.tuples(st.sampled_from("ABC"), st.text(max_size=3))))
def test_env_map_is_last_wins(pairs):
    m = env_map([f"{k}={v}" for k, v in pairs])
    for k in set(k for k, _ in pairs):
        assert m[k] == [v for kk, v in pairs if kk == k][-1]
    assert set(m) == {k for k, _ in pairs}


# --- bundle ------------------------------------------------------------------


def test_bundle_from_fixture_writer(tmp_path):
    b = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_VISIBLE_DEVICES=1"),
                    annotations={"x": "y"}, readonly=True)
    bundle = load_bundle(str(b))
    assert bundle.path == str(b)
    assert bundle.config_path == str(b / "config.json")
    assert bundle.rootfs == str(b / "rootfs")  # relative root.path joined to the bundle
    assert bundle.readonly is True
    assert bundle.env[-2:] == (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_VISIBLE_DEVICES", "1"))
    assert bundle.env_map()["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert bundle.annotation_map() == {"x": "y"}
    assert bundle.process_args == ("/bin/true",)
    assert [m.destination for m in bundle.mounts][:2] == ["/proc", "/dev"]
    assert bundle.mounts[1].options[0] == "nosuid"
    assert (bundle.uid, bundle.gid) == (0, 0)
    assert bundle.privileged is False


def test_bundle_absolute_root_and_relative_dir(tmp_path, monkeypatch):
    make_bundle(tmp_path / "b", rootfs=tmp_path / "elsewhere" / "root")
    monkeypatch.chdir(tmp_path)
    bundle = load_bundle("b")
    assert bundle.path == str(tmp_path / "b")
    assert bundle.rootfs == str(tmp_path / "elsewhere" / "root")


def minimal(**extra) -> dict:
    doc = {"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"args": ["sh"], "env": []}}
    doc.update(extra)
    return doc


def test_bundle_fields_devices_hooks_caps(tmp_path):
    doc = minimal(
        process={"env": ["A=1"], "user": {"uid": 1000, "gid": 100},
                 "capabilities": {"bounding": ["CAP_SYS_ADMIN"]}},
        linux={"devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229}],
               "cgroupsPath": "/slurm/job_1"},
        hooks={"prestart": [{"path": "/usr/bin/pyxis-hook", "args": ["pyxis-hook", "prestart"]}]},
    )
    b = parse_config(json.dumps(doc).encode(), str(tmp_path))
    assert (b.uid, b.gid) == (1000, 100)
    assert b.privileged
    assert b.linux_devices[0].path == "/dev/fuse" and b.linux_devices[0].minor == 229
    assert b.hooks[0].stage == "prestart" and b.hooks[0].args == ("pyxis-hook", "prestart")
    assert b.cgroups_path == "/slurm/job_1"
    assert b.process_args == ()


@pytest.mark.parametrize(
    "doc, words",
    [
        ({"root": {"path": "r"}, "process": {}}, "'ociVersion' is missing"),
        (minimal(root=...), "'root' is missing"),
        (minimal(process=...), "'process' is missing"),
        (minimal(root={"path": ""}), "'root.path' is empty"),
        (minimal(root={}), "'root.path' is missing"),
        (minimal(root={"path": "r", "readonly": "yes"}), "'root.readonly' must be true or false"),
        (minimal(process={"env": "A=1"}), "'process.env' must be a list of strings"),
        (minimal(process={"env": ["A=1", "BROKEN"]}), "process.env[1]: invalid environment variable 'BROKEN'"),
        (minimal(process={"user": {"uid": "0"}}), "'process.user.uid' must be an integer"),
        (minimal(mounts=[{"type": "bind"}]), "'mounts[0].destination' is missing"),
        (minimal(mounts={}), "'mounts' must be a list"),
        (minimal(linux={"devices": [{"path": "/dev/x", "major": "1"}]}), "'linux.devices[0].major'"),
        (minimal(annotations={"a": 1}), "annotations"),
        (minimal(hooks={"prestart": [{"args": []}]}), "'hooks.prestart[0].path' is missing"),
        ([], "'' must be an object"),
    ],
)
def test_bundle_rejects(tmp_path, doc, words):
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if v is not ...}
    (tmp_path / "config.json").write_text(json.dumps(doc))
    with pytest.raises(OciError) as e:
        load_bundle(str(tmp_path))
    msg = str(e.value)
    assert words in msg, msg
    assert str(tmp_path / "config.json") in msg and "\n" not in msg


def test_bundle_bad_json_names_file(tmp_path):
    (tmp_path / "config.json").write_text('{"ociVersion": ')
    with pytest.raises(OciError, match=r"config\.json: not valid JSON: .* line 1"):
        load_bundle(str(tmp_path))


def test_bundle_missing_config(tmp_path):
    with pytest.raises(OciError, match="config.json: cannot open: No such file"):
        load_bundle(str(tmp_path))


def test_bundle_symlinked_config_refused(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(minimal()))
    b = tmp_path / "b"
    b.mkdir()
    os.symlink(real, b / "config.json")
    with pytest.raises(OciError, match="symbolic link"):
        load_bundle(str(b))


def test_bundle_config_must_be_regular(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(OciError, match="not a regular file"):
        load_bundle(str(tmp_path))


def test_bundle_config_size_limited(tmp_path):
    with open(tmp_path / "config.json", "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(OciError, match="larger than"):
        load_bundle(str(tmp_path))


def test_import_is_cheap():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-I", "-c",
                          "import sys, pyxis_hook.oci; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert "elftools" not in out and "jsonschema" not in out


def test_empty_state_says_so():
    from pyxis_hook.oci import StateError, parse_state

    for data in (b"", b"  \n"):
        with pytest.raises(StateError, match="OCI state on stdin: empty"):
            parse_state(data)


def test_nul_bytes_in_paths_are_one_line_errors(tmp_path):
    import json as _json

    from pyxis_hook.oci import OciError, StateError, load_bundle, parse_state

    with pytest.raises(StateError, match="'bundle' must be an absolute path"):
        parse_state(_json.dumps({"ociVersion": "1.0.2", "id": "x", "pid": 1, "bundle": "/tmp/a\u0000b"}).encode())
    (tmp_path / "config.json").write_text(_json.dumps({"ociVersion": "1.0.2", "root": {"path": "r\u0000"},
                                                       "process": {"env": [], "args": ["sh"], "cwd": "/"}}))
    with pytest.raises(OciError, match="'root.path' contains a NUL byte"):
        load_bundle(str(tmp_path))
