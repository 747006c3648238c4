"""The modules a real GPU start loads: each is named in setup.cfg's prestart contract, and none is heavy.

`lint-imports` checks the prestart contract only for the modules listed in
it: a module that joins the hot path unlisted escapes the check that keeps
diag/, pyelftools and jsonschema off it.  The modules are those Python's
`-X importtime` lists plus those the start image holds (they run without
the import system).  This runs the hook as a runtime
does (`python -I -S .../__main__.py prestart`, a fake 4-GPU host, a small
image, a container stand-in in its own mount namespace) and compares.
"""

from __future__ import annotations

import configparser
import json
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.container import make_bundle, make_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus, make_host_tree
from fixtures.standin import start_standin

pytestmark = [pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _contract_modules() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return set(cfg["importlinter:contract:prestart"]["source_modules"].split())


@pytest.fixture(scope="module")
def gpu_start_modules(tmp_path_factory) -> list[str]:
    base = tmp_path_factory.mktemp("hot")
    driver = make_fake_driver(base / "driver")
    tree = make_host_tree(base / "host", gpus=fake_gpus(4), driver_version="535.104.05")  # the fake driver's
    conf = base / "pyxis.conf"
    conf.write_text(f'driver-root = "{driver}"\ndev-root = "{tree.dev_root}"\nproc-root = "{tree.proc_root}"\n'
                    f'snapshot-dir = "{base}/snapshot"\nno-cgroups = true\n')
    rootfs = make_rootfs(base / "rootfs", gputest=False)
    bundle = make_bundle(base / "bundle", rootfs, env=("NVIDIA_VISIBLE_DEVICES=all",
                                                       "NVIDIA_DRIVER_CAPABILITIES=compute,utility"))
    cmd = [sys.executable, "-X", "importtime", "-I", "-S", str(REPO / "pyxis_hook/__main__.py"), "prestart"]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYXIS_HOOK_CONFIG": str(conf)}
    from pyxis_hook import startimage

    # the first start then imports every module through the import system (-X importtime lists them all)
    # whatever an earlier run left
    Path(startimage.image_path()).unlink(missing_ok=True)
    names: list[str] = []
    # the first start checks pyxis.conf and builds the node artifact (making snapshot-dir), recording the
    # verdict in it; the second takes both and writes the start image; the third runs from it, plans and applies
    for _ in range(3):
        proc = start_standin(f'mount --bind "{rootfs}" "{rootfs}" && '
                             f'mount -t tmpfs tmpfs "{rootfs}/dev" && exec sleep 600')
        try:
            state = json.dumps({"ociVersion": "1.0.2", "id": "hot", "status": "creating", "pid": proc.pid,
                                "bundle": str(bundle)})
            r = subprocess.run(cmd, input=state.encode(), capture_output=True, env=env)
        finally:
            proc.kill()
            proc.wait()
        assert r.returncode == 0, r.stderr.decode()[-3000:]
        names = [line.split("|")[-1].strip() for line in r.stderr.decode().splitlines()
                 if line.startswith("import time:") and "self [us]" not in line]
    # what ran from the start image (pyxis_hook/startimage.py) bypassed the import system: -X importtime
    # does not list it
    return names + list(startimage.held(section="boot")) + list(startimage.held(section="start"))


def test_every_module_of_a_gpu_start_is_in_the_prestart_contract(gpu_start_modules):
    ours = {m for m in gpu_start_modules if m.startswith("pyxis_hook.")}
    packages = {m for m in ours if (REPO / m.replace(".", "/") / "__init__.py").exists()}
    assert "pyxis_hook.apply.child" in ours  # the start really applied a plan
    assert sorted(ours - packages - _contract_modules()) == []


def test_a_steady_gpu_start_imports_neither_jsonschema_nor_re(gpu_start_modules):
    """The verdict on pyxis.conf the node artifact records stands in for the schema check (spec/config.py)."""
    assert {"pyxis_hook.spec.config", "pyxis_hook.host.artifact"} <= set(gpu_start_modules)
    assert not {"jsonschema", "re", "pyxis_hook.spec.confcheck", "pyxis_hook.spec.schemafiles"} & set(gpu_start_modules)


def test_a_gpu_start_loads_no_heavy_stdlib_module(gpu_start_modules):
    """ctypes' __init__ (the syscalls use _ctypes: cabi.py), typing, re, json, dataclasses stay off.

    So does `os` (~1.5 ms of a ~32 ms start, with the ~30 ABCs of _collections_abc): the start's
    modules call `posix`, its builtin core, and `pyxis_hook.pathnames` for the path strings.  And
    `fcntl`, `resource`, `select` (three shared libraries to map, ~0.6 ms): the confined ldconfig's
    calls go through `_ctypes` (kernel/process.py).  And `struct` (its `_struct` is one more
    shared library): the ld.so.cache's words are read with memoryview.cast and int.from_bytes."""
    heavy = {"ctypes", "typing", "re", "json", "dataclasses", "enum", "logging", "subprocess", "argparse",
             "tomllib", "traceback", "elftools", "jsonschema", "os", "fcntl", "resource", "select",
             "struct", "_struct"}
    assert sorted(heavy & set(gpu_start_modules)) == []
