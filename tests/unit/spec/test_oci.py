"""spec/oci.py: state JSON and config.json parsing, validated with one-line errors."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.container import make_bundle
from fixtures.oci_state import state_json
from pyxis_hook.errors import OciError, PyxisHookError
from pyxis_hook.spec.oci import (
    MAX_CONFIG_BYTES,
    Bundle,
    LinuxDevice,
    StateError,
    env_map,
    load_bundle,
    parse_config,
    parse_state,
)


def state(**fields) -> bytes:
    """runc's state (fixtures.oci_state's shape) with `fields` changed; a field set to ... is left out."""
    doc = json.loads(state_json("/run/b", id="c1", pid=4242))
    doc.update(fields)
    return json.dumps({k: v for k, v in doc.items() if v is not ...}).encode()


# --- state -------------------------------------------------------------------


def test_state_runc_shape():
    s = parse_state(state(annotations={"a": "1"}))
    assert (s.oci_version, s.id, s.status, s.pid, s.bundle) == ("1.0.2", "c1", "creating", 4242, "/run/b")
    assert s.annotations == (("a", "1"),)


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


def test_state_pid_zero_only_where_crun_gives_it():
    """crun hands createContainer hooks pid 0: the CDI hook takes it, a negative pid still fails, said so."""
    assert parse_state(state(pid=0), allow_zero_pid=True).pid == 0
    with pytest.raises(StateError, match="'pid' must be a non-negative integer, got -1"):
        parse_state(state(pid=-1), allow_zero_pid=True)


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
    for k in {k for k, _ in pairs}:
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
    assert bundle.env[-2:] == (("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_VISIBLE_DEVICES", "1"))
    assert bundle.env_map()["NVIDIA_VISIBLE_DEVICES"] == "1"
    assert bundle.annotation_map() == {"x": "y"}
    assert bundle.linux_devices == ()
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


def test_bundle_devices_and_caps(tmp_path):
    doc = minimal(
        process={"env": ["A=1"], "capabilities": {"bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}},
        linux={"devices": [{"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229, "fileMode": 438},
                           {"path": "/dev/nvidia0"}]},
    )
    b = parse_config(json.dumps(doc).encode(), str(tmp_path))
    assert b.privileged
    assert b.bounding_capabilities == ("CAP_CHOWN", "CAP_SYS_ADMIN")
    assert b.linux_devices == (LinuxDevice(path="/dev/fuse", type="c", major=10, minor=229),
                               LinuxDevice(path="/dev/nvidia0", type="", major=None, minor=None))
    assert b.env_map() == {"A": "1"}


def test_bundle_not_privileged_without_cap_sys_admin(tmp_path):
    doc = minimal(process={"env": [], "capabilities": {"bounding": ["CAP_CHOWN"], "effective": ["CAP_SYS_ADMIN"]}})
    assert parse_config(json.dumps(doc).encode(), str(tmp_path)).privileged is False


def test_bundle_ignores_what_the_runtime_owns(tmp_path):
    """mounts, hooks, process.args/user, root.readonly, linux.cgroupsPath: never read, so never refused.

    The runtime validates them before it runs a hook; refusing them here
    would only make the hook fail a container the runtime accepted.
    """
    doc = minimal(
        root={"path": "rootfs", "readonly": "yes"},
        process={"env": ["A=1"], "args": 7, "user": {"uid": "0"}},
        mounts={"not": "a list"},
        hooks={"prestart": [{"args": []}]},
        linux={"cgroupsPath": 7, "namespaces": "odd"},
    )
    b = parse_config(json.dumps(doc).encode(), str(tmp_path))
    assert b == Bundle(path=str(tmp_path), config_path=str(tmp_path / "config.json"),
                       rootfs=str(tmp_path / "rootfs"), env=(("A", "1"),))


def test_bundle_defaults_for_a_synthetic_bundle():
    """A bundle that has no config.json (enroot's) needs only its paths; the rest defaults to empty."""
    b = Bundle(path="/r", config_path="", rootfs="/r", env=(("NVIDIA_VISIBLE_DEVICES", "all"),))
    assert b.annotation_map() == {} and b.linux_devices == () and not b.privileged
    assert b.env_map() == {"NVIDIA_VISIBLE_DEVICES": "all"}


@pytest.mark.parametrize(
    "doc, words",
    [
        ({"root": {"path": "r"}, "process": {}}, "'ociVersion' is missing"),
        (minimal(ociVersion=1), "'ociVersion' must be a string"),
        (minimal(root=...), "'root' is missing"),
        (minimal(root="rootfs"), "'root' must be an object"),
        (minimal(process=...), "'process' is missing"),
        (minimal(root={"path": ""}), "'root.path' is empty"),
        (minimal(root={}), "'root.path' is missing"),
        (minimal(root={"path": 1}), "'root.path' must be a string"),
        (minimal(process={"env": "A=1"}), "'process.env' must be a list of strings"),
        (minimal(process={"env": ["A=1", 2]}), "'process.env' must be a list of strings"),
        (minimal(process={"env": ["A=1", "BROKEN"]}), "process.env[1]: invalid environment variable 'BROKEN'"),
        (minimal(process={"capabilities": {"bounding": "CAP_SYS_ADMIN"}}),
         "'process.capabilities.bounding' must be a list of strings"),
        (minimal(process={"capabilities": []}), "'process.capabilities' must be an object"),
        (minimal(linux=[]), "'linux' must be an object"),
        (minimal(linux={"devices": {}}), "'linux.devices' must be a list"),
        (minimal(linux={"devices": ["/dev/x"]}), "'linux.devices[0]' must be an object"),
        (minimal(linux={"devices": [{"type": "c"}]}), "'linux.devices[0].path' is missing"),
        (minimal(linux={"devices": [{"path": "/dev/x", "type": 99}]}), "'linux.devices[0].type' must be a string"),
        (minimal(linux={"devices": [{"path": "/dev/x", "major": "1"}]}), "'linux.devices[0].major' must be an integer"),
        (minimal(linux={"devices": [{"path": "/dev/x", "minor": True}]}), "'linux.devices[0].minor' must be an integer"),
        (minimal(annotations={"a": 1}), "'annotations'['a']: expected a string"),
        (minimal(annotations=["a"]), "'annotations': expected an object of strings"),
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
    assert msg.startswith(str(tmp_path / "config.json") + ":") and "\n" not in msg


_device = st.fixed_dictionaries(
    {"path": st.text(min_size=1, max_size=12)},
    optional={"type": st.sampled_from("cbup"), "major": st.integers(0, 4095), "minor": st.integers(0, 1 << 20)},
)


@settings(max_examples=50)
@given(st.lists(_device, max_size=5))
def test_bundle_devices_round_trip(devices):
    b = parse_config(json.dumps(minimal(linux={"devices": devices})).encode(), "/b")
    assert b.linux_devices == tuple(
        LinuxDevice(d["path"], d.get("type", ""), d.get("major"), d.get("minor")) for d in devices)


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
                          "import sys, pyxis_hook.spec.oci; print(' '.join(sorted(sys.modules)))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert "elftools" not in out and "jsonschema" not in out


def test_import_pulls_no_typing():
    """Under the hook's own `-I -S` (no site, which imports typing itself), oci does not pay for `typing`."""
    import subprocess
    import sys

    import pyxis_hook

    top = os.path.dirname(os.path.dirname(os.path.abspath(pyxis_hook.__file__)))
    code = (f"import sys; sys.path.insert(0, {top!r}); import pyxis_hook.spec.oci; "
            "print(' '.join(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code],
                         capture_output=True, text=True, check=True).stdout.split()
    assert "pyxis_hook.spec.oci" in out
    assert "typing" not in out and "dataclasses" not in out and "inspect" not in out


def test_empty_state_says_so():
    from pyxis_hook.spec.oci import StateError, parse_state

    for data in (b"", b"  \n"):
        with pytest.raises(StateError, match="OCI state on stdin: empty"):
            parse_state(data)


def test_nul_bytes_in_paths_are_one_line_errors(tmp_path):
    import json as _json

    from pyxis_hook.spec.oci import OciError, StateError, load_bundle, parse_state

    with pytest.raises(StateError, match="'bundle' must be an absolute path"):
        parse_state(_json.dumps({"ociVersion": "1.0.2", "id": "x", "pid": 1, "bundle": "/tmp/a\u0000b"}).encode())
    (tmp_path / "config.json").write_text(_json.dumps({"ociVersion": "1.0.2", "root": {"path": "r\u0000"},
                                                       "process": {"env": [], "args": ["sh"], "cwd": "/"}}))
    with pytest.raises(OciError, match="'root.path' contains a NUL byte"):
        load_bundle(str(tmp_path))
