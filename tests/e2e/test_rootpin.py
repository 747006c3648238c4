"""The hook acts on the rootfs runc/crun mounted, whatever the bundle's root.path names by the time it runs.

A first prestart hook stands in for whoever can write the bundle: after the
runtime has mounted the rootfs, and before our hook reads config.json, it
re-points `root.path` at a host directory laid out like a rootfs (the canary),
either by swapping a symlink in for `rootfs` or by rewriting config.json.  The
start must fail with our one line and the canary must not change.  Also: a
root.path that is a symlink when the runtime starts (crun follows it) still
works, and a bundle another user owns is warned about, or refused by
`writable-bundle = "refuse"`.
"""

from __future__ import annotations

import json
import os
import shutil

import pytest

from e2e.conftest import bundle_for, fresh_rootfs, make_host, mount_table, run_container
from fixtures.cli import run_cli
from fixtures.container import make_bundle, merge_cdi
from fixtures.standin import tree_state

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow]

RUNTIMES = [r for r in ("runc", "crun") if shutil.which(r)]

#: what the flipping hook does in the bundle directory (its cwd is not ours to rely on: `cd` first)
FLIPS = {
    "symlink": 'mv rootfs real && ln -s "$CANARY" rootfs',
    "config": 'sed -i "s#\\"path\\": \\"rootfs\\"#\\"path\\": \\"$CANARY\\"#" config.json',
}


@pytest.fixture
def host(tmp_path):
    return make_host(tmp_path)


def _mounts_under(d) -> list[str]:
    """The host's mounts below `d` (other tests on the machine mount elsewhere meanwhile)."""
    return [m for m in mount_table() if m.startswith(f"{d}/")]


def _hook_errors(stderr: str) -> list[str]:
    """Our error lines in runc's output, which quotes the hook's stderr with Go escapes."""
    text = stderr.replace("\\n", "\n").replace('\\"', '"')
    return [line for line in text.splitlines() if "pyxis-hook: error:" in line]


def _with_flipper(bundle, canary, flip: str) -> None:
    """Put a hook before ours that re-points root.path at `canary` once the runtime has mounted the rootfs."""
    cfg_path = bundle / "config.json"
    cfg = json.loads(cfg_path.read_text())
    flipper = {"path": "/bin/sh", "args": ["sh", "-c", f"cd {bundle} && {FLIPS[flip]}"],
               "env": [f"CANARY={canary}", "PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}
    cfg["hooks"]["prestart"].insert(0, flipper)
    cfg_path.write_text(json.dumps(cfg, indent=2))


@pytest.mark.parametrize("flip", sorted(FLIPS))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_root_path_repointed_after_create_is_refused_and_the_host_dir_untouched(runtime, flip, tmp_path, host):
    canary = fresh_rootfs(tmp_path / "host-dir")
    before = tree_state(canary)
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    _with_flipper(bundle, canary, flip)
    _assert_refused(runtime, bundle, f"pyxis-rootpin-{os.getpid()}-{runtime}-{flip}", canary, before, tmp_path, host)


def _assert_refused(runtime, bundle, name, canary, before, tmp_path, host) -> None:
    """The container does not start, with one line; the host directory root.path was flipped to is as it was."""
    mounts = _mounts_under(tmp_path)
    r = run_container(runtime, bundle, name)
    assert tree_state(canary) == before, "a hook changed the host directory root.path was re-pointed at"
    assert _mounts_under(tmp_path) == mounts
    assert r.rc != 0
    assert "is not the rootfs the runtime set up" in (host.base / "hook.log").read_text()
    if runtime == "runc":  # crun does not show a failing hook's stderr
        errors = _hook_errors(r.stderr)
        assert len(errors) == 1 and "is not the rootfs the runtime set up" in errors[0], r.stderr
        assert "Traceback" not in r.stderr


def _cdi_bundle(tmp_path, host, flip: str | None):
    """A bundle with the CDI spec of `host` merged for device 0 (its createContainer hooks, no prestart hook
    of ours), and the flipping prestart hook before them when `flip` says how."""
    r = run_cli("cdi", "generate", conf=host.conf)
    assert r.returncode == 0, r.stderr
    bundle = tmp_path / "bundle"
    fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle, args=("/bin/sh", "-c", "/usr/bin/gputest"), hooks={"prestart": []})
    cfg_path = bundle / "config.json"
    cfg_path.write_text(json.dumps(merge_cdi(json.loads(cfg_path.read_text()), json.loads(r.stdout), "0")))
    if flip:
        _with_flipper(bundle, tmp_path / "host-dir", flip)
    return bundle


@pytest.mark.parametrize("flip", sorted(FLIPS))
@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cdi_hooks_refuse_a_root_path_repointed_after_create(runtime, flip, tmp_path, host):
    """The createContainer hooks of a CDI spec run inside the container's namespaces (runc: state pid 1,
    crun: 0); they pin the rootfs the runtime mounted there, as prestart does."""
    canary = fresh_rootfs(tmp_path / "host-dir")
    before = tree_state(canary)
    bundle = _cdi_bundle(tmp_path, host, flip)
    _assert_refused(runtime, bundle, f"pyxis-cdipin-{os.getpid()}-{runtime}-{flip}", canary, before, tmp_path, host)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_cdi_hooks_pin_the_rootfs_the_runtime_mounted(runtime, tmp_path, host):
    bundle = _cdi_bundle(tmp_path, host, None)
    r = run_container(runtime, bundle, f"pyxis-cdipin-{os.getpid()}-{runtime}")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout  # found through the ld.so.cache the hook merged
    log = (host.base / "hook.log").read_text()
    assert "ld.so.cache: merged" in log, log


@pytest.mark.skipif("crun" not in RUNTIMES, reason="crun is not installed")
def test_root_path_through_a_symlink_the_runtime_followed_still_works(tmp_path, host):
    """crun follows a symlinked root.path at create (runc refuses one); the hook finds the same mount."""
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    (bundle / "link").symlink_to("rootfs")
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["root"]["path"] = "link"
    (bundle / "config.json").write_text(json.dumps(cfg, indent=2))
    r = run_container("crun", bundle, f"pyxis-rootlink-{os.getpid()}")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout


NOBODY = 65534


def test_bundle_another_user_owns_is_warned_about(tmp_path, host):
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    os.chown(bundle, NOBODY, NOBODY)
    r = run_container("runc", bundle, f"pyxis-userbundle-{os.getpid()}")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout
    log = (host.base / "hook.log").read_text()
    assert f"{bundle} is owned by uid {NOBODY}" in log and "writable-bundle" in log, log


def test_bundle_another_user_owns_is_refused_when_configured(tmp_path, host):
    host.write_conf(writable_bundle="refuse")
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    (bundle / "config.json").chmod(0o666)
    r = run_container("runc", bundle, f"pyxis-userbundle-{os.getpid()}")
    assert r.rc != 0
    errors = _hook_errors(r.stderr)
    assert len(errors) == 1 and "config.json is writable by every user" in errors[0], r.stderr
    assert 'writable-bundle = "refuse"' in errors[0]


def test_root_owned_bundle_is_not_warned_about(tmp_path, host):
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    r = run_container("runc", bundle, f"pyxis-rootbundle-{os.getpid()}")
    assert r.rc == 0, r.stderr
    assert "writable-bundle" not in (host.base / "hook.log").read_text()
