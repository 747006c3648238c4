"""ctypes syscall wrappers against the running kernel (no mocks).

Namespace-changing checks run in a forked child so the test process keeps its
own mount namespace; the child reports failures through a pipe.
"""

from __future__ import annotations

import errno
import os
import threading

import pytest

from fixtures.forked import run_forked
from pyxis_hook.apply import kernel
from pyxis_hook.errors import ApplyError, InternalSignal


def test_errors_are_one_line_with_errno(tmp_path):
    with pytest.raises(kernel.SyscallError) as e:
        kernel.openat2(kernel.AT_FDCWD, str(tmp_path / "missing"), os.O_RDONLY)
    assert e.value.errno == errno.ENOENT
    assert isinstance(e.value, InternalSignal) and not isinstance(e.value, ApplyError)  # apply's child words it
    assert str(e.value) == f"open {tmp_path}/missing: No such file or directory"
    with pytest.raises(kernel.SyscallError, match="setns fd 9999: Bad file descriptor"):
        kernel.setns(9999, kernel.CLONE_NEWNS)


def test_probes_on_this_kernel():
    assert kernel.have_openat2() is True
    assert kernel.have_new_mount_api() is True


def test_openat2_resolve_modes(tmp_path):
    root = tmp_path / "r"
    (root / "etc").mkdir(parents=True)
    (root / "etc/x").write_text("in root")
    (root / "abs").symlink_to("/")
    (root / "up").symlink_to("../../../..")
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for p in ("abs/etc/x", "up/etc/x", "/etc/x", "../../etc/x"):
            fd = kernel.openat2(rfd, p, os.O_RDONLY, 0, kernel.RESOLVE_IN_ROOT)
            assert os.read(fd, 100) == b"in root"
            os.close(fd)
        with pytest.raises(kernel.SyscallError) as e:
            kernel.openat2(rfd, "abs/etc/x", os.O_RDONLY, 0, kernel.RESOLVE_BENEATH)
        assert e.value.errno == errno.EXDEV
    finally:
        os.close(rfd)
    # magic links refused
    with pytest.raises(kernel.SyscallError) as e:
        kernel.openat2(kernel.AT_FDCWD, "/proc/self/root/etc/passwd", os.O_RDONLY, 0, kernel.RESOLVE_NO_MAGICLINKS)
    assert e.value.errno == errno.ELOOP


@pytest.mark.root
def test_unshare_mount_umount_setns(tmp_path):
    d = tmp_path / "m"
    d.mkdir()

    def child():
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY)
        kernel.unshare(kernel.CLONE_NEWNS)
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        kernel.mount("tmpfs", str(d), "tmpfs", kernel.MS_NOSUID, "size=1m")
        assert any(line.split()[4] == str(d) for line in open("/proc/self/mountinfo"))
        kernel.setns(home, kernel.CLONE_NEWNS)
        assert not any(line.split()[4] == str(d) for line in open("/proc/self/mountinfo"))

    run_forked(child)
    assert not any(line.split()[4] == str(d) for line in open("/proc/self/mountinfo"))
    with pytest.raises(kernel.SyscallError, match=f"umount {d}: Invalid argument"):
        kernel.umount2(str(d))


@pytest.mark.root
def test_setns_mount_ns_needs_a_single_thread():
    def child():
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY)
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            try:
                kernel.setns(home, kernel.CLONE_NEWNS)
            except kernel.SyscallError as e:
                assert e.errno == errno.EINVAL
            else:
                raise AssertionError("setns succeeded with two threads")
        finally:
            stop.set()
            t.join()

    run_forked(child)


def _bind_case(tmp_path, body) -> None:
    """A host file `src` and a mount point `tgt`; `body(src, tgt, sfd, tfd)` runs in a child's private mount ns."""
    src = tmp_path / "src"
    src.write_text("host")
    tgt = tmp_path / "tgt"
    tgt.write_text("")

    def child():
        kernel.unshare(kernel.CLONE_NEWNS)
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        body(src, tgt, os.open(src, os.O_PATH), os.open(tgt, os.O_PATH | os.O_NOFOLLOW))

    run_forked(child)


def _options(tgt) -> set[str]:
    line = next(x for x in open("/proc/self/mountinfo") if x.split()[4] == str(tgt))
    return set(line.split()[5].split(","))


@pytest.mark.root
def test_open_tree_setattr_move_mount_and_umount_by_fd(tmp_path):
    def body(src, tgt, sfd, tfd):
        tree = kernel.open_tree(sfd, "", kernel.OPEN_TREE_CLONE | kernel.OPEN_TREE_CLOEXEC | kernel.AT_EMPTY_PATH)
        kernel.mount_setattr(tree, "", kernel.AT_EMPTY_PATH,
                             kernel.MOUNT_ATTR_RDONLY | kernel.MOUNT_ATTR_NOSUID | kernel.MOUNT_ATTR_NODEV, 0,
                             kernel.MS_PRIVATE)
        kernel.move_mount(tree, "", tfd, "", kernel.MOVE_MOUNT_F_EMPTY_PATH | kernel.MOVE_MOUNT_T_EMPTY_PATH)
        assert open(tgt).read() == "host"
        try:
            open(tgt, "w")
        except OSError as e:
            assert e.errno == errno.EROFS
        else:
            raise AssertionError("writable")
        assert _options(tgt) >= {"ro", "nosuid", "nodev"}
        kernel.umount2(kernel.proc_fd_path(tree), kernel.MNT_DETACH)
        assert open(tgt).read() == ""

    _bind_case(tmp_path, body)


@pytest.mark.root
def test_legacy_bind_remount_via_proc_fd(tmp_path):
    def body(src, tgt, sfd, tfd):
        kernel.mount(kernel.proc_fd_path(sfd), kernel.proc_fd_path(tfd), None, kernel.MS_BIND)
        top = os.open(tgt, os.O_PATH | os.O_NOFOLLOW)
        kernel.mount(None, kernel.proc_fd_path(top), None,
                     kernel.MS_REMOUNT | kernel.MS_BIND | kernel.MS_RDONLY | kernel.MS_NOSUID)
        assert _options(tgt) >= {"ro", "nosuid"}
        kernel.umount2(kernel.proc_fd_path(top))
        assert not any(x.split()[4] == str(tgt) for x in open("/proc/self/mountinfo"))

    _bind_case(tmp_path, body)


@pytest.mark.root
def test_fsmount_tmpfs(tmp_path):
    d = tmp_path / "d"
    d.mkdir()

    def child():
        kernel.unshare(kernel.CLONE_NEWNS)
        kernel.mount(None, "/", None, kernel.MS_REC | kernel.MS_PRIVATE)
        fs = kernel.fsopen("tmpfs")
        kernel.fsconfig_string(fs, "mode", "0555")
        kernel.fsconfig_create(fs)
        mnt = kernel.fsmount(fs, kernel.MOUNT_ATTR_NOEXEC)
        fd = os.open("f", os.O_WRONLY | os.O_CREAT, 0o444, dir_fd=mnt)
        os.write(fd, b"hi")
        os.close(fd)
        dfd = os.open(d, os.O_PATH)
        kernel.move_mount(mnt, "", dfd, "", kernel.MOVE_MOUNT_F_EMPTY_PATH | kernel.MOVE_MOUNT_T_EMPTY_PATH)
        assert open(d / "f").read() == "hi"
        assert oct(os.stat(d).st_mode & 0o777) == "0o555"
        with pytest.raises(kernel.SyscallError, match="fsconfig nonsense-key=1"):
            kernel.fsconfig_string(fs, "nonsense-key", "1")

    run_forked(child)


def test_no_new_privs():
    def child():
        kernel.no_new_privs()
        status = open("/proc/self/status").read()
        assert "NoNewPrivs:\t1" in status

    run_forked(child)


def _status_caps() -> dict[str, int]:
    """The Cap* lines of /proc/self/status as masks (the kernel's own report, to compare with)."""
    with open("/proc/self/status") as f:
        return {k: int(v, 16) for k, v in (line.split(":\t") for line in f.read().splitlines())
                if k.startswith("Cap")}


def test_cap_last_cap_is_procfs_without_procfs():
    with open("/proc/sys/kernel/cap_last_cap") as f:
        assert kernel.cap_last_cap() == int(f.read())


def test_capget_matches_proc_status():
    caps = _status_caps()
    assert kernel.capget() == (caps["CapEff"], caps["CapPrm"], caps["CapInh"])
    bounding = {c for c in range(kernel.cap_last_cap() + 1) if kernel.capbset_has(c)}
    assert sum(1 << c for c in bounding) == caps["CapBnd"]


@pytest.mark.root
def test_capset_bounding_drop_and_ambient_clear():
    """Each wrapper changes exactly its set, as /proc/self/status reports it."""
    CAP_NET_RAW, PR_CAP_AMBIENT_RAISE = 13, 2

    def child():
        eff, prm, _inh = kernel.capget()
        assert prm >> CAP_NET_RAW & 1 and prm >> kernel.CAP_SETPCAP & 1
        kernel.capset(eff, prm, 1 << CAP_NET_RAW)
        kernel.prctl(kernel.PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_RAW)
        assert _status_caps()["CapAmb"] == 1 << CAP_NET_RAW
        kernel.clear_ambient()
        assert _status_caps()["CapAmb"] == 0
        kernel.capbset_drop(CAP_NET_RAW)
        assert not kernel.capbset_has(CAP_NET_RAW)
        assert _status_caps()["CapBnd"] >> CAP_NET_RAW & 1 == 0
        keep = 1 << kernel.CAP_DAC_OVERRIDE | 1 << kernel.CAP_FOWNER
        kernel.capset(keep, keep, 0)
        caps = _status_caps()
        assert (caps["CapEff"], caps["CapPrm"], caps["CapInh"]) == (keep, keep, 0)
        assert kernel.capget() == (keep, keep, 0)
        with pytest.raises(kernel.SyscallError, match=r"^capset effective=0x3 permitted=0x3: Operation not "
                                                      r"permitted$") as e:
            kernel.capset(0b11, 0b11, 0)  # CAP_CHOWN was never kept: raising it is refused
        assert e.value.errno == errno.EPERM
        with pytest.raises(kernel.SyscallError) as e:  # CAP_SETPCAP is gone
            kernel.capbset_drop(kernel.CAP_CHOWN)
        assert e.value.errno == errno.EPERM

    run_forked(child)


def _header_nrs(path: str) -> dict[str, int]:
    import re

    with open(path) as f:
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", f.read())}


@pytest.mark.parametrize("arch,header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                         ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_arch_syscall_numbers_match_kernel_headers(arch, header):
    """The per-arch numbers are the kernel headers' (aarch64 uses the generic table)."""
    if not os.path.exists(header):
        pytest.skip(f"no {header}")
    nrs = _header_nrs(header)
    for name, nr in kernel._ARCH_NR[arch].items():
        assert nrs[name] == nr, (arch, name)
    for name, nr in kernel._GENERIC_NR.items():
        assert nrs[name] == nr, name


def test_every_arch_table_is_complete(monkeypatch):
    """ppc64le (arch/powerpc syscall.tbl) and the others name every per-arch syscall the wrappers use."""
    names = {"unshare", "setns", "mount", "umount2"}
    assert {"x86_64", "aarch64", "ppc64le"} <= set(kernel._ARCH_NR)
    for arch, table in kernel._ARCH_NR.items():
        assert set(table) == names, arch
    real = os.uname()
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(real[:4] + ("ppc64le",)))
    assert kernel._nr("setns") == 350 and kernel._nr("mount") == 21 and kernel._nr("open_tree") == 428
    monkeypatch.setattr(os, "uname", lambda: os.uname_result(real[:4] + ("s390x",)))
    with pytest.raises(ApplyError, match="unsupported architecture s390x"):
        kernel._nr("setns")
