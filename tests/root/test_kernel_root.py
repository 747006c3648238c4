"""Root tests: ctypes syscall wrappers against the running kernel (no mocks).

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/kernel/test_kernel.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import errno
import os
import threading
import pytest
from fixtures.forked import run_forked
from pyxis_hook.kernel import lookup, mountapi, namespaces, process, syscall
from unit.kernel.test_kernel import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _bind_case,
    _options,
    _status_caps,
)


@pytest.mark.root
def test_unshare_mount_umount_setns(tmp_path):
    d = tmp_path / "m"
    d.mkdir()

    def child():
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY)
        namespaces.unshare(namespaces.CLONE_NEWNS)
        mountapi.mount(None, "/", None, mountapi.MS_REC | mountapi.MS_PRIVATE)
        mountapi.mount("tmpfs", str(d), "tmpfs", mountapi.MS_NOSUID, "size=1m")
        assert any(line.split()[4] == str(d) for line in open("/proc/self/mountinfo"))
        namespaces.setns(home, namespaces.CLONE_NEWNS)
        assert not any(line.split()[4] == str(d) for line in open("/proc/self/mountinfo"))

    run_forked(child)
    assert not any(line.split()[4] == str(d) for line in open("/proc/self/mountinfo"))
    with pytest.raises(syscall.SyscallError, match=f"umount {d}: Invalid argument"):
        mountapi.umount2(str(d))


@pytest.mark.root
def test_setns_mount_ns_needs_a_single_thread():
    def child():
        home = os.open("/proc/self/ns/mnt", os.O_RDONLY)
        stop = threading.Event()
        t = threading.Thread(target=stop.wait)
        t.start()
        try:
            try:
                namespaces.setns(home, namespaces.CLONE_NEWNS)
            except syscall.SyscallError as e:
                assert e.errno == errno.EINVAL
            else:
                raise AssertionError("setns succeeded with two threads")
        finally:
            stop.set()
            t.join()

    run_forked(child)


@pytest.mark.root
def test_open_tree_setattr_move_mount_and_umount_by_fd(tmp_path):
    def body(src, tgt, sfd, tfd):
        tree = mountapi.open_tree(sfd, "", mountapi.OPEN_TREE_CLONE | mountapi.OPEN_TREE_CLOEXEC | syscall.AT_EMPTY_PATH)
        mountapi.mount_setattr(tree, "", syscall.AT_EMPTY_PATH,
                             mountapi.MOUNT_ATTR_RDONLY | mountapi.MOUNT_ATTR_NOSUID | mountapi.MOUNT_ATTR_NODEV, 0,
                             mountapi.MS_PRIVATE)
        mountapi.move_mount(tree, "", tfd, "", mountapi.MOVE_MOUNT_F_EMPTY_PATH | mountapi.MOVE_MOUNT_T_EMPTY_PATH)
        assert open(tgt).read() == "host"
        try:
            open(tgt, "w")
        except OSError as e:
            assert e.errno == errno.EROFS
        else:
            raise AssertionError("writable")
        assert _options(tgt) >= {"ro", "nosuid", "nodev"}
        mountapi.umount2(lookup.proc_fd_path(tree), mountapi.MNT_DETACH)
        assert open(tgt).read() == ""

    _bind_case(tmp_path, body)


@pytest.mark.root
def test_legacy_bind_remount_via_proc_fd(tmp_path):
    def body(src, tgt, sfd, tfd):
        mountapi.mount(lookup.proc_fd_path(sfd), lookup.proc_fd_path(tfd), None, mountapi.MS_BIND)
        top = os.open(tgt, os.O_PATH | os.O_NOFOLLOW)
        mountapi.mount(None, lookup.proc_fd_path(top), None,
                     mountapi.MS_REMOUNT | mountapi.MS_BIND | mountapi.MS_RDONLY | mountapi.MS_NOSUID)
        assert _options(tgt) >= {"ro", "nosuid"}
        mountapi.umount2(lookup.proc_fd_path(top))
        assert not any(x.split()[4] == str(tgt) for x in open("/proc/self/mountinfo"))

    _bind_case(tmp_path, body)


@pytest.mark.root
def test_fsmount_tmpfs(tmp_path):
    d = tmp_path / "d"
    d.mkdir()

    def child():
        namespaces.unshare(namespaces.CLONE_NEWNS)
        mountapi.mount(None, "/", None, mountapi.MS_REC | mountapi.MS_PRIVATE)
        fs = mountapi.fsopen("tmpfs")
        mountapi.fsconfig_string(fs, "mode", "0555")
        mountapi.fsconfig_create(fs)
        mnt = mountapi.fsmount(fs, mountapi.MOUNT_ATTR_NOEXEC)
        fd = os.open("f", os.O_WRONLY | os.O_CREAT, 0o444, dir_fd=mnt)
        os.write(fd, b"hi")
        os.close(fd)
        dfd = os.open(d, os.O_PATH)
        mountapi.move_mount(mnt, "", dfd, "", mountapi.MOVE_MOUNT_F_EMPTY_PATH | mountapi.MOVE_MOUNT_T_EMPTY_PATH)
        assert open(d / "f").read() == "hi"
        assert oct(os.stat(d).st_mode & 0o777) == "0o555"
        with pytest.raises(syscall.SyscallError, match="fsconfig nonsense-key=1"):
            mountapi.fsconfig_string(fs, "nonsense-key", "1")

    run_forked(child)


@pytest.mark.root
def test_capset_bounding_drop_and_ambient_clear():
    """Each wrapper changes exactly its set, as /proc/self/status reports it."""
    CAP_NET_RAW, PR_CAP_AMBIENT_RAISE = 13, 2

    def child():
        eff, prm, _inh = process.capget()
        assert prm >> CAP_NET_RAW & 1 and prm >> process.CAP_SETPCAP & 1
        process.capset(eff, prm, 1 << CAP_NET_RAW)
        process.prctl(process.PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_RAW)
        assert _status_caps()["CapAmb"] == 1 << CAP_NET_RAW
        process.clear_ambient()
        assert _status_caps()["CapAmb"] == 0
        process.capbset_drop(CAP_NET_RAW)
        assert not process.capbset_has(CAP_NET_RAW)
        assert _status_caps()["CapBnd"] >> CAP_NET_RAW & 1 == 0
        keep = 1 << process.CAP_DAC_OVERRIDE | 1 << process.CAP_FOWNER
        process.capset(keep, keep, 0)
        caps = _status_caps()
        assert (caps["CapEff"], caps["CapPrm"], caps["CapInh"]) == (keep, keep, 0)
        assert process.capget() == (keep, keep, 0)
        with pytest.raises(syscall.SyscallError, match=r"^capset effective=0x3 permitted=0x3: Operation not "
                                                      r"permitted$") as e:
            process.capset(0b11, 0b11, 0)  # CAP_CHOWN was never kept: raising it is refused
        assert e.value.errno == errno.EPERM
        with pytest.raises(syscall.SyscallError) as e:  # CAP_SETPCAP is gone
            process.capbset_drop(process.CAP_CHOWN)
        assert e.value.errno == errno.EPERM

    run_forked(child)
