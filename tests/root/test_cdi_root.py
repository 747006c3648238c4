"""Root tests: `pyxis-hook cdi generate` and the spec's createContainer hooks.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/engines/test_cdi.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import pytest
from e2e.conftest import DRIVER_VERSION, fresh_rootfs
from fixtures.cli import run_cli
from fixtures.container import make_bundle
from fixtures.oci_state import state_json
from pyxis_hook.engines import cdi
from pyxis_hook.errors import UsageError
from unit.engines.test_cdi import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _compat_image,
    _conf_for,
    _run_spec_hooks,
    _validator,
    host,
    spec,
)


@pytest.mark.root
@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_hooks_create_links_and_refresh_ldcache(host, tmp_path, mode):
    """Run the spec's hooks the way runc does (own mount namespace, state on stdin, cwd = rootfs)."""
    conf = tmp_path / "mode.conf"
    conf.write_text(host.conf.read_text() + f'ldcache = "{mode}"\n')
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    bundle = tmp_path / "bundle"
    rootfs = fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle, env=(), args=("/bin/true",))
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
    assert cdi.parse_lib("/usr/lib/libx.so.1.2::libx.so.1::0x0303") == ("/usr/lib", "libx.so.1.2", "libx.so.1", 0x303)
    for flags in ("-1", "0x100000000"):  # a cache entry's flags are a 32-bit field
        with pytest.raises(UsageError, match="32-bit cache flag"):
            cdi.parse_lib(f"/usr/lib/libx.so.1.2::libx.so.1::{flags}")
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
