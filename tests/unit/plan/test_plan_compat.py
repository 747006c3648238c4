"""CUDA forward compat in the plan: NVIDIA's decision rule, and what it does to the ldcache update."""

from __future__ import annotations

import os

import pytest

from fixtures.container import make_bundle
from fixtures.synth import build_lib
from pyxis_hook.spec import oci
from pyxis_hook.spec.config import Config
from pyxis_hook.plan.prepare import prepare
from pyxis_hook.commands.plan import plan_json
from pyxis_hook.plan.build import COMPAT_DIR, ContainerFacts, cuda_compat, ldcache_update
from pyxis_hook.record import replace
from schema_check import validate
from unit.plan.test_plan import VERSION, _plan, world  # noqa: F401 - the module-scoped fixture

HOST = "535.216.03"
ROWS = (("libcuda.so.550.54.15", "libcuda.so.1", 0x303), ("libcuda.so", "libcuda.so", 0x303))


def facts(libcuda="libcuda.so.550.54.15", drivers=None, problem="", **kw) -> ContainerFacts:
    return ContainerFacts(rootfs="/r", compat_libcuda=libcuda, compat_drivers=drivers,
                          compat_libs=ROWS if libcuda else (), compat_problem=problem, **kw)


@pytest.mark.parametrize("libcuda,drivers,host,expect", [
    ("libcuda.so.550.54.15", None, HOST, True),  # no note: newer major
    ("libcuda.so.535.300.01", None, HOST, False),  # no note: same major, newer minor is not enough
    ("libcuda.so.470.1.1", None, HOST, False),  # older
    ("libcuda.so.550.54.15", (470, 535), HOST, True),  # note lists the host branch, newer
    ("libcuda.so.550.54.15", (525, 545), HOST, False),  # note does not list the host branch
    ("libcuda.so.535.300.01", (535,), HOST, True),  # note: full version compared
    ("libcuda.so.535.216.03", (535,), HOST, False),  # equal is not newer
    ("libcuda.so.550.54.15", (), HOST, False),  # a note listing no branch
    ("libcuda.so.550.54.15", None, None, False),  # host version unknown
    ("libcuda.so.550.54.15", None, "garbage", False),
])
def test_nvidia_rule(libcuda, drivers, host, expect):
    use, note = cuda_compat(Config(), ("utility", "compute"), facts(libcuda, drivers), host)
    assert use is expect
    assert note.startswith("cuda-compat: ") and "\n" not in note
    assert ("comes first" in note) is expect


def test_only_for_compute_and_ldconfig_mode():
    use, note = cuda_compat(Config(), ("utility",), facts(), HOST)
    assert not use and "compute capability" in note
    use, note = cuda_compat(Config(cuda_compat="disabled", source="/etc/pyxis.conf"), ("compute",), facts(), HOST)
    assert not use and "cuda-compat = 'disabled' in /etc/pyxis.conf" in note
    assert cuda_compat(Config(), ("compute",), facts(libcuda=""), HOST) == (False, "")


def test_ldcache_update_puts_compat_first_in_both_modes():
    lib = "/usr/lib/x86_64-linux-gnu"
    row = (lib, f"libcuda.so.{HOST}", "libcuda.so.1", 0x303)
    up, problems = ldcache_update(Config(ldcache="merge"), facts(), (lib,), (row,), compat=True)
    assert not problems and up.mode == "merge"
    assert (up.first_dirs, up.lib_dirs) == ((COMPAT_DIR,), (COMPAT_DIR, lib))
    assert set(up.libs) == {row} | {(COMPAT_DIR, n, s, f) for n, s, f in ROWS}
    up, _ = ldcache_update(Config(ldcache="ldconfig"), facts(), (lib,), (row,), compat=True)
    assert (up.mode, up.first_dirs, up.lib_dirs, up.libs) == ("ldconfig", (COMPAT_DIR,), (COMPAT_DIR, lib), ())
    # what the merge cannot index: ldconfig runs, compat still first on its command line
    up, _ = ldcache_update(Config(ldcache="merge"), facts(problem="has a subdirectory tls"), (lib,), (row,),
                           compat=True)
    assert up.mode == "ldconfig" and up.lib_dirs[0] == COMPAT_DIR and "subdirectory tls" in up.why
    # not chosen: nothing changes
    up, _ = ldcache_update(Config(ldcache="merge"), facts(), (lib,), (row,))
    assert (up.first_dirs, up.lib_dirs, up.libs) == ((), (lib,), (row,))


def test_build_plan_explains_and_validates(world):  # noqa: F811
    base = world[0]
    f = ContainerFacts(rootfs=str(base / "rootfs"), compat_libcuda="libcuda.so.999.1.2", compat_libs=ROWS)
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, facts=f)
    assert plan.ldcache.first_dirs == (COMPAT_DIR,) and plan.ldcache.lib_dirs[0] == COMPAT_DIR
    assert any(n.startswith("cuda-compat: /usr/local/cuda/compat comes first") for n in plan.notes)
    assert not plan.problems
    assert plan_json(plan)["ldcache"]["first_dirs"] == [COMPAT_DIR]
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "utility"}, facts=f)
    assert plan.ldcache.first_dirs == () and COMPAT_DIR not in plan.ldcache.lib_dirs
    assert any("compute capability" in n for n in plan.notes)
    # an older compat: left out, said so
    older = replace(f, compat_libcuda="libcuda.so.470.1.1")
    _, plan = _plan(world, {"NVIDIA_VISIBLE_DEVICES": "0"}, facts=older)
    assert plan.ldcache.first_dirs == ()
    assert any("not newer than the host driver" in n for n in plan.notes)


def test_prepare_reads_the_images_compat_dir(world, tmp_path):  # noqa: F811
    """The whole planning path: container_facts on a real rootfs, the plan JSON valid against the schema."""
    from pyxis_hook.commands.plan import to_json

    cfg = world[2]
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=1",))
    rootfs = tmp_path / "b/rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "etc/debian_version").write_text("12\n")
    (rootfs / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    d = rootfs / COMPAT_DIR.lstrip("/")
    build_lib(d, "libcuda.so.1", filename="libcuda.so.999.1.2")
    os.symlink("libcuda.so.999.1.2", d / "libcuda.so.1")
    prepared = prepare(cfg, oci.load_bundle(str(bundle)))
    up = prepared.plan.ldcache
    assert up.first_dirs == (COMPAT_DIR,)
    assert (COMPAT_DIR, "libcuda.so.999.1.2", "libcuda.so.1", 0x303) in up.libs
    doc = to_json(prepared)
    validate(doc, "plan.schema.json")
    assert doc["plan"]["ldcache"]["first_dirs"] == [COMPAT_DIR]
