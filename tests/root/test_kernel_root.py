"""Root tests: ctypes syscall wrappers against the running kernel (no mocks).

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/apply/test_kernel.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import errno
import os
import threading
import pytest
from fixtures.forked import run_forked
from pyxis_hook.apply import kernel, runnercalls
from unit.apply.test_kernel import (  # noqa: F401 - helpers and fixtures shared with the unit tests
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


@pytest.mark.root
def test_capset_bounding_drop_and_ambient_clear():
    """Each wrapper changes exactly its set, as /proc/self/status reports it."""
    CAP_NET_RAW, PR_CAP_AMBIENT_RAISE = 13, 2

    def child():
        eff, prm, _inh = runnercalls.capget()
        assert prm >> CAP_NET_RAW & 1 and prm >> runnercalls.CAP_SETPCAP & 1
        runnercalls.capset(eff, prm, 1 << CAP_NET_RAW)
        kernel.prctl(runnercalls.PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_RAW)
        assert _status_caps()["CapAmb"] == 1 << CAP_NET_RAW
        runnercalls.clear_ambient()
        assert _status_caps()["CapAmb"] == 0
        runnercalls.capbset_drop(CAP_NET_RAW)
        assert not runnercalls.capbset_has(CAP_NET_RAW)
        assert _status_caps()["CapBnd"] >> CAP_NET_RAW & 1 == 0
        keep = 1 << runnercalls.CAP_DAC_OVERRIDE | 1 << runnercalls.CAP_FOWNER
        runnercalls.capset(keep, keep, 0)
        caps = _status_caps()
        assert (caps["CapEff"], caps["CapPrm"], caps["CapInh"]) == (keep, keep, 0)
        assert runnercalls.capget() == (keep, keep, 0)
        with pytest.raises(kernel.SyscallError, match=r"^capset effective=0x3 permitted=0x3: Operation not "
                                                      r"permitted$") as e:
            runnercalls.capset(0b11, 0b11, 0)  # CAP_CHOWN was never kept: raising it is refused
        assert e.value.errno == errno.EPERM
        with pytest.raises(kernel.SyscallError) as e:  # CAP_SETPCAP is gone
            runnercalls.capbset_drop(runnercalls.CAP_CHOWN)
        assert e.value.errno == errno.EPERM

    run_forked(child)
