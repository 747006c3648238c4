"""Root tests: rootpin: the rootfs is the mount the runtime made in the container's namespace (or its pivoted root).

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/apply/test_rootpin.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import subprocess
import pytest
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.errors import ApplyError
from pyxis_hook.plan.build import LdcacheUpdate, MountEdit, Plan
from pyxis_hook.apply.rootpin import RootfsError, pin_rootfs
from unit.apply.test_rootpin import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    LIBDIR,
    _repoint,
    _tree,
    bundle,
    runtime_like,
    start,
)


@pytest.mark.root
def test_pins_the_runtimes_mount_and_reads_the_image_through_it(bundle, runtime_like):
    root, _canary = bundle
    pinned = pin_rootfs(str(root), runtime_like)
    try:
        assert (pinned.ns_path, pinned.pivoted) == (str(root), False)
        st = os.fstat(pinned.fd)
        assert (st.st_dev, st.st_ino) == (os.stat(root).st_dev, os.stat(root).st_ino)
        with open(f"{pinned.view}/etc/marker") as f:
            assert f.read() == "image\n"
        # the two mount tables it judged by, kept for the start's other readers: the container's lists its
        # rootfs mount, this process's own is the one /proc/self/mountinfo gives
        assert f" {root} " in pinned.their_table
        with open("/proc/self/mountinfo") as f:
            assert pinned.own_table.splitlines()[0] == f.readline().rstrip("\n")
    finally:
        pinned.close()


@pytest.mark.root
def test_a_link_the_runtime_followed_at_create_leads_to_the_same_mount(bundle, runtime_like):
    root, _canary = bundle
    (root.parent / "link").symlink_to("rootfs")
    pinned = pin_rootfs(str(root.parent / "link"), runtime_like)
    pinned.close()
    assert pinned.ns_path == str(root)


@pytest.mark.root
@pytest.mark.parametrize("how", ["symlink", "config"])
def test_a_name_repointed_after_the_mount_is_refused(bundle, runtime_like, how):
    root, canary = bundle
    if how == "symlink":
        _repoint(root, canary)
        named = root
    else:  # config.json's root.path rewritten to the host dir
        named = canary
    with pytest.raises(RootfsError, match=f"root.path {named} is not the rootfs the runtime set up .*"
                                          f"it leads to {canary}: .* not one the runtime made"):
        pin_rootfs(str(named), runtime_like)


@pytest.mark.root
@pytest.mark.parametrize("path, words", [
    ("/", "the mount it is on, at /, is also in the hook's own mount namespace"),
    ("dev", "lies below"),
    ("etc", "a directory inside the mount at"),
    ("missing", "not a directory in the mount namespace of container process"),
])
def test_other_places_are_refused_in_one_line(bundle, runtime_like, path, words):
    root, _canary = bundle
    with pytest.raises(RootfsError, match=words) as e:
        pin_rootfs(os.path.join(str(root), path), runtime_like)
    assert "\n" not in str(e.value)


@pytest.mark.root
def test_a_rootfs_the_runtime_did_not_mount_is_refused(bundle, start):
    root, _canary = bundle
    pid = start("exec sleep 600")
    with pytest.raises(RootfsError, match="not one the runtime made"):
        pin_rootfs(str(root), pid)


@pytest.mark.root
def test_after_pivot_the_process_root_is_the_rootfs(bundle, start):
    root, canary = bundle
    pid = start(f"exec chroot {root} /bin/sleep 600")
    pinned = pin_rootfs(str(root), pid)
    pinned.close()
    assert (pinned.ns_path, pinned.pivoted) == ("/", True)
    assert pinned.own_table is None and pinned.their_table is None  # no table read: HostDirs reads its own
    with pytest.raises(RootfsError, match=f"root.path {canary} is not the root directory of container process"):
        pin_rootfs(str(canary), pid)
    _repoint(root, canary)
    with pytest.raises(RootfsError, match="not the rootfs the runtime set up"):
        pin_rootfs(str(root), pid)


@pytest.mark.root
def test_a_gone_process_is_one_line(bundle):
    root, _canary = bundle
    p = subprocess.Popen(["true"])
    p.wait()
    with pytest.raises(RootfsError, match=f"container process {p.pid}: cannot open its root directory"):
        pin_rootfs(str(root), p.pid)


@pytest.mark.root
def test_apply_uses_the_pinned_rootfs_whatever_the_name_says_later(bundle, runtime_like, mount_api, tmp_path):
    root, canary = bundle
    lib = tmp_path / "libcuda.so.535.104.05"
    lib.write_text("driver\n")
    pinned = pin_rootfs(str(root), runtime_like)
    try:
        _repoint(root, canary)
        before = _tree(canary)
        plan = Plan(rootfs=str(root), mounts=(MountEdit(str(lib), f"{LIBDIR}/libcuda.so.535.104.05"),))
        res = apply_plan(plan, runtime_like, root=pinned)
    finally:
        pinned.close()
    assert res.mounted == (f"{LIBDIR}/libcuda.so.535.104.05",)
    assert _tree(canary) == before
    real = root.with_name("real")
    with open(f"/proc/{runtime_like}/root{real}{LIBDIR}/libcuda.so.535.104.05") as f:
        assert f.read() == "driver\n"  # mounted in the container's rootfs, seen through its namespace


@pytest.mark.root
def test_ldconfig_runs_in_the_pinned_rootfs_and_refuses_a_renamed_one(bundle, runtime_like, tmp_path):
    """The confined ldconfig reopens the rootfs by its name in the namespace and insists on the pinned inode."""
    root, canary = bundle
    (root / "etc/ld.so.conf").write_text("")
    plan = Plan(rootfs=str(root), ldcache=LdcacheUpdate("ldconfig", "/sbin/ldconfig", (LIBDIR,)))
    pinned = pin_rootfs(str(root), runtime_like)
    try:
        res = apply_plan(plan, runtime_like, root=pinned)
        assert any("ldconfig ran" in m for m in res.messages)
        assert (root / "etc/ld.so.cache").exists()
        _repoint(root, canary)
        with pytest.raises(ApplyError, match="ldconfig"):
            apply_plan(plan, runtime_like, root=pinned)
    finally:
        pinned.close()
    assert not (canary / "etc/ld.so.cache").exists()


def _pivoted_with_its_own_proc(root, procs: list) -> int:
    """A container init as Apptainer's OCI engine leaves it for createRuntime: its own PID namespace, that
    namespace's procfs at /proc of the rootfs, and pivot_root done.  Returns the init's pid."""
    import time

    script = (f"mount --bind {root} {root} && mkdir -p {root}/proc {root}/.old && "
              f"exec unshare -p -f sh -c 'mount -t proc proc {root}/proc && cd {root} && "
              "pivot_root . .old && exec /bin/sleep 600'")
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script])
    procs.append(p)
    for _ in range(500):
        kids = [p.pid]
        while kids:
            pid = kids.pop()
            try:
                if os.readlink(f"/proc/{pid}/exe").endswith("sleep"):
                    return pid
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    kids += [int(k) for k in f.read().split()]
            except OSError:
                pass
        time.sleep(0.01)
    raise RuntimeError("pivoted container stand-in did not start")


@pytest.mark.root
def test_after_pivot_with_the_containers_own_proc_apply_reads_and_mounts(bundle, mount_api, tmp_path):
    """/proc of the entered namespace is the container's: /proc/self names no process of ours there.

    Every reopen of an fd through its magic link (the image's loader
    configuration read for the ld.so.cache update, a legacy bind's source)
    must go through the hook's own procfs instead.
    """
    root, _canary = bundle
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
    (root / "etc/ld.so.conf.d").mkdir()
    (root / "etc/ld.so.conf.d/extra.conf").write_text("/opt/extra\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)  # the image's own ld.so.cache, for the merge
    lib = tmp_path / "libcuda.so.535.104.05"
    lib.write_text("driver\n")
    procs: list = []
    try:
        pid = _pivoted_with_its_own_proc(root, procs)
        pinned = pin_rootfs(str(root), pid)
        try:
            assert pinned.pivoted
            plan = Plan(rootfs=str(root), mounts=(MountEdit(str(lib), f"{LIBDIR}/libcuda.so.535.104.05"),),
                        ldcache=LdcacheUpdate("merge", "/sbin/ldconfig", (LIBDIR,),
                                              libs=((LIBDIR, "libcuda.so.535.104.05", "libcuda.so.1", 0x0303),)))
            if mount_api == "legacy":  # mount(2) binds only a source of the caller's namespace: no host file there
                with pytest.raises(ApplyError, match="not reachable in the container mount namespace .* pivot_root"):
                    apply_plan(plan, pid, root=pinned)
                plan = Plan(rootfs=str(root), ldcache=plan.ldcache)
            res = apply_plan(plan, pid, root=pinned)
        finally:
            pinned.close()
        # the image's loader configuration and cache were read through the hook's own procfs
        assert res.messages[-1] == "ld.so.cache: merged 1 entries (new format)", res.messages
        if mount_api == "legacy":
            return
        assert res.mounted == (f"{LIBDIR}/libcuda.so.535.104.05",)
        with open(f"/proc/{pid}/root{LIBDIR}/libcuda.so.535.104.05") as f:
            assert f.read() == "driver\n"
    finally:
        for p in procs:
            p.kill()
            p.wait()
