"""Root tests: `pyxis-hook cdi generate` and the spec's createContainer hooks.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/engines/test_cdi.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
import pytest
from e2e.conftest import DRIVER_VERSION, fresh_rootfs
from fixtures.cli import run_cli
from fixtures.container import make_bundle
from fixtures.oci_state import state_json
from fixtures.standin import tree_state
from pyxis_hook.engines import cdihook
from pyxis_hook.errors import UsageError
from unit.engines.test_cdi import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _compat_image,
    _conf_for,
    _run_spec_hooks,
    _validator,
    host,
    spec,
)


def _spec(host, tmp_path, *conf_lines: str) -> dict:
    """The CDI spec `cdi generate` writes for `host`, with `conf_lines` added to its pyxis.conf."""
    conf = tmp_path / "spec.conf"
    conf.write_text(host.conf.read_text() + "".join(f"{x}\n" for x in conf_lines))
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _bundle(tmp_path) -> tuple[Path, Path]:
    """(bundle, rootfs): our e2e image in a bundle whose config.json runs /bin/true."""
    bundle = tmp_path / "bundle"
    rootfs = fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle, env=(), args=("/bin/true",))
    return bundle, rootfs


@pytest.mark.root
@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_hooks_create_links_and_refresh_ldcache(host, tmp_path, mode):
    """Run the spec's hooks the way runc does (own mount namespace, state on stdin, cwd = rootfs)."""
    spec = _spec(host, tmp_path, f'ldcache = "{mode}"')
    bundle, rootfs = _bundle(tmp_path)
    _run_spec_hooks(spec, bundle, rootfs)
    link = rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert link.is_symlink() and os.readlink(link).startswith("libcuda.so.")
    # glibc's own tool reads the cache the hook's ldconfig wrote
    out = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                         capture_output=True, text=True).stdout
    # (merged-/usr image: ldconfig lists the library under /lib first, and so does the merge)
    assert re.search(r"libcuda\.so\.1 \(libc6,x86-64\) => (/usr)?/lib/x86_64-linux-gnu/libcuda\.so\.1", out), out
    # the loader of the image finds it through that cache
    r = subprocess.run(["chroot", str(rootfs), "/usr/bin/gputest"], capture_output=True, text=True)
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout + r.stderr


@pytest.mark.root
def test_hook_rejects_relative_link_and_bad_state(tmp_path):
    bundle = tmp_path / "b"
    fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle)
    r = run_cli("cdi", "hook", "create-symlinks", "--link", "rel/x::y", input=state_json(bundle, id="cdi-test"))
    assert r.returncode != 0 and "--link 'rel/x::y'" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("cdi", "hook", "update-ldcache", "--lib", "/usr/lib/libx.so::libx.so.1", input=state_json(bundle, id="cdi-test"))
    assert r.returncode != 0 and "--lib '/usr/lib/libx.so::libx.so.1'" in r.stderr and "Traceback" not in r.stderr
    assert cdihook.parse_lib("/usr/lib/libx.so.1.2::libx.so.1::0x0303") == ("/usr/lib", "libx.so.1.2", "libx.so.1", 0x303)
    for flags in ("-1", "0x100000000"):  # a cache entry's flags are a 32-bit field
        with pytest.raises(UsageError, match="32-bit cache flag"):
            cdihook.parse_lib(f"/usr/lib/libx.so.1.2::libx.so.1::{flags}")
    r = run_cli("cdi", "hook", "update-ldcache", "--folder", "/usr/lib", input="{not json")
    assert r.returncode != 0 and r.stderr.startswith("pyxis-hook: error:") and "Traceback" not in r.stderr


@pytest.mark.root  # mknod of the fixture nodes
def test_mig_devices_get_their_own_entries(host, tmp_path):
    from fixtures.hosttree import fake_gpus, make_host_tree

    tree = make_host_tree(tmp_path / "mig", gpus=fake_gpus(2), mig={0: {1: [0, 1]}}, driver_version=DRIVER_VERSION)
    conf = _conf_for(tree, host.driver_root, tmp_path)
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert not list(_validator().iter_errors(doc))
    by_name = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    assert {"0:0", "0:1"} <= set(by_name)
    nodes = [n["path"] for n in by_name["0:1"]["deviceNodes"]]
    assert "/dev/nvidia0" in nodes and any(p.startswith("/dev/nvidia-caps/nvidia-cap") for p in nodes)
    access = [m["containerPath"] for m in by_name["0:1"].get("mounts", [])]
    assert any(p.endswith("/gi1/ci1/access") for p in access), access
    assert by_name["0:0"]["deviceNodes"] != by_name["0:1"]["deviceNodes"]


@pytest.mark.root  # mknod of the fixture nodes
def test_mig_devices_are_named_by_the_uuids_the_drivers_nvml_reports(tmp_path):
    """procfs has no MIG UUIDs: `cdi generate` asks the driver root's libnvidia-ml (a gcc-built fake here)
    and names each MIG device both `<gpu>:<mig>` and by its MIG UUID, with the same edits."""
    from fixtures.fakedriver import make_fake_driver
    from fixtures.hosttree import fake_gpus, fake_uuid, make_host_tree
    from fixtures.nvml import build_fake_nvml, mig_uuid

    tree = make_host_tree(tmp_path / "host", gpus=fake_gpus(2), mig={0: {2: [0, 1]}}, driver_version=DRIVER_VERSION)
    driver = make_fake_driver(tmp_path / "driver", version=DRIVER_VERSION)
    build_fake_nvml(driver / f"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{DRIVER_VERSION}", fake_uuid(0))
    r = run_cli("cdi", "generate", conf=_conf_for(tree, driver, tmp_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    errors = sorted(_validator().iter_errors(doc), key=str)
    assert not errors, [e.message for e in errors]
    names = [d["name"] for d in doc["devices"]]
    assert names == ["0", "1", fake_uuid(0), fake_uuid(1), "0:0", mig_uuid(0), "0:1", mig_uuid(1), "all"]
    by_name = {d["name"]: d["containerEdits"] for d in doc["devices"]}
    for j in (0, 1):
        assert by_name[mig_uuid(j)] == by_name[f"0:{j}"]
        access = [m["containerPath"] for m in by_name[mig_uuid(j)].get("mounts", [])]
        assert any(p.endswith(f"/gi2/ci{j}/access") for p in access), access
    assert by_name[mig_uuid(0)]["deviceNodes"] != by_name[mig_uuid(1)]["deviceNodes"]


@pytest.mark.root
@pytest.mark.parametrize("mode,compat", [("merge", "ldconfig"), ("ldconfig", "ldconfig"), ("merge", "disabled")])
def test_spec_hooks_load_the_compat_libcuda(host, tmp_path, mode, compat):
    """The generated spec's hooks on a compat image: glibc's ldconfig -p and the image's loader see the
    compat libcuda first (cuDriverGetVersion of the compat copy, 12080), the host's (12020) after it."""
    conf = tmp_path / "mode.conf"
    conf.write_text(host.conf.read_text() + f'ldcache = "{mode}"\ncuda-compat = "{compat}"\n')
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    rootfs = _compat_image(tmp_path / "bundle")
    log_file = host.base / "hook.log"
    seen = log_file.stat().st_size if log_file.exists() else 0
    _run_spec_hooks(spec, tmp_path / "bundle", rootfs)
    out = subprocess.run(["/sbin/ldconfig", "-p", "-C", str(rootfs / "etc/ld.so.cache")],
                         capture_output=True, text=True).stdout
    lines = [x for x in out.splitlines() if "libcuda.so.1 " in x]
    r = subprocess.run(["chroot", str(rootfs), "/usr/bin/gputest"], capture_output=True, text=True)
    if compat == "ldconfig":
        assert lines[0].endswith("=> /usr/local/cuda/compat/libcuda.so.1"), lines
        assert any(x.endswith("/lib/x86_64-linux-gnu/libcuda.so.1") for x in lines[1:]), lines
        assert "cuDriverGetVersion=12080 rc=0" in r.stdout, r.stdout + r.stderr
        log = log_file.read_bytes()[seen:].decode()
        assert "cdi hook update-ldcache: cuda-compat: /usr/local/cuda/compat comes first" in log
    else:
        assert not any("/usr/local/cuda/compat" in x for x in lines), lines
        assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout + r.stderr


# ------------------------------------------------ the rootfs is pinned: root.path is not followed


def _mounts_below(d: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        return [line.split()[4] for line in f if line.split()[4].startswith(f"{d}/")]


def _spec_hooks(host, tmp_path) -> dict:
    return {h["args"][6]: h for h in _spec(host, tmp_path)["containerEdits"]["hooks"]}


def _repoint(bundle: Path, canary: Path, flip: str) -> None:
    """What the bundle's owner can do once the runtime has read root.path: point it at a host directory."""
    if flip == "symlink":
        (bundle / "rootfs").rename(bundle / "real")
        (bundle / "rootfs").symlink_to(canary)
    else:
        doc = json.loads((bundle / "config.json").read_text())
        doc["root"]["path"] = str(canary)
        (bundle / "config.json").write_text(json.dumps(doc))


@pytest.mark.root
@pytest.mark.parametrize("flip", ["symlink", "config"])
@pytest.mark.parametrize("step", cdihook.HOOK_STEPS)
def test_hook_inside_the_container_namespace_refuses_a_root_path_repointed_after_create(host, tmp_path, step,
                                                                                          flip):
    """runc's shape: the hook runs as the init's child in its namespaces (state pid 1); root.path now leads to
    a host directory laid out like a rootfs.  One error line, the directory untouched, nothing mounted."""
    from fixtures.standin import runc_init_argv

    hook = _spec_hooks(host, tmp_path)[step]
    bundle, rootfs = _bundle(tmp_path)
    canary = fresh_rootfs(tmp_path / "host-dir")
    (canary / "proc").mkdir(exist_ok=True)
    before = tree_state(canary)
    state = tmp_path / "state.json"
    state.write_text(state_json(bundle, id="cdi-flip"))
    gate = tmp_path / "gate"
    gate.mkdir()
    env = dict(e.split("=", 1) for e in hook["env"])
    p = subprocess.Popen(runc_init_argv(rootfs, [hook["args"]], state, gate=gate), env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        for _ in range(600):
            if (gate / "ready").exists() or p.poll() is not None:
                break
            time.sleep(0.05)
        _repoint(bundle, canary, flip)
        (gate / "go").touch()
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode != 0
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("pyxis-hook: error: root.path "), err
    assert "is not the rootfs the runtime set up for container process" in lines[0], err
    assert tree_state(canary) == before, "the hook changed the host directory root.path was re-pointed at"
    assert _mounts_below(tmp_path) == []


def _pivoted_init(rootfs: Path) -> subprocess.Popen:
    """A container process that already has the rootfs as its root (Apptainer's OCI engine runs hooks then)."""
    import shutil

    from fixtures.standin import start_standin

    sleep = rootfs / "bin/sleep"
    if sleep.is_symlink():
        sleep.unlink()
    shutil.copy2(rootfs / "bin/busybox", sleep)  # the stand-in is found by its exe's name
    return start_standin(f"exec chroot {rootfs} /bin/sleep 600")


@pytest.mark.root
@pytest.mark.parametrize("flip", [None, "config"])
def test_hook_in_the_engines_namespace_pins_the_pivoted_root(host, tmp_path, flip):
    """Apptainer's shape: the hook runs on the host with the container's host pid, after the container
    pivoted.  The links land in the container's root; a root.path naming another directory is refused."""
    hook = _spec_hooks(host, tmp_path)["create-symlinks"]
    bundle, rootfs = _bundle(tmp_path)
    canary = fresh_rootfs(tmp_path / "host-dir")
    before = tree_state(canary)
    init = _pivoted_init(rootfs)
    try:
        if flip:
            _repoint(bundle, canary, flip)
        env = dict(e.split("=", 1) for e in hook["env"])
        r = subprocess.run(hook["args"], input=state_json(bundle, id="cdi-pivoted", pid=init.pid), env=env,
                           capture_output=True, text=True)
    finally:
        init.kill()
        init.wait()
    link = rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
    if flip:
        assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
        assert f"root.path {canary} is not the root directory of container process {init.pid}" in r.stderr
        assert not link.is_symlink()
    else:
        assert r.returncode == 0, r.stderr
        assert link.is_symlink() and os.readlink(link) == f"libcuda.so.{DRIVER_VERSION}"
    assert tree_state(canary) == before


@pytest.mark.root
@pytest.mark.parametrize("pid", [0, 1])
def test_hook_finds_the_init_whatever_pid_the_runtime_states(host, tmp_path, pid):
    """crun states pid 0 to createContainer hooks, runc the init's pid in its own namespace (1): either way
    the hook is the init's child, and pins the rootfs the init mounted."""
    from fixtures.standin import runc_init_argv

    hook = _spec_hooks(host, tmp_path)["create-symlinks"]
    bundle, rootfs = _bundle(tmp_path)
    state = tmp_path / "state.json"
    state.write_text(state_json(bundle, id="cdi-pid", pid=pid))
    env = dict(e.split("=", 1) for e in hook["env"])
    r = subprocess.run(runc_init_argv(rootfs, [hook["args"]], state), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    link = rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert link.is_symlink() and os.readlink(link) == f"libcuda.so.{DRIVER_VERSION}"


# ------------------------------------------------ the host's library wins over the image's copy


@pytest.mark.root
@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_an_images_own_file_at_a_soname_path_is_covered_by_the_hosts_library(host, tmp_path, mode):
    """The image COPY'd another driver's libcuda.so.1 (a regular file answering 11040): create-symlinks binds
    the runtime's mount of the host's libcuda.so.<version> over it, so the container loads the host's file
    (12020); the image's file itself is left as it was.  A directory at a link path is skipped, warned."""
    from fixtures.fakedriver import CUDA_C, _lib

    spec = _spec(host, tmp_path, f'ldcache = "{mode}"')
    bundle, rootfs = _bundle(tmp_path)
    lib = rootfs / "usr/lib/x86_64-linux-gnu"
    theirs = _lib(CUDA_C % {"cuda": 11040}, "libcuda.so.1", "libcuda.so.470.256.02").read_bytes()
    (lib / "libcuda.so.1").write_bytes(theirs)
    (lib / "libnvidia-ml.so.1").mkdir()
    host_lib = host.driver_root / f"usr/lib/x86_64-linux-gnu/libcuda.so.{DRIVER_VERSION}"
    log_file = host.base / "hook.log"
    seen = log_file.stat().st_size if log_file.exists() else 0
    out = _run_spec_hooks(spec, bundle, rootfs, after=(
        'stat -c "ino=%i" "$0/usr/lib/x86_64-linux-gnu/libcuda.so.1"; chroot "$0" /usr/bin/gputest'))
    assert f"ino={os.stat(host_lib).st_ino}" in out.splitlines(), out
    assert "cuDriverGetVersion=12020 rc=0" in out, out
    assert (lib / "libcuda.so.1").read_bytes() == theirs and not (lib / "libcuda.so.1").is_symlink()
    log = log_file.read_bytes()[seen:].decode()
    covered = [x for x in log.splitlines() if "warning: /usr/lib/x86_64-linux-gnu/libcuda.so.1: the image's own "
               "regular file is covered by the host's " in x]
    assert len(covered) == 1, log
    assert "warning: container cdi-test: cdi hook create-symlinks: /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1: " \
           "a directory of the image is there" in log, log


@pytest.mark.root
def test_spec_hooks_run_from_the_start_image(host, tmp_path):
    """Each createContainer step is a container start: once warm, past the parser it runs from the
    start image, and does the same work cold and warm."""
    from pyxis_hook import startimage

    spec = _spec(host, tmp_path)
    image = Path(startimage.image_path())
    image.unlink(missing_ok=True)
    log_file = host.base / "hook.log"
    for i in range(3):
        seen = log_file.stat().st_size if log_file.exists() else 0
        bundle = tmp_path / f"bundle{i}"
        rootfs = fresh_rootfs(bundle / "rootfs")
        make_bundle(bundle, env=(), args=("/bin/true",))
        _run_spec_hooks(spec, bundle, rootfs)
        link = rootfs / "usr/lib/x86_64-linux-gnu/libcuda.so.1"
        assert link.is_symlink() and os.readlink(link).startswith("libcuda.so.")
        log = log_file.read_bytes()[seen:].decode()
        assert f"start image {image}" in log, log
        steps = [line for line in log.splitlines() if f"start image {image}: cdi-hook section" in line]
        assert len(steps) == 2, log  # create-symlinks, update-ldcache
        if i == 0:
            assert "not used: " in steps[0] and "No such file or directory" in steps[0]  # cold; the next step may find what this one wrote
    assert all("modules loaded" in line for line in steps)  # warm: both steps ran from the image
    held = startimage.held(str(image), "cdi-hook")
    assert "pyxis_hook.engines.cdihook" not in startimage.held(str(image), "start")  # a runtime's start never runs it
    assert "pyxis_hook.engines.cdihook" in held and "argparse" not in held and "pyxis_hook.cli" not in held
    assert not {"json", "platform"} & set(held)  # what `cdi generate` alone needs stays out of the steps
    assert "elftools" not in held
