"""apply_plan against a real kernel: a process in its own mount namespace stands in for the container.

No runtime is needed: `unshare -m --propagation private sleep` is a container
init before pivot_root as runc leaves it for prestart hooks.  Everything is
checked from inside (nsenter, /proc/PID/mountinfo) and from the host (its
mountinfo and file stats must not change).
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.standin import start_standin
from fixtures.synth import build_lib
from pyxis_hook.apply import child as apply_mod
from pyxis_hook.apply import devcgroup
from pyxis_hook.kernel import lookup, mountapi, namespaces, syscall
from pyxis_hook import log
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.spec.config import Config
from pyxis_hook.errors import ApplyError, PathError
from pyxis_hook.plan.build import (IPC_OPTIONS, CgroupRule, DeviceEdit, LdcacheUpdate, MountEdit, Plan, ProcDriverView,
                             SymlinkEdit)

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]

LIBDIR = "/usr/lib/x86_64-linux-gnu"


def _container(root: Path, script: str = "exec sleep 600") -> subprocess.Popen:
    return start_standin(script)


@pytest.fixture
def world(tmp_path):
    """Host files (sources), a rootfs, and a container process over it."""
    host = tmp_path / "host"
    root = tmp_path / "rootfs"
    (host / "lib").mkdir(parents=True)
    (host / "dev").mkdir()
    build_lib(host / "lib", "libcuda.so.1", filename="libcuda.so.535.104.05")
    build_lib(host / "lib", "libnvidia-ml.so.1", filename="libnvidia-ml.so.535.104.05")
    (host / "bin").mkdir()
    (host / "bin/nvidia-smi").write_text("#!/bin/true\n")
    (host / "bin/nvidia-smi").chmod(0o755)
    os.mknod(host / "dev/nvidia0", 0o666 | stat.S_IFCHR, os.makedev(195, 0))
    os.mknod(host / "dev/nvidiactl", 0o666 | stat.S_IFCHR, os.makedev(195, 255))
    (host / "secret").write_text("host only\n")
    for d in ("etc", "usr/lib/x86_64-linux-gnu", "usr/bin", "dev", "tmp"):
        (root / d).mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("")
    p = _container(root)
    yield host, root, p.pid
    p.kill()
    p.wait()


def _mountinfo(pid="self") -> list[list[str]]:
    with open(f"/proc/{pid}/mountinfo") as f:
        return [line.split() for line in f]


def _mounts_under(pid, root: Path) -> dict[str, str]:
    """mount point -> per-mount options, for mounts at or below `root`."""
    out = {}
    for f in _mountinfo(pid):
        if f[4] == str(root) or f[4].startswith(str(root) + "/"):
            out[f[4]] = f[5]
    return out


def _inside(pid: int, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "--", *cmd], capture_output=True, text=True)


def _snapshot(d: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for n in sorted(dirnames + filenames):
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            # a directory's mtime moves when a mount point is made and removed again: not compared
            mtime = None if stat.S_ISDIR(st.st_mode) else st.st_mtime_ns
            out[p] = (st.st_mode, st.st_size, mtime, st.st_ino,
                      os.readlink(p) if stat.S_ISLNK(st.st_mode) else None)
    return out


def _basic_plan(host: Path, root: Path, **kw) -> Plan:
    return Plan(
        rootfs=str(root),
        devices=(DeviceEdit("/dev/nvidia0", str(host / "dev/nvidia0"), 195, 0),
                 DeviceEdit("/dev/nvidiactl", str(host / "dev/nvidiactl"), 195, 255)),
        mounts=(MountEdit(str(host / "lib/libcuda.so.535.104.05"), f"{LIBDIR}/libcuda.so.535.104.05"),
                MountEdit(str(host / "lib/libnvidia-ml.so.535.104.05"), f"{LIBDIR}/libnvidia-ml.so.535.104.05"),
                MountEdit(str(host / "bin/nvidia-smi"), "/usr/bin/nvidia-smi")),
        symlinks=(SymlinkEdit(f"{LIBDIR}/libcuda.so", "libcuda.so.1"),),
        **kw,
    )


def test_second_run_does_not_stack_mounts(world, mount_api):
    """createRuntime + prestart both registered (or hooks.d + a bundle hook): the second run mounts nothing new."""
    host, root, pid = world
    plan = _basic_plan(host, root)
    apply_plan(plan, pid, Config(no_cgroups=True))
    count = len([f for f in _mountinfo(pid) if f[4].startswith(str(root))])
    res = apply_plan(plan, pid, Config(no_cgroups=True))
    assert list(res.mounted) == []
    assert len([f for f in _mountinfo(pid) if f[4].startswith(str(root))]) == count
    assert any("not mounted again" in m for m in res.messages)


def test_binds_are_readonly_private_and_invisible_on_host(world, mount_api):
    host, root, pid = world
    host_before = _mountinfo()
    res = apply_plan(_basic_plan(host, root), pid, Config(no_cgroups=True))
    assert set(res.mounted) == {"/dev/nvidia0", "/dev/nvidiactl", f"{LIBDIR}/libcuda.so.535.104.05",
                                f"{LIBDIR}/libnvidia-ml.so.535.104.05", "/usr/bin/nvidia-smi"}
    mounts = _mounts_under(pid, root)
    lib = str(root) + f"{LIBDIR}/libcuda.so.535.104.05"
    opts = set(mounts[lib].split(","))
    assert {"ro", "nosuid", "nodev"} <= opts and "noexec" not in opts
    dev = set(mounts[str(root / "dev/nvidia0")].split(","))
    assert {"ro", "nosuid", "noexec"} <= dev and "nodev" not in dev
    # private: no "shared:" tag on our mounts
    for f in _mountinfo(pid):
        if f[4].startswith(str(root)):
            assert not any(t.startswith("shared:") for t in f[6:f.index("-")])
    # contents are the host file's; writes fail with EROFS
    r = _inside(pid, "cmp", lib, str(host / "lib/libcuda.so.535.104.05"))
    assert r.returncode == 0, r.stderr
    r = _inside(pid, "sh", "-c", f"echo x >> {lib}")
    assert "Read-only file system" in r.stderr
    # the device bind is the node: opening it reaches the (absent) driver -> ENXIO, not EACCES
    r = _inside(pid, "python3", "-c", f"import os\ntry: os.open('{root}/dev/nvidia0', os.O_RDWR)\n"
                "except OSError as e: print(e.errno)")
    assert r.stdout.strip() == str(errno.ENXIO)
    # symlink made in the rootfs
    assert os.readlink(root / LIBDIR.lstrip("/") / "libcuda.so") == "libcuda.so.1"
    # the host sees none of it
    assert _mountinfo() == host_before
    assert _mounts_under("self", root) == {}
    assert (root / LIBDIR.lstrip("/") / "libcuda.so.535.104.05").stat().st_size == 0


def test_invalid_device_node_refused(world):
    host, root, pid = world
    os.mknod(host / "dev/nvidia1", 0o666 | stat.S_IFCHR, os.makedev(195, 7))
    plan = Plan(rootfs=str(root), devices=(DeviceEdit("/dev/nvidia1", str(host / "dev/nvidia1"), 195, 1),))
    with pytest.raises(ApplyError, match=r"invalid device node .*nvidia1: expected c 195:1, found 195:7"):
        apply_plan(plan, pid)
    plan = Plan(rootfs=str(root), devices=(DeviceEdit("/dev/nvidia1", str(host / "secret"), 195, 1),))
    with pytest.raises(ApplyError, match="invalid device node"):
        apply_plan(plan, pid)
    assert _mounts_under(pid, root) == {}


def test_directory_source_for_file_refused(world):
    host, root, pid = world
    plan = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "lib"), f"{LIBDIR}/x"),))
    with pytest.raises(ApplyError, match="unexpected source file mode"):
        apply_plan(plan, pid)


@pytest.mark.parametrize("link", ["/", "../../../../..", "../../../../../../../../.."])
def test_hostile_lib_dir_symlink_lands_inside_rootfs(world, mount_api, link):
    host, root, pid = world
    (root / "usr/lib/x86_64-linux-gnu").rmdir()
    (root / "usr/lib/x86_64-linux-gnu").symlink_to(link)
    host_before = _snapshot(host)
    plan = Plan(rootfs=str(root),
                mounts=(MountEdit(str(host / "lib/libcuda.so.535.104.05"), f"{LIBDIR}/libcuda.so.535.104.05"),),
                symlinks=(SymlinkEdit(f"{LIBDIR}/libcuda.so.1", "libcuda.so.535.104.05"),))
    apply_plan(plan, pid)
    # "/usr/lib/x86_64-linux-gnu/X" is "/X" in the rootfs
    assert set(_mounts_under(pid, root)) == {str(root / "libcuda.so.535.104.05")}
    assert os.readlink(root / "libcuda.so.1") == "libcuda.so.535.104.05"
    assert not os.path.lexists("/libcuda.so.535.104.05") and not os.path.lexists("/libcuda.so.1")
    assert _snapshot(host) == host_before


def test_dotdot_chain_in_plan_path_stays_inside(world, mount_api):
    host, root, pid = world
    plan = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "lib/libcuda.so.535.104.05"),
                                                    "/../../../../usr/../usr/lib/../../opt/libcuda.so.1"),))
    apply_plan(plan, pid)
    assert set(_mounts_under(pid, root)) == {str(root / "opt/libcuda.so.1")}


@pytest.mark.parametrize("target", ["/etc/shadow", None, "/proc/self/root/etc/passwd"])
def test_symlink_at_mount_target_refused(world, mount_api, target):
    host, root, pid = world
    t = target or str(host / "secret")
    (root / "usr/lib/x86_64-linux-gnu/libcuda.so.1").symlink_to(t)
    host_before = _snapshot(host)
    plan = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "lib/libcuda.so.535.104.05"),
                                                    f"{LIBDIR}/libcuda.so.1"),))
    with pytest.raises(PathError, match="libcuda.so.1.*symlink"):
        apply_plan(plan, pid)
    assert _mounts_under(pid, root) == {}
    assert _snapshot(host) == host_before


def test_symlink_loop_is_an_error_not_a_hang(world, mount_api):
    host, root, pid = world
    (root / "opt").symlink_to("loop")
    (root / "loop").symlink_to("opt")
    plan = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "lib/libcuda.so.535.104.05"), "/opt/lib/x.so"),))
    with pytest.raises(PathError, match="/opt/lib/x.so"):
        apply_plan(plan, pid)


def test_third_mount_fails_nothing_left(world, mount_api):
    host, root, pid = world
    (root / "usr/bin/nvidia-smi").symlink_to("/etc/shadow")  # the third target: refused
    before = _snapshot(root)
    plan = Plan(rootfs=str(root), mounts=(
        MountEdit(str(host / "lib/libcuda.so.535.104.05"), "/opt/new/dir/libcuda.so.535.104.05"),
        MountEdit(str(host / "lib/libnvidia-ml.so.535.104.05"), f"{LIBDIR}/libnvidia-ml.so.535.104.05"),
        MountEdit(str(host / "bin/nvidia-smi"), "/usr/bin/nvidia-smi"),
    ), symlinks=(SymlinkEdit(f"{LIBDIR}/libcuda.so", "libcuda.so.1"),))
    with pytest.raises(PathError):
        apply_plan(plan, pid)
    assert _mounts_under(pid, root) == {}
    assert _snapshot(root) == before


def test_failing_ldconfig_rolls_back_everything(world, mount_api, tmp_path):
    host, root, pid = world
    src = tmp_path / "fail.c"
    src.write_text('#include <stdio.h>\nint main(void){fputs("cannot write cache\\n", stderr); return 1;}\n')
    subprocess.run(["gcc", "-static", str(src), "-o", str(tmp_path / "fail")], check=True)
    before = _snapshot(root)
    plan = _basic_plan(host, root, ldcache=LdcacheUpdate("ldconfig", str(tmp_path / "fail"), (LIBDIR,)))
    with pytest.raises(ApplyError, match="ldconfig in .* failed with exit code 1: cannot write cache"):
        apply_plan(plan, pid)
    assert _mounts_under(pid, root) == {}
    assert _snapshot(root) == before


def test_ldconfig_refreshes_cache_and_image_ldconfig_never_runs(world, mount_api, tmp_path):
    host, root, pid = world
    marker = tmp_path / "marker"
    for p in ("sbin/ldconfig", "usr/sbin/ldconfig", "bin/sh"):
        f = root / p
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"#!/bin/sh\ntouch {marker}\n")
        f.chmod(0o755)
    # /etc/ld.so.cache is a symlink to a host file: it must stay untouched
    (root / "etc/ld.so.cache").symlink_to(str(host / "secret"))
    host_before = _snapshot(host)
    plan = _basic_plan(host, root, ldcache=LdcacheUpdate("ldconfig", "/sbin/ldconfig", (LIBDIR,)))
    res = apply_plan(plan, pid)
    assert any("ldconfig ran" in m for m in res.messages)
    assert not marker.exists()
    assert _snapshot(host) == host_before
    # the cache, read from inside the container (where the libraries are mounted), lists them
    out = _inside(pid, "ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")).stdout
    assert f"libcuda.so.1 (libc6,x86-64) => {LIBDIR}/libcuda.so.1" in out
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {LIBDIR}/libnvidia-ml.so.1" in out
    assert os.readlink(root / LIBDIR.lstrip("/") / "libcuda.so.1") == "libcuda.so.535.104.05"


def test_merge_mode_is_accepted_and_skipped(world):
    host, root, pid = world
    res = apply_plan(_basic_plan(host, root, ldcache=LdcacheUpdate("merge")), pid)
    assert any("merge" in m for m in res.messages)


def _proc_tree(host: Path, buses: list[str]) -> Path:
    d = host / "proc/driver/nvidia"
    for b in buses:
        (d / "gpus" / b).mkdir(parents=True)
        (d / "gpus" / b / "information").write_text(f"Bus Location: {b}\n")
    return d


def test_proc_view_mounted_when_the_kernels_params_already_match(world):
    """A node whose module runs with ModifyDeviceFiles: 0: the kernel's params equals the plan's text, but
    /proc/driver/nvidia is still the procfs (same filesystem as /proc), so the view must be mounted."""
    host, root, pid = world
    hd = _proc_tree(host, ["0000:06:00.0", "0000:07:00.0"])
    d = root / "proc/driver/nvidia"
    (d / "gpus/0000:06:00.0").mkdir(parents=True)  # what the "kernel" shows the container
    (d / "params").write_text("ModifyDeviceFiles: 0\n")
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"),), ("0000:07:00.0",))
    res = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    assert "/proc/driver/nvidia" in res.mounted
    assert _inside(pid, "ls", str(d / "gpus")).stdout.split() == ["0000:07:00.0"]


def test_symlink_over_an_image_file_is_left_alone(world):
    """An image that ships its own file where a link goes (a toolkit stub libcuda.so): kept, said, rest applied."""
    host, root, pid = world
    stub = root / LIBDIR.lstrip("/") / "libcuda.so"
    stub.write_text("stub from the image\n")
    res = apply_plan(_basic_plan(host, root), pid)
    assert any(f"symlink {LIBDIR}/libcuda.so not created: a file of the image is there" in m for m in res.messages)
    assert not stub.is_symlink() and stub.read_text() == "stub from the image\n"
    assert f"{LIBDIR}/libcuda.so.535.104.05" in res.mounted


def test_cover_bind_over_an_image_file_warns_once(world, mount_api, monkeypatch):
    """The plan's bind over the image's own libnvidia-ml.so.1: the container reads the host's file, the image's
    file is never written, one warning is logged; a second hook run neither stacks the mount nor warns again."""
    host, root, pid = world
    image_copy = root / LIBDIR.lstrip("/") / "libnvidia-ml.so.1"
    image_copy.write_bytes(b"another driver's NVML\n")
    warned = []
    monkeypatch.setattr(log, "warning", warned.append)
    src = str(host / "lib/libnvidia-ml.so.535.104.05")
    note = f"{LIBDIR}/libnvidia-ml.so.1: the image's own regular file is covered by the host's {src}"
    plan = Plan(rootfs=str(root), mounts=(MountEdit(src, f"{LIBDIR}/libnvidia-ml.so.1", covers=note),))
    res = apply_plan(plan, pid)
    assert res.mounted == (f"{LIBDIR}/libnvidia-ml.so.1",)
    assert warned == [note] and "warning: " + note in res.messages
    r = _inside(pid, "cmp", str(image_copy), src)
    assert r.returncode == 0, r.stderr
    assert image_copy.read_bytes() == b"another driver's NVML\n"  # the host's view: the image's file as it was
    assert "Read-only file system" in _inside(pid, "sh", "-c", f"echo x >> {image_copy}").stderr
    res = apply_plan(plan, pid)
    assert res.mounted == () and warned == [note]
    assert any("not mounted again" in m for m in res.messages)


def test_ldconfig_does_not_repoint_the_plans_links(world, mount_api):
    """glibc's ldconfig points a SONAME link at the newest file of that SONAME in the dir: an image's own copy of
    a newer driver there must not take the link the plan made to the host's library."""
    host, root, pid = world
    d = root / LIBDIR.lstrip("/")
    newer = build_lib(host / "image", "libnvidia-ml.so.1", filename="libnvidia-ml.so.999.1.1")
    shutil.copyfile(newer, d / newer.name)
    (d / "libnvidia-ml.so.1").symlink_to(newer.name)  # the image's own link to its copy
    plan = Plan(rootfs=str(root),
                mounts=(MountEdit(str(host / "lib/libnvidia-ml.so.535.104.05"), f"{LIBDIR}/libnvidia-ml.so.535.104.05"),),
                symlinks=(SymlinkEdit(f"{LIBDIR}/libnvidia-ml.so.1", "libnvidia-ml.so.535.104.05"),),
                ldcache=LdcacheUpdate("ldconfig", "/sbin/ldconfig", (LIBDIR,)))
    res = apply_plan(plan, pid)
    assert os.readlink(d / "libnvidia-ml.so.1") == "libnvidia-ml.so.535.104.05"
    assert any("ldconfig pointed it elsewhere" in m for m in res.messages), res.messages
    out = _inside(pid, "ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")).stdout
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {LIBDIR}/libnvidia-ml.so.1" in out
    assert (d / newer.name).read_bytes() == newer.read_bytes()


def test_proc_driver_view(world, mount_api):
    host, root, pid = world
    hd = _proc_tree(host, ["0000:06:00.0", "0000:07:00.0"])
    (root / "proc/driver/nvidia").mkdir(parents=True)
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"), ("version", "NVRM 535\n")),
                          ("0000:07:00.0",))
    res = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    base = root / "proc/driver/nvidia"
    assert str(base) in _mounts_under(pid, root)
    r = _inside(pid, "sh", "-c", f"cat {base}/params; ls {base}/gpus; cat {base}/gpus/*/information; "
                f"stat -c %a {base}; touch {base}/x")
    lines = r.stdout.splitlines()
    assert lines == ["ModifyDeviceFiles: 0", "0000:07:00.0", "Bus Location: 0000:07:00.0", "555"]
    assert "Read-only file system" in r.stderr
    opts = _mounts_under(pid, root)
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(opts[f"{base}/gpus/0000:07:00.0"].split(","))
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(opts[str(base)].split(","))
    assert "/proc/driver/nvidia" in res.mounted
    assert not (base / "params").exists()  # host view: the tmpfs is not there


def test_proc_driver_view_binds_the_whole_gpus_dir_when_every_gpu_is_selected(world, mount_api):
    """All the host's GPUs selected: one bind of the host's gpus/ (same entries as one bind each)."""
    host, root, pid = world
    buses = ["0000:06:00.0", "0000:07:00.0", "0000:08:00.0"]
    hd = _proc_tree(host, buses)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"),), tuple(reversed(buses)))
    res = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    base = root / "proc/driver/nvidia"
    opts = _mounts_under(pid, root)
    assert f"{base}/gpus" in opts and not any(k.startswith(f"{base}/gpus/") for k in opts)
    assert {"ro", "nosuid", "nodev", "noexec"} <= set(opts[f"{base}/gpus"].split(","))
    r = _inside(pid, "sh", "-c", f"ls {base}/gpus; cat {base}/gpus/*/information")
    assert r.stdout.splitlines() == buses + [f"Bus Location: {b}" for b in buses]
    assert "/proc/driver/nvidia/gpus" in res.mounted


def test_proc_driver_view_subset_never_shows_the_other_gpus(world):
    host, root, pid = world
    hd = _proc_tree(host, ["0000:06:00.0", "0000:07:00.0", "0000:08:00.0"])
    (root / "proc/driver/nvidia").mkdir(parents=True)
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"),), ("0000:06:00.0", "0000:08:00.0"))
    apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    base = root / "proc/driver/nvidia"
    assert _inside(pid, "ls", str(base / "gpus")).stdout.split() == ["0000:06:00.0", "0000:08:00.0"]
    assert f"{base}/gpus" not in _mounts_under(pid, root)


def test_proc_driver_view_not_stacked_on_a_second_run(world):
    host, root, pid = world
    hd = _proc_tree(host, ["0000:06:00.0"])
    (root / "proc/driver/nvidia").mkdir(parents=True)
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"),), ("0000:06:00.0",))
    apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)

    def count():  # mountinfo lines, so stacked mounts on one point count twice
        return sum(1 for f in _mountinfo(pid) if f[4].startswith(str(root)))

    before = count()
    res = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    assert count() == before
    assert any("already this hook's view" in m for m in res.messages)


def test_proc_driver_view_skipped_without_module(world):
    host, root, pid = world
    hd = _proc_tree(host, [])
    view = ProcDriverView(str(hd), (("params", "x"),), ())
    res = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    assert any("no NVIDIA kernel module" in m for m in res.messages)
    assert _mounts_under(pid, root) == {}


def test_readonly_rootfs(tmp_path, mount_api):
    host = tmp_path / "host"
    host.mkdir()
    build_lib(host, "libcuda.so.1", filename="libcuda.so.535.104.05")
    root = tmp_path / "rootfs"
    (root / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (root / "usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05").write_text("")
    p = _container(root, f"mount --bind {root} {root} && mount -o remount,bind,ro {root} && exec sleep 600")
    try:
        ok = Plan(rootfs=str(root),
                  mounts=(MountEdit(str(host / "libcuda.so.535.104.05"), f"{LIBDIR}/libcuda.so.535.104.05"),),
                  ldcache=LdcacheUpdate("ldconfig", "/sbin/ldconfig", (LIBDIR,)))
        res = apply_plan(ok, p.pid)
        assert any("read-only" in m for m in res.messages)
        bad = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "libcuda.so.535.104.05"), "/opt/libcuda.so.1"),))
        with pytest.raises(PathError, match=r"cannot create .*opt.*Read-only file system"):
            apply_plan(bad, p.pid)
    finally:
        p.kill()
        p.wait()


def test_ipc_socket_is_writable(world, mount_api):
    import socket

    host, root, pid = world
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(host / "persistenced.sock"))
    try:
        plan = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "persistenced.sock"), "/run/nvidia/sock",
                                                        kind="socket", options=IPC_OPTIONS),))
        apply_plan(plan, pid)
        opts = set(_mounts_under(pid, root)[str(root / "run/nvidia/sock")].split(","))
        assert "ro" not in opts and {"nosuid", "nodev", "noexec"} <= opts
    finally:
        s.close()


def test_bad_pid_is_one_line(world):
    host, root, _ = world
    with pytest.raises(ApplyError, match="container process 999999"):
        apply_plan(_basic_plan(host, root), 999999)


# ----------------------------------------------------------------- cgroups


def test_cgroup_v1_allows_devices(world, v1_devices_cgroup):
    host, root, pid = world
    plan = _basic_plan(host, root, cgroup_rules=(CgroupRule(195, 0), CgroupRule(195, 255)), cgroup_mode="auto")
    res = apply_plan(plan, pid, Config())
    assert any("device cgroup v1" in m for m in res.messages)
    assert (v1_devices_cgroup / "devices.list").read_text().split("\n")[:2] == ["c 195:0 rw", "c 195:255 rw"]
    # and the node opens as far as the (absent) driver, no longer EPERM
    r = _inside(pid, "python3", "-c", f"import os\ntry: os.open('{root}/dev/nvidia0', os.O_RDWR)\n"
                "except OSError as e: print(e.errno)")
    assert r.stdout.strip() == str(errno.ENXIO)


@pytest.fixture
def v1_devices_cgroup(world):
    """The container stand-in in its own v1 devices cgroup that denies everything."""
    cg = Path("/sys/fs/cgroup/devices") / f"pyxis-test-{os.getpid()}"
    if not cg.parent.is_dir():
        from fixtures.realdriver import in_ci

        if in_ci():  # CI's machines have the hybrid v1 layout: its absence is a failure
            pytest.fail("no cgroup v1 devices hierarchy")
        pytest.skip("no cgroup v1 devices hierarchy")
    cg.mkdir()
    pid = world[2]
    try:
        (cg / "cgroup.procs").write_text(str(pid))
        (cg / "devices.deny").write_text("a")
        yield cg
    finally:
        Path("/sys/fs/cgroup/devices/cgroup.procs").write_text(str(pid))
        cg.rmdir()


def test_no_cgroups_plan_writes_no_rule(world, v1_devices_cgroup):
    """cgroup_mode "none" (no-cgroups = true) is the plan's decision: apply reads nothing else."""
    host, root, pid = world
    plan = _basic_plan(host, root, cgroup_rules=(CgroupRule(195, 0),), cgroup_mode="none")
    res = apply_plan(plan, pid, Config())  # a config saying no-cgroups = false changes nothing
    assert "device cgroup: not modified (no-cgroups = true): c 195:0 rw" in res.messages
    assert (v1_devices_cgroup / "devices.list").read_text() == ""


def test_failed_start_writes_no_cgroup_rule(world, v1_devices_cgroup, mount_api):
    """The rules are written only after every mount succeeded: a refused target leaves the cgroup as it was."""
    host, root, pid = world
    (root / "usr/bin/nvidia-smi").symlink_to("/etc/shadow")  # the last bind is refused
    plan = _basic_plan(host, root, cgroup_rules=(CgroupRule(195, 0), CgroupRule(195, 255)), cgroup_mode="auto")
    with pytest.raises(PathError):
        apply_plan(plan, pid)
    assert (v1_devices_cgroup / "devices.list").read_text() == ""
    assert _mounts_under(pid, root) == {}


def _fake_proc(tmp_path: Path, cgroup_text: str, mountinfo: str = "") -> Path:
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42/cgroup").write_text(cgroup_text)
    (proc / "self").mkdir()
    (proc / "self/mountinfo").write_text(mountinfo)
    return proc


def test_cgroup_explained_on_v2(tmp_path):
    plan = Plan(rootfs="/nonexistent", cgroup_rules=(CgroupRule(195, 0),), cgroup_mode="auto")
    proc = _fake_proc(tmp_path, "0::/system.slice/x.scope\n")
    messages: list[str] = []
    assert devcgroup.open_allow(plan, 42, str(proc), [], messages) is None
    assert "cgroup v2" in messages[0] and "c 195:0 rw" in messages[0] and "linux.resources.devices" in messages[0]


def test_no_rules_inside_a_slurm_step(tmp_path):
    """Under Slurm the step's device cgroup is authoritative: the hook writes no rule below it."""
    plan = Plan(rootfs="/nonexistent", cgroup_rules=(CgroupRule(195, 0),), cgroup_mode="auto")
    proc = _fake_proc(tmp_path, "12:devices:/slurm/uid_0/job_7/step_0/task_0\n0::/\n")
    messages: list[str] = []
    assert devcgroup.open_allow(plan, 42, str(proc), [], messages) is None
    assert "not modified" in messages[0] and "Slurm job 7 step 0" in messages[0]


def test_no_rules_from_a_user_namespace(tmp_path):
    """Rootless podman: the hook in a user namespace writes no v1 rule (the kernel wants CAP_SYS_ADMIN in the
    initial one) and says so; the same cgroup, seen from the initial namespace, is opened for writing."""
    (tmp_path / "cg/a").mkdir(parents=True)
    (tmp_path / "cg/a/devices.allow").write_text("")
    proc = _fake_proc(tmp_path, "5:devices:/a\n", f"31 25 0:27 / {tmp_path}/cg rw - cgroup cgroup rw,devices\n")
    code = f"""
import sys
sys.path.insert(0, {str(REPO)!r})
from pyxis_hook.apply import devcgroup
from pyxis_hook.plan.build import CgroupRule, Plan
plan = Plan(rootfs="/nonexistent", cgroup_rules=(CgroupRule(195, 0),), cgroup_mode="auto")
messages = []
got = devcgroup.open_allow(plan, 42, {str(proc)!r}, [], messages)
print(got and got[1], messages)
"""
    outside = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert outside.startswith(f"{tmp_path}/cg/a/devices.allow []"), outside
    inside = subprocess.run(["unshare", "--user", "--map-root-user", sys.executable, "-c", code],
                            capture_output=True, text=True, check=True).stdout
    assert inside.startswith("None ") and "not modified: the hook runs in a user namespace" in inside, inside
    assert "c 195:0 rw" in inside


def test_v1_cgroup_without_devices_mount_is_one_line(tmp_path):
    plan = Plan(rootfs="/nonexistent", cgroup_rules=(CgroupRule(195, 0),), cgroup_mode="auto")
    proc = _fake_proc(tmp_path, "5:devices:/a/b\n", "31 25 0:27 /.. /bad rw - cgroup cgroup rw,devices\n")
    with pytest.raises(ApplyError, match=r"device cgroup /a/b: no cgroup v1 devices mount"):
        devcgroup.open_allow(plan, 42, str(proc), [], [])


def test_empty_plan_does_nothing(world):
    host, root, pid = world
    assert apply_plan(Plan(rootfs=str(root)), pid) == apply_mod.ApplyResult()


def test_plan_without_host_ldconfig_is_refused(world):
    """apply runs only the plan's host ldconfig; the config is never a second source of it."""
    host, root, pid = world
    plan = _basic_plan(host, root, ldcache=LdcacheUpdate("ldconfig", "", (LIBDIR,)))
    with pytest.raises(ApplyError, match="names no host ldconfig binary"):
        apply_plan(plan, pid, Config(ldconfig="@/sbin/ldconfig"))
    assert _mounts_under(pid, root) == {}


@pytest.mark.slow
def test_racing_symlink_flip_never_mounts_outside(world, mount_api):
    """A thread flips the lib dir between a real dir and links to '/' and to the host; mounts stay inside."""
    import threading

    from pyxis_hook.errors import PyxisHookError

    host, root, pid = world
    libdir = root / "usr/lib/x86_64-linux-gnu"
    host_before = _snapshot(host)
    stop = threading.Event()

    def flip():
        targets = ["/", str(host), "../../.."]
        i = 0
        while not stop.is_set():
            try:
                if libdir.is_symlink():
                    libdir.unlink()
                    libdir.mkdir()
                else:
                    for f in libdir.iterdir():
                        f.unlink() if not f.is_dir() or f.is_symlink() else None
                    libdir.rmdir()
                    libdir.symlink_to(targets[i % len(targets)])
                    i += 1
            except OSError:
                pass

    t = threading.Thread(target=flip)
    t.start()
    outcomes = {"ok": 0, "refused": 0}
    try:
        for _ in range(40):
            plan = Plan(rootfs=str(root), mounts=(
                MountEdit(str(host / "lib/libcuda.so.535.104.05"), f"{LIBDIR}/libcuda.so.535.104.05"),))
            try:
                apply_plan(plan, pid)
                outcomes["ok"] += 1
            except PyxisHookError:
                outcomes["refused"] += 1
    finally:
        stop.set()
        t.join()
    for f in _mountinfo(pid):
        if "libcuda" in f[4]:
            assert f[4].startswith(str(root) + "/"), f[4]
    assert _snapshot(host) == host_before  # whichever way each of the 40 runs went (mounted or refused)


def test_proc_view_without_host_gpu_dir(world):
    host, root, pid = world
    hd = _proc_tree(host, [])
    (root / "proc/driver/nvidia").mkdir(parents=True)
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"),), ("0000:09:00.0",))
    res = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    assert any("0000:09:00.0" in m and "not bound" in m for m in res.messages)
    assert set(_mounts_under(pid, root)) == {str(root / "proc/driver/nvidia")}
    with pytest.raises(ApplyError, match="bad GPU bus id"):
        apply_plan(Plan(rootfs=str(root), proc_driver=ProcDriverView(str(hd), (), ("../../x",))), pid)


# ------------------------------------------------------------ ld.so.cache


def _merge_plan(host: Path, root: Path, ldconfig: str = "/sbin/ldconfig") -> Plan:
    from pyxis_hook.loader.ldcache import written_flags as cache_flags

    rows = ((LIBDIR, "libcuda.so.535.104.05", "libcuda.so.1", cache_flags(64)),
            (LIBDIR, "libnvidia-ml.so.535.104.05", "libnvidia-ml.so.1", cache_flags(64)))
    return _basic_plan(host, root, ldcache=LdcacheUpdate("merge", ldconfig, (LIBDIR,), libs=rows))


def _image_cache(root: Path) -> None:
    """An image whose ld.so.conf lists the lib dir and whose cache glibc's ldconfig wrote: merge can model it."""
    (root / "etc/ld.so.conf").write_text(f"{LIBDIR}\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)


def test_merge_makes_no_ldconfig_copy_unless_it_falls_back(world, monkeypatch):
    """Merge normally succeeds: the host only opens ldconfig; the sealed copy is made by the fallback alone."""
    from pyxis_hook.apply import confined

    host, root, pid = world
    _image_cache(root)
    copies = []
    real = confined.sealed_copy
    monkeypatch.setattr(confined, "sealed_copy", lambda path: copies.append(path) or real(path))
    res = apply_plan(_merge_plan(host, root), pid)
    assert any("merged 2 entries" in m for m in res.messages), res.messages
    assert copies == []  # the parent made none (a child's copy would not show here either: none was needed)
    out = _inside(pid, "ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")).stdout
    assert f"libcuda.so.1 (libc6,x86-64) => {LIBDIR}/libcuda.so.1" in out


def test_merge_falls_back_to_the_host_ldconfig_by_fd(world, mount_api):
    """No cache in the image: merge cannot model it, the child copies the host ldconfig from the fd and runs it."""
    host, root, pid = world
    res = apply_plan(_merge_plan(host, root), pid)
    assert any("merge cannot model this image" in m for m in res.messages), res.messages
    assert any("ldconfig ran" in m for m in res.messages), res.messages
    out = _inside(pid, "ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")).stdout
    assert f"libnvidia-ml.so.1 (libc6,x86-64) => {LIBDIR}/libnvidia-ml.so.1" in out


def test_a_bracket_include_in_the_image_falls_back_to_ldconfig(world, monkeypatch):
    """`include [a-z]*.conf` needs fnmatch, which the child may not import after setns (the hook
    never loads it before): the merge declines and the confined ldconfig rebuilds the cache."""
    host, root, pid = world
    monkeypatch.delitem(sys.modules, "fnmatch")  # as in the hook's process (pytest itself loads it)
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf.d/libs.conf").write_text(f"{LIBDIR}\n")
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/[a-z]*.conf\n")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    res = apply_plan(_merge_plan(host, root), pid)
    assert any("bracket expression" in m for m in res.messages), res.messages
    assert any("ldconfig ran" in m for m in res.messages), res.messages
    out = _inside(pid, "ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")).stdout
    assert f"libcuda.so.1 (libc6,x86-64) => {LIBDIR}/libcuda.so.1" in out


def _unsafe_loader_config(root: Path, kind: str) -> str:
    """Make the image's ld.so.conf one glibc's ldconfig hangs, spins or opens a device on; the word naming it."""
    conf = root / "etc/ld.so.conf"
    conf.unlink()
    if kind == "fifo":
        os.mkfifo(conf)
        return "/etc/ld.so.conf (in %s): a FIFO" % root
    if kind == "device":  # a conf.d file that is a tape drive: its driver would act on open
        conf.write_text("include /etc/ld.so.conf.d/*.conf\n")
        (root / "etc/ld.so.conf.d").mkdir()
        os.mknod(root / "etc/ld.so.conf.d/st0.conf", 0o600 | stat.S_IFCHR, os.makedev(9, 0))
        return "/etc/ld.so.conf.d/st0.conf (in %s) (included at /etc/ld.so.conf:1): a character device" % root
    if kind == "dev-zero":  # the runtime's /dev/zero, which the container's device rules do not guard here
        os.mknod(root / "dev/zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        conf.symlink_to("/dev/zero")
        return "/etc/ld.so.conf (in %s): a character device" % root
    conf.write_text("include /etc/ld.so.conf\ninclude /etc/ld.so.conf\n")
    return "/etc/ld.so.conf (in %s) (included at /etc/ld.so.conf:1): includes itself" % root


@pytest.mark.parametrize("kind", ["fifo", "device", "dev-zero", "include-loop"])
@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_unsafe_loader_config_is_refused_before_any_ldconfig(world, tmp_path, no_hang, mode, kind):
    """Both modes read the image's configuration first: a refusal in one line, no ldconfig run, nothing left."""
    host, root, pid = world
    src = tmp_path / "mark.c"  # stands in for ldconfig: leaves a mark in the root it was chrooted into
    src.write_text('#include <fcntl.h>\nint main(void){return open("/ldconfig-ran", O_CREAT | O_WRONLY, 0644) < 0;}\n')
    subprocess.run(["gcc", "-static", str(src), "-o", str(tmp_path / "mark")], check=True)
    what = _unsafe_loader_config(root, kind)
    before = _snapshot(root)
    plan = _merge_plan(host, root, str(tmp_path / "mark")) if mode == "merge" else \
        _basic_plan(host, root, ldcache=LdcacheUpdate("ldconfig", str(tmp_path / "mark"), (LIBDIR,)))
    with pytest.raises(ApplyError) as e:
        apply_plan(plan, pid)
    assert str(e.value).startswith("ld.so.cache not updated: the image's loader configuration is refused: " + what)
    assert "\n" not in str(e.value)
    assert not (root / "ldconfig-ran").exists()
    assert _mounts_under(pid, root) == {}
    assert _snapshot(root) == before


def test_a_bracket_include_does_not_hide_a_fifo_from_the_check(world, monkeypatch, no_hang):
    """The child cannot evaluate `[...]` (no fnmatch): it still checks every file the pattern could match."""
    host, root, pid = world
    monkeypatch.delitem(sys.modules, "fnmatch")  # as in the hook's process (pytest itself loads it)
    (root / "etc/ld.so.conf.d").mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf.d/libs.conf").write_text(f"{LIBDIR}\n")
    os.mkfifo(root / "etc/ld.so.conf.d/pipe.conf")
    (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/[a-z]*.conf\n")
    subprocess.run(["ldconfig", "-r", str(root), "-f", "/dev/null"], check=True)
    with pytest.raises(ApplyError, match="refused: /etc/ld.so.conf.d/pipe.conf .*: a FIFO"):
        apply_plan(_merge_plan(host, root), pid)
    assert _mounts_under(pid, root) == {}


def test_the_child_refuses_any_import(world, monkeypatch):
    """After setns an import would look up the container's files: the forked child refuses every one."""
    host, root, pid = world

    def ldcache_step_that_imports(*args, **kwargs):
        import xml.dom.minidom  # noqa: F401 - loaded by nothing before

    monkeypatch.setattr(apply_mod, "_ldcache", ldcache_step_that_imports)
    monkeypatch.delitem(sys.modules, "xml.dom.minidom", raising=False)
    with pytest.raises(ApplyError, match="no import inside the container's mount namespace: xml"):
        apply_plan(_merge_plan(host, root), pid)
    assert _mounts_under(pid, root) == {}  # rolled back


def test_the_childs_modules_are_loaded_with_apply():
    """Each step the child runs after setns (mounts, the /proc view, the cgroup rules) is imported with apply_plan.

    The child refuses every import once in the container's namespace: a step
    module loaded lazily there would fail the start (or read the image's file).
    A fresh interpreter, so nothing is preloaded by the test run.
    """
    steps = ("pyxis_hook.apply.mounts", "pyxis_hook.apply.procview", "pyxis_hook.apply.devcgroup")
    code = f"import sys, pyxis_hook.apply.child; print([m for m in {steps!r} if m not in sys.modules])"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"
    assert all(importlib.util.find_spec(m) for m in steps)


def test_nothing_is_imported_inside_the_container_namespace(tmp_path):
    """The container's namespace hides the Python library and the package: the ld.so.cache step still works.

    After setns a module imported by name would be the container's file;
    apply_plan imports what the child needs on the host.  A fresh
    interpreter, so nothing is preloaded by the test run.
    """
    import sysconfig

    import pyxis_hook

    host = tmp_path / "host"
    root = tmp_path / "rootfs"
    (host / "lib").mkdir(parents=True)
    build_lib(host / "lib", "libcuda.so.1", filename="libcuda.so.535.104.05")
    for d in ("etc", "usr/lib/x86_64-linux-gnu"):
        (root / d).mkdir(parents=True)
    (root / "etc/ld.so.conf").write_text("")
    hidden = [sysconfig.get_paths()["stdlib"], os.path.dirname(pyxis_hook.__file__)]
    p = _container(root, " && ".join(f"mount -t tmpfs none {d}" for d in hidden) + " && exec sleep 600")
    try:
        script = f"""
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.plan.build import LdcacheUpdate, MountEdit, Plan
plan = Plan(rootfs={str(root)!r},
            mounts=(MountEdit({str(host / "lib/libcuda.so.535.104.05")!r}, "{LIBDIR}/libcuda.so.535.104.05"),),
            ldcache=LdcacheUpdate("merge", "/sbin/ldconfig", ("{LIBDIR}",),
                                  libs=(("{LIBDIR}", "libcuda.so.535.104.05", "libcuda.so.1", 0x303),)))
for m in apply_plan(plan, {p.pid}).messages:
    print(m)
"""
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert "ldconfig ran" in r.stdout, r.stdout
    finally:
        p.kill()
        p.wait()


# ------------------------------------------------------- legacy mount path


def test_legacy_reopen_failure_leaves_no_mount(world, monkeypatch):
    """Kernels < 5.12: the bind is made, then reopening the target fails; the bind is undone all the same."""
    from pyxis_hook.apply import rootwrite

    host, root, pid = world
    monkeypatch.setattr(mountapi, "HAVE_NEW_MOUNT_API", False)
    monkeypatch.setattr(lookup, "HAVE_OPENAT2", False)

    def reopen(self):
        raise OSError(errno.ESTALE, os.strerror(errno.ESTALE))

    monkeypatch.setattr(rootwrite.Entry, "reopen", reopen)
    plan = Plan(rootfs=str(root), mounts=(MountEdit(str(host / "lib/libcuda.so.535.104.05"),
                                                    f"{LIBDIR}/libcuda.so.535.104.05"),))
    with pytest.raises(ApplyError, match=r"libcuda.so.535.104.05: cannot reopen after mounting: Stale file handle"):
        apply_plan(plan, pid)
    assert _mounts_under(pid, root) == {}


# ----------------------------------------------------------------- logging


def test_every_message_is_logged_once(world, tmp_path):
    """The host side's warnings (a GPU dir that cannot be opened) and the child's notes, each once in the log."""
    host, root, pid = world
    hd = _proc_tree(host, ["0000:06:00.0"])
    (root / "proc/driver/nvidia").mkdir(parents=True)
    view = ProcDriverView(str(hd), (("params", "ModifyDeviceFiles: 0\n"),), ("0000:06:00.0", "0000:09:00.0"))
    logfile = tmp_path / "hook.log"
    log.configure(str(logfile), "info", "error")
    try:
        res = apply_plan(Plan(rootfs=str(root), proc_driver=view, cgroup_rules=(CgroupRule(195, 0),)), pid)
        res2 = apply_plan(Plan(rootfs=str(root), proc_driver=view), pid)
    finally:
        log.configure()
    text = logfile.read_text()
    assert any("0000:09:00.0" in m and "not bound" in m for m in res.messages)
    assert any("already this hook's view" in m for m in res2.messages)
    for m in res.messages + res2.messages:
        assert text.count(f"info: {m}\n") == (2 if m in res.messages and m in res2.messages else 1), m


def test_a_syscall_the_kernel_refuses_in_the_child_is_the_runtime_s_one_apply_error_line(world, monkeypatch):
    """A refused setns is no bug: its line reaches the runtime as an ApplyError, word for word."""
    host, root, pid = world

    def refused(fd, nstype, what=""):
        raise syscall.SyscallError(f"setns {what}: Operation not permitted", errno.EPERM)

    monkeypatch.setattr(namespaces, "setns", refused)
    with pytest.raises(ApplyError, match=r"^setns container mount namespace: Operation not permitted$"):
        apply_plan(_basic_plan(host, root), pid)
    assert _mounts_under(pid, root) == {}


def test_internal_error_in_the_child_is_one_line_and_a_file_free_trace_in_the_log(world, tmp_path, monkeypatch):
    """A bug after setns: the runtime gets one line; the log gets the frames, read from no file
    (traceback/linecache would import and open paths that name the image's files there)."""
    host, root, pid = world

    def broken(*args, **kwargs):
        raise KeyError("boom")

    monkeypatch.setattr(apply_mod, "_child", broken)
    logfile = tmp_path / "hook.log"
    log.configure(str(logfile), "debug", "error")
    try:
        with pytest.raises(ApplyError, match=r"^internal error while applying the plan: KeyError: 'boom'$"):
            apply_plan(_basic_plan(host, root), pid)
    finally:
        log.close()
    text = logfile.read_text()
    assert "apply: internal error\nTraceback (most recent call last, source lines not read):" in text
    assert f'File "{apply_mod.__file__}", line ' in text and ", in _outcome" in text
    assert "in broken\nKeyError: 'boom'" in text
    assert _mounts_under(pid, root) == {}  # nothing mounted


def test_frames_match_traceback_without_source_lines():
    import traceback

    def inner():
        raise ValueError("x")

    try:
        inner()
    except ValueError as e:
        mine = log.frames(e).splitlines()
        theirs = [ln for ln in traceback.format_exc().splitlines() if ln.startswith('  File "')]
    assert mine[1:-1] == theirs
    assert mine[-1] == "ValueError: x"


def test_the_import_guard_lets_only_in_memory_modules_through():
    """Builtin and frozen modules come from the interpreter's memory; everything else would be a file."""
    assert apply_mod._NoImports.find_spec("_collections") is None  # builtin
    assert apply_mod._NoImports.find_spec("zipimport") is None  # frozen
    for name in ("xml", "json", "pyxis_hook.engines.cdi"):
        with pytest.raises(ImportError, match=f"no import inside the container's mount namespace: {name}"):
            apply_mod._NoImports.find_spec(name)


def test_the_child_ends_even_when_reporting_its_own_error_fails(world, monkeypatch, no_hang):
    """A bug in the child's error handling must not send it back into the caller's code (it sits in the
    container's mount namespace as root): it ends, and the parent reports that nothing came back."""
    host, root, pid = world

    def broken(*args, **kwargs):
        raise KeyError("boom")

    def frames_fails(exc):
        raise RuntimeError("cannot format")

    monkeypatch.setattr(apply_mod, "_child", broken)
    monkeypatch.setattr(log, "frames", frames_fails)
    monkeypatch.setattr(apply_mod, "_home", lambda: None)  # the forked way
    parent = os.getpid()
    with pytest.raises(ApplyError, match=r"died \(wait status 0x100\); nothing reported"):  # exit status 1
        try:
            apply_plan(_basic_plan(host, root), pid)
        finally:
            if os.getpid() != parent:  # the child came back into its caller: the bug this test is about
                os._exit(99)
    assert _mounts_under(pid, root) == {}


def _where() -> tuple:
    """This process's mount namespace, root and working directory, as (dev, inode) pairs."""
    return tuple((st.st_dev, st.st_ino) for st in (os.stat("/proc/self/ns/mnt"), os.stat("/"), os.stat(".")))


def test_in_place_the_hook_comes_back_to_its_namespace_root_and_directory(world, tmp_path, monkeypatch):
    """Worked in place (no fork): the plan is in the container and the hook is back where it was."""
    host, root, pid = world
    forks = []
    monkeypatch.setattr(apply_mod, "_in_child", lambda *a: forks.append(a))
    monkeypatch.chdir(tmp_path)
    before = _where()
    result = apply_plan(_basic_plan(host, root), pid)
    assert forks == [] and _where() == before
    assert apply_mod._NoImports not in sys.meta_path
    assert f"{LIBDIR}/libcuda.so.535.104.05" in result.mounted
    assert _inside(pid, "cat", f"{root}/usr/bin/nvidia-smi").stdout == "#!/bin/true\n"
    assert not os.path.exists(f"{root}/usr/bin/nvidia-smi") or _mounts_under("self", root) == {}


def test_in_place_a_failure_undoes_everything_and_comes_back(world, tmp_path, monkeypatch):
    """A refused bind in place: one ApplyError, nothing left in the container, the hook back home."""
    host, root, pid = world
    monkeypatch.chdir(tmp_path)
    before = _where()
    real, done = apply_mod.mounts.bind, []

    def third_refused(b, *args):
        if len(done) == 2:
            raise ApplyError(f"bind {b.container_path}: refused")
        done.append(real(b, *args))

    monkeypatch.setattr(apply_mod.mounts, "bind", third_refused)
    with pytest.raises(ApplyError, match=f"^bind {LIBDIR}/libcuda.so.535.104.05: refused$"):
        apply_plan(_basic_plan(host, root), pid)
    assert len(done) == 2 and _where() == before
    assert _mounts_under(pid, root) == {}


def test_in_place_a_bug_comes_back_before_it_is_reported(world, tmp_path, monkeypatch):
    """A bug in the error handling itself, in place: it surfaces on the host, not in the container."""
    host, root, pid = world

    def broken(*args, **kwargs):
        namespaces.enter_mount_ns(args[1])
        raise KeyError("boom")

    def frames_fails(exc):
        raise RuntimeError("cannot format")

    monkeypatch.setattr(apply_mod, "_child", broken)
    monkeypatch.setattr(log, "frames", frames_fails)
    before = _where()
    with pytest.raises(RuntimeError, match="cannot format"):
        apply_plan(_basic_plan(host, root), pid)
    assert _where() == before


def test_in_place_a_failed_return_ends_the_process_with_one_line(world):
    """When the way back is refused, the process ends at once (it sits in the container's namespace)."""
    host, root, pid = world
    r, w = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - reported through the pipe and the exit status
        try:
            os.dup2(w, 2)
            real = namespaces.setns

            def back_refused(fd, nstype, what=""):
                if what.startswith("the hook's own"):
                    raise syscall.SyscallError(f"setns {what}: Operation not permitted", errno.EPERM)
                real(fd, nstype, what)

            namespaces.setns = back_refused
            apply_plan(_basic_plan(host, root), pid)
        finally:
            os._exit(99)  # never reached when the hook ends itself
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 70, err
    assert err == ("pyxis-hook: error: cannot return to the hook's own mount namespace: "
                   "setns the hook's own mount namespace: Operation not permitted\n")


def test_a_threaded_caller_applies_through_a_forked_child(world, tmp_path, monkeypatch):
    """setns(CLONE_NEWNS) refuses a threaded process: a caller with a thread gets the forked way."""
    import threading

    host, root, pid = world
    forks = []
    real = apply_mod._in_child

    def counted(*args):
        forks.append(1)
        return real(*args)

    monkeypatch.setattr(apply_mod, "_in_child", counted)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        before = _where()
        result = apply_plan(_basic_plan(host, root), pid)
    finally:
        stop.set()
        t.join()
    assert forks == [1] and _where() == before
    assert f"{LIBDIR}/libcuda.so.535.104.05" in result.mounted


def test_in_place_only_where_the_way_back_is_allowed():
    """A mount namespace of an ancestor user namespace (a hook in a new user namespace, its mount
    namespace the host's) could be entered but never returned to: such a hook forks instead.
    One whose mount namespace belongs to its own user namespace works in place."""
    code = ("import os, sys; sys.path.insert(0, %r)\n"
            "from pyxis_hook.apply import child\n"
            "from pyxis_hook.kernel import namespaces\n"
            "fd = os.open('/proc/self/ns/mnt', os.O_RDONLY)\n"
            "print(namespaces.owned_by_own_userns(fd), child._home() is not None)\n") % os.path.dirname(
                os.path.dirname(apply_mod.__file__.rsplit("/", 1)[0]))
    for flags, expected in ((["-U", "-r"], "False False"), (["-U", "-r", "-m"], "True True"), ([], "True True")):
        r = subprocess.run(["unshare", *flags, sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == expected, (flags, r.stdout, r.stderr)
