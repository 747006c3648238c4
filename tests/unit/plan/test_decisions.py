"""The decision cache: a start whose inputs are all unchanged takes an earlier start's plan, and only then.

Each case plans through `prepare(..., cache=True)` as prestart does, on a
fake 4-GPU host and driver, and compares with `prepare` without the cache
(what `pyxis-hook plan` shows).  A plan from the cache comes without a
request (`Prepared.request is None`): that is how a case tells a hit.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from fixtures.container import make_bundle
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus, make_host_tree
from pyxis_hook.errors import PyxisHookError
from pyxis_hook.plan import decisionkeep, decisions
from pyxis_hook.plan.prepare import prepare
from pyxis_hook.record import replace
from pyxis_hook.spec import oci
from pyxis_hook.spec.config import Config

VERSION = "535.216.03"


def _world(base: Path) -> tuple[Config, object, list]:
    gpus = fake_gpus(4)
    tree = make_host_tree(base / "host", gpus=gpus, driver_version=VERSION)
    driver = make_fake_driver(base / "driver", version=VERSION)
    config = Config(driver_root=str(driver), dev_root=str(tree.dev_root), proc_root=str(tree.proc_root),
                    snapshot_dir=str(base / "snap"), source=str(base / "pyxis.conf"))
    return config, tree, gpus


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return _world(tmp_path_factory.mktemp("decisions"))


def _bundle(path: Path, env: tuple[str, ...], *, debian: bool = True):
    bundle = make_bundle(path, env=env)
    etc = path / "rootfs/etc"
    etc.mkdir(parents=True, exist_ok=True)
    if debian:
        (etc / "debian_version").write_text("12\n")
    return oci.load_bundle(str(bundle))


def _warm(config, bundle):
    """Plan until the cache serves the start (the first start of a host builds the snapshot: nothing kept)."""
    for _ in range(3):
        prepared = prepare(config, bundle, check=True, cache=True, confine=False)
        if prepared.request is None:
            return prepared
    raise AssertionError("the cache never served this start")


def _fresh(config, bundle):
    return prepare(config, bundle, check=True, confine=False)


SHAPES = {
    "all": ("NVIDIA_VISIBLE_DEVICES=all",),
    "two-utility": ("NVIDIA_VISIBLE_DEVICES=0,2", "NVIDIA_DRIVER_CAPABILITIES=utility"),
    "one-all-caps": ("NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=all"),
    "by-uuid": ("NVIDIA_VISIBLE_DEVICES={uuid2}",),
    "cuda-image": ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_REQUIRE_CUDA=cuda>=12.0", "CUDA_VERSION=12.2.0"),
    "legacy-cuda-image": ("CUDA_VERSION=11.8.0",),
    "slurm-step": ("NVIDIA_VISIBLE_DEVICES=all", "SLURM_STEP_GPUS=1,3", "SLURM_JOB_ID=7"),
    "control-only": ("NVIDIA_VISIBLE_DEVICES=none",),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_cached_plan_is_the_plan_a_fresh_start_makes(world, tmp_path, shape):
    config, _tree, gpus = world
    env = tuple(e.format(uuid2=gpus[2].uuid) for e in SHAPES[shape])
    bundle = _bundle(tmp_path / "b", env)
    cached = _warm(config, bundle)
    fresh = _fresh(config, bundle)
    assert fresh.request is not None and not fresh.request.void
    assert cached.plan == fresh.plan
    assert cached.plan.rootfs == bundle.rootfs
    assert cached.allocated == fresh.allocated == (shape == "slurm-step")  # the enroot hook exports then


def test_another_container_of_the_same_image_takes_the_decision_with_its_own_rootfs(world, tmp_path):
    config, _tree, _gpus = world
    _warm(config, _bundle(tmp_path / "one", ("NVIDIA_VISIBLE_DEVICES=all",)))
    other = _bundle(tmp_path / "two", ("NVIDIA_VISIBLE_DEVICES=all",))
    served = prepare(config, other, check=True, cache=True, confine=False)
    assert served.request is None and served.plan.rootfs == other.rootfs
    assert served.plan == _fresh(config, other).plan


def test_variables_the_request_never_read_do_not_make_another_decision(world, tmp_path):
    config, _tree, _gpus = world
    base = ("NVIDIA_VISIBLE_DEVICES=all", "SLURM_STEP_GPUS=0,1")
    _warm(config, _bundle(tmp_path / "job7", base + ("SLURM_JOB_ID=7", "PATH=/bin")))
    job8 = _bundle(tmp_path / "job8", base + ("SLURM_JOB_ID=8", "PATH=/usr/bin", "HOME=/root"))
    assert prepare(config, job8, check=True, cache=True, confine=False).request is None
    other_gpus = _bundle(tmp_path / "job9", ("NVIDIA_VISIBLE_DEVICES=all", "SLURM_STEP_GPUS=2", "SLURM_JOB_ID=9"))
    decided = prepare(config, other_gpus, check=True, cache=True, confine=False)
    assert decided.request is not None and decided.request.gpu_minors == (2,)


def _socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()


def _touch(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


# each: what changes between two starts of the same container, and must give a new decision
CHANGES = {
    "a GPU's procfs facts": lambda cfg, b, tree: (Path(cfg.proc_root) / "driver/nvidia/gpus").iterdir().__next__()
    .joinpath("information").write_text("Model: \t NVIDIA Other\nBus Location: \t 0000:99:00.0\nDevice Minor: \t 0\n"),
    "a driver file": lambda cfg, b, tree: _touch(next(Path(cfg.driver_root).rglob("libcuda.so.*"))),
    "a /proc/driver/nvidia text": lambda cfg, b, tree: (Path(cfg.proc_root) / "driver/nvidia/params")
    .write_text("ModifyDeviceFiles: 0\n"),
    "a daemon's socket": lambda cfg, b, tree: _socket(Path(cfg.driver_root) / "var/run/nvidia-persistenced/socket"),
    "the image's family": lambda cfg, b, tree: (Path(b.rootfs) / "etc/debian_version").unlink(),
    "a file at a link path": lambda cfg, b, tree: (Path(b.rootfs) / "usr/lib/x86_64-linux-gnu").mkdir(
        parents=True, exist_ok=True) or (Path(b.rootfs) / "usr/lib/x86_64-linux-gnu/libcuda.so.1").write_text("x"),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_each_input_that_changes_makes_a_new_decision(tmp_path, change):
    config, tree, _gpus = _world(tmp_path / "w")
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"))
    _warm(config, bundle)
    CHANGES[change](config, bundle, tree)
    again = prepare(config, bundle, check=False, cache=True, confine=False)
    assert again.request is not None  # decided afresh
    assert again.plan == prepare(config, bundle, check=False, confine=False).plan


def test_another_configuration_is_another_decision(world, tmp_path):
    config, _tree, _gpus = world
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    _warm(config, bundle)
    narrower = replace(config, default_capabilities=("utility",))
    decided = prepare(narrower, bundle, check=True, cache=True, confine=False)
    assert decided.request is not None and decided.request.capabilities == ("utility",)


@pytest.mark.parametrize("damage", ["garbage", "writable by others", "truncated"])
def test_a_damaged_or_untrusted_decision_file_is_not_used(tmp_path, damage):
    config, _tree, _gpus = _world(tmp_path / "w")
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    _warm(config, bundle)
    (path,) = Path(config.snapshot_dir).glob("decisions-*.bin")
    if damage == "garbage":
        path.write_bytes(b"\0" * 64)
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    else:
        path.chmod(0o666)
    again = prepare(config, bundle, check=True, cache=True, confine=False)
    assert again.request is not None and again.plan == _fresh(config, bundle).plan


def test_a_mig_device_named_by_uuid_is_never_taken_from_the_cache(tmp_path):
    config, _tree, _gpus = _world(tmp_path / "w")
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    _warm(config, bundle)
    before = sorted(Path(config.snapshot_dir).glob("decisions-*.bin"))
    mig = _bundle(tmp_path / "m", ("NVIDIA_VISIBLE_DEVICES=MIG-4f1b2a3c-0000-0000-0000-000000000001",))
    with pytest.raises(PyxisHookError, match="MIG"):  # no such MIG device here: the fresh path's own error
        prepare(config, mig, check=True, cache=True, confine=False)
    assert sorted(Path(config.snapshot_dir).glob("decisions-*.bin")) == before


def test_a_torque_gpu_file_is_read_on_every_start(tmp_path):
    # its lines are not in the env the decision is kept over: a start that reads it is never served from the cache
    import posix

    config, _tree, _gpus = _world(tmp_path / "w")
    gpufile = tmp_path / "77.torquegpu"
    env = ("NVIDIA_VISIBLE_DEVICES=all", "PBS_JOBID=77.torque", "PBS_VERSION=TORQUE-6.1.3", f"PBS_GPUFILE={gpufile}")
    bundle = _bundle(tmp_path / "b", env)
    for index in (1, 2, 1):
        gpufile.write_text(f"{posix.uname().nodename}-gpu{index}\nelsewhere-gpu0\n")
        prepared = prepare(config, bundle, check=True, cache=True, confine=False)
        assert prepared.request is not None and [g.index for g in prepared.request.gpus] == [index]
    assert not list(Path(config.snapshot_dir).glob("decisions-*.bin"))


def test_the_observed_env_records_what_was_read():
    env = decisionkeep.ObservedEnv({"A": "1", "NVIDIA_REQUIRE_CUDA": "cuda>=12", "NVIDIA_REQUIRE_X": "", "B": "2"})
    from pyxis_hook.spec.envreads import prefixed

    assert env.get("A") == "1" and env.get("MISSING", "d") == "d" and "B" in env and env["A"] == "1"
    assert prefixed(env, "NVIDIA_REQUIRE_") == {"NVIDIA_REQUIRE_CUDA": "cuda>=12", "NVIDIA_REQUIRE_X": ""}
    observed = env.observed()
    assert observed == ("read", (("A", "1"), ("B", "2"), ("MISSING", None)),
                        (("NVIDIA_REQUIRE_", (("NVIDIA_REQUIRE_CUDA", "cuda>=12"), ("NVIDIA_REQUIRE_X", ""))),))
    assert decisions._matches(observed, {"A": "1", "B": "2", "NVIDIA_REQUIRE_CUDA": "cuda>=12",
                                         "NVIDIA_REQUIRE_X": "", "OTHER": "x"})
    assert not decisions._matches(observed, {"A": "1", "B": "2", "NVIDIA_REQUIRE_CUDA": "cuda>=12"})
    assert not decisions._matches(observed, {"A": "1", "B": "2", "MISSING": "", "NVIDIA_REQUIRE_CUDA": "cuda>=12",
                                             "NVIDIA_REQUIRE_X": ""})
    list(env.items())  # read whole: the decision then depends on every variable
    assert env.observed()[0] == "whole"


def test_a_plan_survives_its_encoding(world, tmp_path):
    config, _tree, _gpus = world
    plan = _fresh(config, _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=all"))).plan
    assert plan.devices and plan.mounts and plan.symlinks and plan.proc_driver is not None
    import marshal

    assert decisions._decode(marshal.loads(marshal.dumps(decisions._encode(plan)))) == plan


def test_a_decision_made_by_other_code_is_not_taken(tmp_path, monkeypatch):
    """An edited or patched install keeps its version: the planner's files themselves must be unchanged."""
    config, _tree, _gpus = _world(tmp_path / "w")
    planner = tmp_path / "planner.py"  # stands for one of the package's modules
    planner.write_text("RULE = 1\n")
    real_code = decisionkeep._code
    monkeypatch.setattr(decisionkeep, "_code", lambda: real_code() + (
        (str(planner), planner.stat().st_mtime_ns, planner.stat().st_size),))
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    _warm(config, bundle)
    assert any(origin.endswith("/pyxis_hook/spec/request.py") for origin, *_ in real_code())
    _touch(planner)
    again = prepare(config, bundle, check=True, cache=True, confine=False)
    assert again.request is not None and again.plan == _fresh(config, bundle).plan


def test_two_installs_sharing_a_snapshot_dir_keep_a_decision_each(tmp_path, monkeypatch):
    """Two installs of the package (a venv and the system's) start the same containers: neither evicts the other."""
    config, _tree, _gpus = _world(tmp_path / "w")
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    installs = {"one": ((str(tmp_path / "one.py"), 1, 1),), "two": ((str(tmp_path / "two.py"), 2, 2),)}
    current = {"install": "one"}
    monkeypatch.setattr(decisionkeep, "_code", lambda: installs[current["install"]])
    from pyxis_hook import startimage

    monkeypatch.setattr(startimage, "same_code", lambda code: code == installs[current["install"]])
    _warm(config, bundle)
    current["install"] = "two"
    assert prepare(config, bundle, check=True, cache=True, confine=False).request is not None  # the other's
    _warm(config, bundle)
    current["install"] = "one"
    assert prepare(config, bundle, check=True, cache=True, confine=False).request is None  # still there


def test_the_snapshot_dir_keeps_the_newest_decision_files(tmp_path, monkeypatch):
    """Each new shape adds a file; the oldest go (KEEP_FILES)."""
    monkeypatch.setattr(decisionkeep, "KEEP_FILES", 2)
    config, _tree, _gpus = _world(tmp_path / "w")
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    for caps in (("utility",), ("compute",), ("compute", "utility"), ("graphics",)):
        newest = replace(config, default_capabilities=caps)  # another configuration: another file
        _warm(newest, bundle)
    assert len(list(Path(config.snapshot_dir).glob("decisions-*.bin"))) == 2
    assert prepare(newest, bundle, check=True, cache=True, confine=False).request is None  # the newest stays
    first = replace(config, default_capabilities=("utility",))
    assert prepare(first, bundle, check=True, cache=True, confine=False).request is not None  # the oldest went


def test_gpus_that_must_be_discovered_load_the_planners_tier_first(tmp_path, monkeypatch):
    """A memo miss means a new key: the planning tier is loaded before discovery, so discovery's modules join it.

    Were it loaded after, discovery's modules would join the image every
    start runs, and a start served by the memo and the cache would execute them.
    """
    from pyxis_hook import startimage
    from pyxis_hook.host import gpumemo, gpuscan

    config, tree, _gpus = _world(tmp_path)
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=all",))
    _warm(config, bundle)
    order: list[str] = []
    monkeypatch.setattr(startimage, "load_tier", lambda tier: order.append(f"tier {tier}"))
    real = gpuscan.discover_gpus
    monkeypatch.setattr(gpuscan, "discover_gpus", lambda *a: order.append("discover") or real(*a))
    assert prepare(config, bundle, check=True, cache=True, confine=False).request is None  # memo and cache serve
    assert order == []
    Path(gpumemo.memo_path(config)).unlink()
    prepare(config, bundle, check=True, cache=True, confine=False)
    assert order[:2] == ["tier plan", "discover"], order


def test_a_start_served_from_the_cache_runs_nothing_of_the_keeping(world, tmp_path, monkeypatch):
    """ObservedEnv and the save are the planner's tier (`decisionkeep`): a cached start never imports them."""
    import sys

    config, _tree, _gpus = world
    bundle = _bundle(tmp_path / "b", ("NVIDIA_VISIBLE_DEVICES=1",))
    warm = _warm(config, bundle)
    monkeypatch.setitem(sys.modules, "pyxis_hook.plan.decisionkeep", None)  # an import of it now raises
    cached = prepare(config, bundle, check=True, cache=True, confine=False)
    assert cached.request is None and cached.plan == warm.plan
