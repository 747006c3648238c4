"""Nothing the hook creates lands in a host directory bound into the container (apply_plan, both mount APIs).

The shapes: enroot without ENROOT_RESTRICT_DEV binds the node's /dev into the
rootfs, users bind volumes such as `-v /usr/bin:/usr/bin`; `dev-root` names a
tree whose nodes the bound directory lacks.  Here host-like directories under
tmp_path stand for the host's (binding the machine's own /dev would put a
failure of this very rule onto the machine).  A stand-in container binds them
into its rootfs in its own mount namespace (runc/crun before pivot_root: the
hook runs in the host's namespace), or the hook itself runs in the
container's namespace (enroot's hooks, a forked child here).  Each test
checks the bound directory afterwards, byte for byte, and that the shapes
runtimes really use for their own /dev (a fresh tmpfs) still get everything.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from fixtures.forked import run_forked
from fixtures.standin import start_standin
from fixtures.synth import build_lib
from root.test_apply import _snapshot
from pyxis_hook.kernel import mountapi, namespaces
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.errors import ApplyError
from pyxis_hook.loader.ldcache import written_flags
from pyxis_hook.plan.build import DeviceEdit, LdcacheUpdate, MountEdit, Plan, SymlinkEdit

pytestmark = pytest.mark.root

LIBDIR = "/usr/lib/x86_64-linux-gnu"
LIB64 = "/usr/lib64"


class World:
    """dev-root's tree and driver files (`src`), host-like dirs (`hostdev`, `hostbin`, `hostlib`, `hostetc`), a rootfs."""

    def __init__(self, tmp: Path):
        self.src = tmp / "src"
        self.root = tmp / "rootfs"
        (self.src / "dev").mkdir(parents=True)
        (self.src / "lib").mkdir()
        build_lib(self.src / "lib", "libcuda.so.1", filename="libcuda.so.535.104.05")
        build_lib(self.src / "lib", "libnvidia-ml.so.1", filename="libnvidia-ml.so.535.104.05")
        (self.src / "nvidia-smi").write_text("#!/bin/true\n")
        os.mknod(self.src / "dev/nvidia0", 0o666 | stat.S_IFCHR, os.makedev(195, 0))
        os.mknod(self.src / "dev/nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
        # the host's own directories: /dev has nvidiactl but not nvidia0, as with a dev-root elsewhere
        self.hostdev, self.hostbin, self.hostlib, self.hostetc = (tmp / n for n in ("hostdev", "hostbin",
                                                                                   "hostlib", "hostetc"))
        for d in (self.hostdev, self.hostbin, self.hostlib, self.hostetc):
            d.mkdir()
        os.mknod(self.hostdev / "nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
        (self.hostdev / "null").write_text("")
        (self.hostbin / "ls").write_text("#!/bin/true\n")
        (self.hostlib / "libc.so.6").write_text("not really\n")
        for d in ("etc", LIBDIR, LIB64, "usr/bin", "dev", "tmp"):
            (self.root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (self.root / "etc/ld.so.conf").write_text(f"{LIBDIR}\n{LIB64}\n")
        subprocess.run(["ldconfig", "-r", str(self.root)], check=True)  # an image cache merge can model
        for f in ("ld.so.conf", "ld.so.cache"):  # the host's /etc: a cache the merge would rewrite
            (self.hostetc / f).write_bytes((self.root / "etc" / f).read_bytes())

    def hosts(self) -> dict:
        return {d: _snapshot(d) for d in (self.hostdev, self.hostbin, self.hostlib, self.hostetc)}

    def plan(self, *, devices=("nvidiactl", "nvidia0"), ldcache: bool = False) -> Plan:
        rows = ((LIBDIR, "libcuda.so.535.104.05", "libcuda.so.1", written_flags(64)),
                (LIB64, "libnvidia-ml.so.535.104.05", "libnvidia-ml.so.1", written_flags(64)))
        minors = {"nvidia0": 0, "nvidiactl": 255}
        return Plan(
            rootfs=str(self.root),
            devices=tuple(DeviceEdit(f"/dev/{d}", str(self.src / "dev" / d), 195, minors[d]) for d in devices),
            mounts=(MountEdit(str(self.src / "lib/libcuda.so.535.104.05"), f"{LIBDIR}/libcuda.so.535.104.05"),
                    MountEdit(str(self.src / "lib/libnvidia-ml.so.535.104.05"), f"{LIB64}/libnvidia-ml.so.535.104.05"),
                    MountEdit(str(self.src / "nvidia-smi"), "/usr/bin/nvidia-smi")),
            symlinks=(SymlinkEdit(f"{LIBDIR}/libcuda.so.1", "libcuda.so.535.104.05"),
                      SymlinkEdit(f"{LIB64}/libnvidia-ml.so.1", "libnvidia-ml.so.535.104.05")),
            ldcache=LdcacheUpdate("merge", "", (LIBDIR, LIB64), libs=rows) if ldcache else LdcacheUpdate("none"),
        )


@pytest.fixture
def world(tmp_path):
    return World(tmp_path)


@contextlib.contextmanager
def _standin(script: str):
    """A container stand-in (its pid) whose namespace ran `script`: the mounts its runtime made."""
    p = start_standin(f"{script} && exec sleep 600")
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


def _mounts(pid) -> list[str]:
    with open(f"/proc/{pid}/mountinfo") as f:
        return sorted(line.split()[4] for line in f)


def _inside(pid: int, *cmd: str) -> str:
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *cmd], capture_output=True, text=True).stdout


def test_a_device_node_missing_from_a_bound_host_dev_fails_the_start_and_creates_nothing(world, mount_api):
    hosts = world.hosts()
    with _standin(f"mount --bind '{world.hostdev}' '{world.root}/dev'") as pid:
        before = _mounts(pid)
        with pytest.raises(ApplyError) as e:
            apply_plan(world.plan(), pid)  # nvidiactl (there: mounted onto) first, then nvidia0 (missing)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("device node /dev/nvidia0 (in "), msg
        assert "not created: it is a host directory bound into the container" in msg, msg
        assert world.hosts() == hosts  # the host's directory holds nothing new
        assert _mounts(pid) == before  # nvidiactl's mount was undone too


def test_a_node_already_in_a_bound_host_dev_is_mounted_onto(world, mount_api):
    """Mounting onto an entry that is there changes nothing on the host: the node the host has still works."""
    hosts = world.hosts()
    with _standin(f"mount --bind '{world.hostdev}' '{world.root}/dev'") as pid:
        res = apply_plan(world.plan(devices=("nvidiactl",)), pid)
        assert "/dev/nvidiactl" in res.mounted
        assert world.hosts() == hosts


def test_optional_edits_in_bound_host_dirs_are_skipped_with_one_warning_each(world, mount_api):
    hosts = world.hosts()
    with _standin(f"mount --bind '{world.hostbin}' '{world.root}/usr/bin' && "
                 f"mount --bind '{world.hostlib}' '{world.root}{LIBDIR}'") as pid:
        res = apply_plan(world.plan(ldcache=True), pid)
        warned = [re.match(r"warning: (?:symlink )?(\S+) \(in ", m) for m in res.messages
                  if m.startswith("warning: ") and "host directory" in m]
        assert sorted(w.group(1) for w in warned if w) == sorted(
            ["/usr/bin/nvidia-smi", f"{LIBDIR}/libcuda.so.535.104.05", f"{LIBDIR}/libcuda.so.1"]), res.messages
        assert world.hosts() == hosts
        # the rest is there: the nodes in the image's /dev, the library and link of the image's own dir
        assert set(res.mounted) == {"/dev/nvidia0", "/dev/nvidiactl", f"{LIB64}/libnvidia-ml.so.535.104.05"}
        assert res.symlinks == (f"{LIB64}/libnvidia-ml.so.1",)
        # the cache names what is there, and not the library left out
        assert any("merged 1 entries" in m for m in res.messages), res.messages
        out = _inside(pid, "ldconfig", "-p", "-C", str(world.root / "etc/ld.so.cache"))
        assert f"libnvidia-ml.so.1 (libc6,x86-64) => {LIB64}/libnvidia-ml.so.1" in out and "libcuda" not in out


def test_a_bound_host_etc_keeps_its_cache(world, mount_api):
    hosts = world.hosts()
    with _standin(f"mount --bind '{world.hostetc}' '{world.root}/etc'") as pid:
        res = apply_plan(world.plan(ldcache=True), pid)
        assert any(m.startswith("warning: ld.so.cache: /etc/ld.so.cache (in ") and "cache not updated" in m
                   for m in res.messages), res.messages
        assert world.hosts() == hosts


def test_the_runtimes_own_tmpfs_dirs_get_everything(world, mount_api):
    """runc/crun make /dev a fresh tmpfs; a tmpfs volume likewise: filesystems only this container has."""
    with _standin(f"mount -t tmpfs tmpfs '{world.root}/dev' && mount -t tmpfs tmpfs '{world.root}/usr/bin'") as pid:
        res = apply_plan(world.plan(ldcache=True), pid)
        assert not [m for m in res.messages if m.startswith("warning: ")], res.messages
        assert {"/dev/nvidia0", "/usr/bin/nvidia-smi", f"{LIBDIR}/libcuda.so.535.104.05"} <= set(res.mounted)
        assert _inside(pid, "stat", "-c", "%t:%T", str(world.root / "dev/nvidia0")).strip() == "c3:0"


def _in_own_namespace(world: World, dev_mount: str, plan: Plan) -> str:
    """Like an enroot hook: the hook runs in the container's namespace, whose rootfs is bound onto itself."""
    def body() -> str:
        namespaces.unshare(namespaces.CLONE_NEWNS)
        mountapi.mount(None, "/", None, mountapi.MS_REC | mountapi.MS_PRIVATE)
        root = str(world.root)
        mountapi.mount(root, root, None, mountapi.MS_BIND)
        if dev_mount == "tmpfs":  # ENROOT_RESTRICT_DEV: a fresh tmpfs
            mountapi.mount("tmpfs", f"{root}/dev", "tmpfs", 0, "mode=755")
        else:  # enroot's mounts.d/10-system.fstab: the host's /dev, rbind
            mountapi.mount(str(world.hostdev), f"{root}/dev", None, mountapi.MS_BIND | mountapi.MS_REC)
        try:
            res = apply_plan(plan, "self")
        except ApplyError as e:
            return f"error {e}"
        return " ".join(sorted(res.mounted))
    return run_forked(body)


def test_hook_in_the_containers_namespace_restricted_dev_gets_its_nodes(world, mount_api):
    out = _in_own_namespace(world, "tmpfs", world.plan(devices=("nvidia0",)))
    assert "/dev/nvidia0" in out.split(), out


def test_hook_in_the_containers_namespace_host_dev_gets_nothing_new(world, mount_api):
    hosts = world.hosts()
    out = _in_own_namespace(world, "rbind", world.plan(devices=("nvidia0",)))
    assert out.startswith("error device node /dev/nvidia0 (in ") and "host directory" in out, out
    assert world.hosts() == hosts


def test_the_confined_ldconfig_makes_no_link_in_a_bound_host_lib_dir(world, mount_api):
    """glibc's ldconfig makes SONAME links in every dir it scans: a host dir the image's ld.so.conf lists is
    read-only in its view, so the link is not made there; the image's own dirs still get theirs."""
    build_lib(world.hostlib, "libsite.so.1", filename="libsite.so.1.0")
    build_lib(world.root / LIB64.lstrip("/"), "libimg.so.1", filename="libimg.so.1.0")
    (world.root / "opt/site/lib").mkdir(parents=True)
    (world.root / "etc/ld.so.conf").write_text(f"{LIBDIR}\n{LIB64}\n/opt/site/lib\n")
    hosts = world.hosts()
    with _standin(f"mount --bind '{world.hostlib}' '{world.root}/opt/site/lib'") as pid:
        plan = world.plan(devices=())
        plan = Plan(rootfs=plan.rootfs, mounts=plan.mounts, symlinks=plan.symlinks,
                    ldcache=LdcacheUpdate("ldconfig", "/sbin/ldconfig", (LIBDIR, LIB64)))
        res = apply_plan(plan, pid)
        assert any("ldconfig ran" in m for m in res.messages), res.messages
        assert world.hosts() == hosts
        assert (world.root / LIB64.lstrip("/") / "libimg.so.1").is_symlink()  # the image's dir: its link
