"""The hook's early exit for containers that ask for no GPU (at most 1.3x a bare interpreter).

`start.first_look` must agree with `request.void_request` (the full
path's decision) and return False, never guess, on anything unusual.  Its
point is what it does *not* import, checked in a fresh interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.oci_state import state_json
import pyxis_hook
from pyxis_hook import errors
from pyxis_hook.spec import oci
from pyxis_hook.pipeline import documents
from pyxis_hook.start import first_look
from pyxis_hook.spec.request import void_request

NAMES = st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "CUDA_VERSION", "NVIDIA_REQUIRE_CUDA", "PATH", "X"])
VALUES = st.sampled_from(["", "all", "void", "none", "0,1", " , ", "void,0", "12.2", "cuda>=11", " void "])


@settings(max_examples=150, deadline=None)
@given(env=st.lists(st.tuples(NAMES, VALUES), max_size=6))
def test_agrees_with_void_request(tmp_path_factory, env):
    bundle = tmp_path_factory.mktemp("b")
    entries = [f"{k}={v}" for k, v in env]
    (bundle / "config.json").write_text(json.dumps({"ociVersion": "1.0.2", "process": {"env": entries},
                                                    "root": {"path": "rootfs"}}))
    expected = void_request(oci.env_map(entries)) is not None
    assert first_look(state_json(bundle).encode())[0] is expected


def test_unusual_input_takes_the_full_path(tmp_path):
    assert not first_look(b"")[0]
    assert not first_look(b"{not json")[0]
    assert not first_look(json.dumps({"bundle": "relative"}).encode())[0]
    assert not first_look(state_json(tmp_path / "missing").encode())[0]
    (tmp_path / "config.json").write_text('{"process": {"env": ["NOEQUALS"]}}')
    assert not first_look(state_json(tmp_path).encode())[0]
    real = tmp_path / "real.json"
    real.write_text('{"process": {"env": []}}')
    os.unlink(tmp_path / "config.json")
    os.symlink(real, tmp_path / "config.json")  # never followed, as oci.read_config_bytes
    assert not first_look(state_json(tmp_path).encode())[0]
    os.unlink(tmp_path / "config.json")
    os.mkfifo(tmp_path / "config.json")  # not a regular file: oci.read_config_bytes refuses it, so no early docs
    fifo = os.open(tmp_path / "config.json", os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fifo, b'{"process": {"env": ["PATH=/bin"]}}')  # what a reader would find there now
        assert first_look(state_json(tmp_path).encode()) == (False, None)
    finally:
        os.close(fifo)


_GPU_CONFIG = {"ociVersion": "1.0.2", "process": {"env": ["NVIDIA_VISIBLE_DEVICES=0", "PATH=/bin"],
                                                  "capabilities": {"bounding": ["CAP_CHOWN"]}},
               "root": {"path": "rootfs"}, "annotations": {"a": "b"},
               "linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}


def test_the_full_path_takes_the_early_documents(tmp_path):
    """A GPU start parses the state and config.json once: what `first_look` read is what the full path reads."""
    (tmp_path / "config.json").write_text(json.dumps(_GPU_CONFIG))
    data = state_json(tmp_path, annotations={"x": "y"}).encode()
    void, docs = first_look(data)
    assert not void and docs is not None
    expected = (oci.parse_state(data), oci.load_bundle(str(tmp_path)))
    os.unlink(tmp_path / "config.json")  # read once only: the full path does not open it again
    assert documents(data, None, docs) == expected


def test_early_documents_of_another_file_are_not_used(tmp_path):
    """A bundle path through a link and '..' opens one file, normalised another: the full path reads its own."""
    (tmp_path / "deep/real").mkdir(parents=True)
    (tmp_path / "deep/b").mkdir()
    (tmp_path / "b").mkdir()
    os.symlink(tmp_path / "deep/real", tmp_path / "link")
    (tmp_path / "deep/b/config.json").write_text(json.dumps(_GPU_CONFIG))
    theirs = {**_GPU_CONFIG, "process": {"env": ["NVIDIA_VISIBLE_DEVICES=1"]}}
    (tmp_path / "b/config.json").write_text(json.dumps(theirs))
    data = state_json(f"{tmp_path}/link/../b").encode()
    void, docs = first_look(data)  # the kernel follows the link: deep/b
    assert not void and docs[2] == _GPU_CONFIG
    state, bundle = documents(data, None, docs)  # normalised, as oci.load_bundle always did: b
    assert bundle == oci.load_bundle(state.bundle) and bundle.env == (("NVIDIA_VISIBLE_DEVICES", "1"),)


def test_bad_early_documents_fail_as_the_full_path_does(tmp_path):
    """A config.json the early exit parsed but oci refuses is the same one-line error either way."""
    import pytest

    (tmp_path / "config.json").write_text(json.dumps({"process": {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}}))
    data = state_json(tmp_path).encode()
    void, docs = first_look(data)
    assert not void
    with pytest.raises(errors.OciError) as early:
        documents(data, None, docs)
    with pytest.raises(errors.OciError) as full:
        documents(data)
    assert str(early.value) == str(full.value)


def _loaded(importtime: bytes) -> set[str]:
    """The modules a run with `-X importtime` loaded: those it lists, and the image's boot section's when current.

    What runs from the start image's boot section (pyxis_hook/startimage.py,
    written by an earlier GPU start of this checkout) bypasses the import
    system, so importtime does not list it.
    """
    from pyxis_hook import startimage

    listed = {line.split("|")[-1].strip() for line in importtime.decode().splitlines() if line.startswith("import time:")}
    return listed | (set(startimage.held(section="boot")) if not startimage.state(section="boot")[1] else set())


def test_void_exit_imports_almost_nothing(tmp_path):
    """`python -I -S .../__main__.py prestart` for a no-GPU container loads none of the heavy modules."""
    (tmp_path / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/bin"]}}))
    main = os.path.join(os.path.dirname(pyxis_hook.__file__), "__main__.py")
    r = subprocess.run([sys.executable, "-X", "importtime", "-I", "-S", main, "prestart"],
                       input=state_json(tmp_path).encode(), capture_output=True)
    assert r.returncode == 0, r.stderr
    loaded = _loaded(r.stderr)
    heavy = {"os", "json", "re", "logging", "subprocess", "argparse", "tomllib", "dataclasses", "pyxis_hook.spec.config",
             "pyxis_hook.spec.oci", "pyxis_hook.spec.request", "pyxis_hook.log", "pyxis_hook.cli"}
    assert "pyxis_hook.start" in loaded
    assert not heavy & loaded, sorted(loaded)
    # of ours, only these: every other package `__init__` would be one more module on each start
    # (`installpaths` is __main__'s own code, kept as cached bytecode instead of compiled on each run)
    assert {m for m in loaded if m.startswith("pyxis_hook")} == {
        "pyxis_hook", "pyxis_hook.startimage", "pyxis_hook.trust", "pyxis_hook.installpaths",
        "pyxis_hook.start", "pyxis_hook.nogpu", "pyxis_hook.fastjson"}


def test_enroot_shim_call_skips_the_cli():
    """`python -I -S .../__main__.py enroot`, the shim's call, runs without argparse or the other commands."""
    main = os.path.join(os.path.dirname(pyxis_hook.__file__), "__main__.py")
    r = subprocess.run([sys.executable, "-X", "importtime", "-I", "-S", main, "enroot"], capture_output=True,
                       env={"PATH": os.environ["PATH"]})
    assert r.returncode != 0
    errors = [line for line in r.stderr.decode().splitlines() if not line.startswith("import time:")]
    assert len(errors) == 1 and "ENROOT_PID" in errors[0], errors  # the hook's own one-line error
    loaded = _loaded(r.stderr)
    assert "pyxis_hook.start" in loaded
    assert not {"argparse", "os", "pyxis_hook.cli", "pyxis_hook.commands.plan", "pyxis_hook.commands.doctor"} & loaded


def test_deeply_nested_state_is_one_line_not_a_traceback():
    """The C scanner raises RecursionError on deep nesting: the early exit must not let it out."""
    r = subprocess.run([sys.executable, "-m", "pyxis_hook", "prestart"], input="[" * 200000,
                       capture_output=True, text=True)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr[-500:]
    assert "OCI state on stdin" in r.stderr


def test_main_runs_as_a_file_by_relative_path_and_through_a_symlink(tmp_path):
    """__main__.py finds its package without `os` (~1 ms of the no-GPU path): from a relative path and through a link to it."""
    main = os.path.join(os.path.dirname(pyxis_hook.__file__), "__main__.py")
    link = tmp_path / "hook-main.py"
    link.symlink_to(main)
    rel = os.path.relpath(main, tmp_path)
    for argv in ([str(link)], [rel]):
        r = subprocess.run([sys.executable, "-I", "-S", *argv, "--version"], cwd=tmp_path, capture_output=True,
                           text=True)
        assert r.returncode == 0 and r.stdout.startswith("pyxis-hook "), (argv, r.stderr)


def test_a_relative_or_empty_interpreter_path_never_picks_a_venv_from_the_working_directory(tmp_path):
    """runc runs hooks in the bundle dir: a pyvenv.cfg planted above it must not choose root's imports."""
    main = os.path.join(os.path.dirname(pyxis_hook.__file__), "__main__.py")
    (tmp_path / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (tmp_path / "b").mkdir()
    (tmp_path / "bundle").mkdir()
    code = ("import sys, runpy\n"
            "before = sys.prefix\n"
            "sys.executable = %r\n"
            "sys.argv = ['m', '--version']\n"
            "try:\n"
            "    runpy.run_path(%r)\n"
            "except SystemExit:\n"
            "    pass\n"
            "print(sys.prefix == before, any(p.startswith(%r) for p in sys.path))\n")
    for exe in ("", "b/python3"):
        r = subprocess.run([sys.executable, "-I", "-S", "-c", code % (exe, main, str(tmp_path))],
                           cwd=tmp_path / "bundle", capture_output=True, text=True)
        assert r.stdout.split()[-2:] == ["True", "False"], (exe, r.stdout, r.stderr)


def _gc_after_main_fast(tmp_path, env: list[str], pid: bool) -> tuple[int, str]:
    """(exit code, gc.isenabled()) of `start.dispatch(["prestart"])` for a bundle with `env`, in a fresh interpreter."""
    (tmp_path / "config.json").write_text(json.dumps({"process": {"env": env}}))
    state = json.loads(state_json(tmp_path))
    if not pid:
        state.pop("pid", None)
    code = ("import gc, io, sys; from pyxis_hook import start; "
            f"sys.stdin = io.TextIOWrapper(io.BytesIO({json.dumps(state).encode()!r})); "
            "rc = start.dispatch(['prestart']); print(rc, gc.isenabled())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYXIS_HOOK_CONFIG": str(tmp_path / "none.conf")})
    rc, enabled = r.stdout.split()
    return int(rc), enabled


def test_the_gc_is_off_only_past_the_no_gpu_exit(tmp_path):
    """A no-GPU start keeps the interpreter as it is; a GPU start runs with the cyclic GC off."""
    assert _gc_after_main_fast(tmp_path, ["PATH=/bin"], True) == (0, "True")
    rc, enabled = _gc_after_main_fast(tmp_path, ["NVIDIA_VISIBLE_DEVICES=all"], False)  # fails early: no pid
    assert rc != 0 and enabled == "False"


def test_the_command_script_imports_no_re(tmp_path):
    """bin/pyxis-hook (what pip installs as `pyxis-hook`) runs the fast dispatch without pip's `import re`."""
    (tmp_path / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/bin"]}}))
    repo = os.path.dirname(os.path.dirname(pyxis_hook.__file__))
    r = subprocess.run([sys.executable, "-X", "importtime", "-S", os.path.join(repo, "bin", "pyxis-hook"), "prestart"],
                       input=state_json(tmp_path).encode(), capture_output=True, env={"PYTHONPATH": repo})
    assert r.returncode == 0, r.stderr
    loaded = _loaded(r.stderr)
    assert "pyxis_hook.start" in loaded and "re" not in loaded, sorted(loaded)


def test_the_runtimes_call_ends_without_teardown(tmp_path):
    """`prestart` as the runtime calls it skips the interpreter's teardown, keeping its status and its line.

    An atexit handler stands for the teardown: it must not run, while the
    one error line (buffered in sys.stderr) still reaches the runtime and the
    exit status is the error's.
    """
    main = os.path.join(os.path.dirname(pyxis_hook.__file__), "__main__.py")
    code = ("import atexit, runpy, sys; atexit.register(lambda: sys.stderr.write('teardown ran\\n')); "
            f"sys.argv = [{main!r}, 'prestart']; runpy.run_path({main!r}, run_name='__main__')")
    (tmp_path / "config.json").write_text(json.dumps({"process": {"env": ["PATH=/bin"]}}))
    for stdin, status in ((b"{not json", errors.USAGE), (state_json(tmp_path).encode(), 0)):
        r = subprocess.run([sys.executable, "-I", "-S", "-c", code], input=stdin, capture_output=True, text=False)
        err = r.stderr.decode()
        assert r.returncode == status, err
        assert "teardown ran" not in err
        if status:
            assert len(err.splitlines()) == 1 and err.startswith("pyxis-hook: "), err


def test_the_command_lines_a_start_runs_without_the_parser():
    """One table says which command lines skip the parser and load the start image's boot section first."""
    from pyxis_hook import startimage

    assert startimage.fast_kind(["prestart"]) == "prestart" == startimage.fast_kind(["createRuntime"])
    assert startimage.fast_kind(["enroot"]) == "enroot"
    for argv in ([], ["prestart", "--bundle", "/b"], ["cdi", "hook", "create-symlinks"], ["plan"], ["enroot", "x"]):
        assert startimage.fast_kind(argv) is None, argv


def test_the_early_look_reads_no_state_the_full_path_would_refuse_for_its_size():
    """The full path takes the early look's state document without `parse_state`'s size check: the cap covers it."""
    from pyxis_hook import start
    from pyxis_hook.spec import oci

    assert start.FIRST_LOOK_LIMIT <= oci.MAX_STATE_BYTES
