"""Each step of apply failing, or the hook SIGKILLed there, under real runc: nothing is left behind.

The hook runs through `hook.py` with one fault armed (shim.py): the n-th
bind mount, link, device-cgroup rule write, ld.so.cache rename or confined
ldconfig run fails (EIO) or the hook process is SIGKILLed at that call.  The
container's rootfs is an overlay whose upper dir is its own tmpfs.  After
each start:

* no mount is left in the host's namespace (below this test's dirs);
* a failure: the start fails with exactly one `pyxis-hook: error:` line and
  no traceback, and the upper dir holds only what runc itself made (a start
  whose hook had nothing to do);
* a SIGKILL: runc reports the killed hook, and the upper dir holds nothing a
  finished start would not have left (mount points and links the undo could
  not run for, never a temp file).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from e2e.conftest import make_host
from faults.rig import fault_hook, host_and_image, hook_errors, mounts_under, snapshots, start, upper_files
from fixtures.overlay import overlay

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow]

GPU = ("NVIDIA_VISIBLE_DEVICES=0",)
PROBE = "/usr/bin/gputest"

#: (step, n, ldcache mode): each kind of write apply makes, first and a later one where there are several
STEPS = [("mount", 1, "merge"), ("mount", 5, "merge"), ("link", 1, "merge"), ("link", 2, "merge"),
         ("cgroup", 1, "merge"), ("cache", 1, "merge"), ("ldconfig", 1, "ldconfig")]

#: what the injected error reads as, where it is not EIO's "Input/output error"
FAILED = {"ldconfig": "Exec format error"}


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    """One fake GPU host (a conf per ld.so.cache mode) and one image for the module."""
    return host_and_image(tmp_path_factory.mktemp("faults"))


def _run(rig, where, fault: str = "", *, mode: str = "merge", env=GPU, **kw):
    """Start once on a fresh overlay; return (result, upper dir files, host mounts below `where` after)."""
    _host, confs, image = rig
    with overlay(image, where) as (rootfs, layer):
        before = mounts_under(where)
        r = start(where, rootfs, fault_hook(confs[mode], fault, **kw), env, PROBE)
        after = mounts_under(where)
        assert after == before, f"mounts left on the host: {sorted(set(after) - set(before))}"
        return r, upper_files(layer / "upper")


@pytest.fixture(scope="module")
def runc_only(rig, tmp_path_factory):
    """What runc itself leaves in the upper dir: a start whose hook has nothing to do."""
    r, files = _run(rig, tmp_path_factory.mktemp("void"), env=("NVIDIA_VISIBLE_DEVICES=void",))
    assert r.rc == 0, r.stderr
    return files


@pytest.fixture(scope="module")
def finished(rig, tmp_path_factory):
    """What a finished start leaves in the upper dir, per ld.so.cache mode."""
    out = {}
    for mode in ("merge", "ldconfig"):
        r, files = _run(rig, tmp_path_factory.mktemp(f"ok-{mode}"), mode=mode)
        assert r.rc == 0 and "cuDriverGetVersion=12020" in r.stdout, r.stderr
        out[mode] = files
    return out


@pytest.mark.parametrize("step, n, mode", STEPS, ids=[f"{s}{n}" for s, n, _ in STEPS])
def test_step_failing_fails_the_start_with_one_line_and_leaves_nothing(rig, runc_only, tmp_path, step, n, mode):
    r, files = _run(rig, tmp_path, f"{step}:{n}:fail", mode=mode)
    assert r.rc != 0, "the fault was never reached: the start succeeded"
    errors = hook_errors(r.stderr)
    assert len(errors) == 1 and FAILED.get(step, "Input/output error") in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert files == runc_only, f"left in the upper dir: {sorted(set(files.items()) - set(runc_only.items()))}"


@pytest.mark.parametrize("step, n, mode", STEPS, ids=[f"{s}{n}" for s, n, _ in STEPS])
def test_hook_killed_at_step_leaves_no_host_mount_and_nothing_a_start_would_not(rig, finished, tmp_path, step, n, mode):
    r, files = _run(rig, tmp_path, f"{step}:{n}:kill", mode=mode)
    assert r.rc != 0
    assert "signal: killed" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    extra = {path for path, what in files.items() if finished[mode].get(path) != what}
    if step == "cache":
        # killed between writing glibc's temp name and the rename (as glibc's ldconfig can be):
        # the next start removes it (test_next_start_after_a_kill_at_the_cache_rename_...)
        extra.discard("etc/ld.so.cache~")
    assert not extra, f"left in the upper dir that a finished start does not leave: {sorted(extra)}"


def test_next_start_after_a_kill_at_the_cache_rename_succeeds_and_removes_the_temp_file(rig, finished, tmp_path):
    _host, confs, image = rig
    with overlay(image, tmp_path) as (rootfs, layer):
        r = start(tmp_path, rootfs, fault_hook(confs["merge"], "cache:1:kill"), GPU, PROBE)
        assert r.rc != 0 and "signal: killed" in r.stderr, r.stderr
        r = start(tmp_path, rootfs, fault_hook(confs["merge"]), GPU, PROBE)
        assert r.rc == 0 and "cuDriverGetVersion=12020" in r.stdout, r.stderr
        assert upper_files(layer / "upper") == finished["merge"]


def test_unreadable_proc_driver_file_fails_cleanly_or_starts_with_the_driver(rig, runc_only, tmp_path):
    """/proc/driver/nvidia/version unreadable (EACCES at every open): one error line, or a working start."""
    host = rig[0]
    r, files = _run(rig, tmp_path, f"read={host.proc_root}/driver/nvidia/version:0:fail")
    assert "Traceback" not in r.stderr
    if r.rc != 0:
        assert len(hook_errors(r.stderr)) == 1, r.stderr
        assert files == runc_only
    else:
        assert "cuDriverGetVersion=12020" in r.stdout, r.stdout


def test_runc_hook_timeout_leaves_no_host_mount_and_no_straggler(rig, finished, tmp_path):
    """A hook stalled past config.json's `timeout` is killed by runc; apply's child must die with it."""
    r, files = _run(rig, tmp_path, "mount:1:sleep", timeout=1)
    assert r.rc != 0
    assert "hook ran past specified timeout of 1.0s" in r.stderr, r.stderr
    assert not set(files.items()) - set(finished["merge"].items())
    stragglers = [p for p in os.listdir("/proc") if p.isdigit() and _armed_with(p, "mount:1:sleep")]
    assert not stragglers, "a process of the killed hook is still running"


def _armed_with(pid: str, fault: str) -> bool:
    """Whether process `pid` is a hook of ours run with `fault` armed (its environment says)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"PYXIS_FAULT={fault}".encode() in f.read().split(b"\0")
    except OSError:
        return False


# ------------------------------------------------------------ the host and the image change under us


@pytest.fixture
def own_host(rig, tmp_path):
    """A host of the test's own (its driver files and snapshot are changed), sharing the module's image."""
    host = make_host(tmp_path / "own")
    return host, {"merge": host.write_conf()}, rig[2]


def test_driver_library_deleted_between_snapshot_and_start(own_host, tmp_path):
    """The snapshot names a library that is gone by the next start: rebuilt, never a bind of a missing file."""
    host, _confs, _image = own_host
    r, _files = _run(own_host, tmp_path / "first")
    assert r.rc == 0, r.stderr
    (lib,) = (host.driver_root / "usr/lib/x86_64-linux-gnu").glob("libnvidia-ml.so.5*")
    lib.unlink()
    r, files = _run(own_host, tmp_path / "second")
    assert "Traceback" not in r.stderr
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout
    assert not any("libnvidia-ml.so.5" in p for p in files), files
    assert "stale" in (host.base / "hook.log").read_text()
    (snap,) = snapshots(host.base / "snapshot")
    assert not any("libnvidia-ml.so.5" in f["host_path"] for f in snap["inventory"]["files"])


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_damaged_snapshot_is_rebuilt(own_host, tmp_path, damage):
    host = own_host[0]
    r, _files = _run(own_host, tmp_path / "first")
    assert r.rc == 0, r.stderr
    (path,) = (host.base / "snapshot").glob("inventory-*.json")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else bytes(b ^ 0x5A for b in data))
    r, _files = _run(own_host, tmp_path / "second")
    assert r.rc == 0 and "cuDriverGetVersion=12020" in r.stdout, r.stderr
    assert "corrupt" in (host.base / "hook.log").read_text()
    assert len(snapshots(host.base / "snapshot")) == 1  # parses again
    assert not list((host.base / "snapshot").glob(".*.tmp"))


def test_read_only_rootfs_mount_fails_with_one_line_and_leaves_nothing(rig, runc_only, tmp_path):
    """An image whose rootfs mount is read-only (the runtime's own `root.readonly` comes after the
    hooks, test_runc): the mount points cannot be made; the start fails with one line."""
    _host, confs, image = rig
    with overlay(image, tmp_path) as (rootfs, layer):
        subprocess.run(["mount", "-o", "remount,ro", str(rootfs)], check=True)
        before = mounts_under(tmp_path)
        r = start(tmp_path, rootfs, fault_hook(confs["merge"]), GPU, PROBE)
        assert mounts_under(tmp_path) == before
        assert r.rc != 0
        errors = hook_errors(r.stderr)
        assert len(errors) == 1 and "Read-only file system" in errors[0], r.stderr
        assert "Traceback" not in r.stderr
        assert upper_files(layer / "upper") == runc_only
