"""hostdirs: which mounts of a container are host filesystems bound in (the rule on mountinfo text, no root).

The shapes are mountinfo lines as the kernel writes them for the runtimes the
hook runs under; the root tests (`tests/root/test_hostdirs_root.py`) make
them for real and check that nothing lands on the host.
"""

from __future__ import annotations

import os

from hypothesis import given, strategies as st

from pyxis_hook.apply import hostdirs, mounttable

#: the hook's own namespace on a node: / on a disk, devtmpfs /dev, a tmpfs /run, a podman overlay
HOST = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
23 22 0:5 / /dev rw,nosuid shared:2 - devtmpfs udev rw
24 23 0:21 / /dev/shm rw shared:3 - tmpfs tmpfs rw
25 22 0:22 / /run rw shared:4 - tmpfs tmpfs rw
26 22 0:40 / /var/lib/containers/storage/overlay/abc/merged rw - overlay overlay rw
27 22 0:41 / /srv/my\\040data rw - btrfs /dev/sdb rw
"""


def test_every_filesystem_of_the_hooks_namespace_is_the_hosts():
    host = mounttable.host_filesystems(HOST, None)
    assert host == {"8:1": "/", "0:5": "/dev", "0:21": "/dev/shm", "0:22": "/run", "0:40":
                    "/var/lib/containers/storage/overlay/abc/merged", "0:41": "/srv/my\\040data"}


def test_the_containers_own_mounts_in_the_hooks_namespace_are_left_out():
    """enroot: the hook runs in the container's namespace, which holds the host's mounts and, below the
    rootfs, the container's: its rootfs bind, the /dev tmpfs of ENROOT_RESTRICT_DEV, a devpts."""
    enroot = HOST + """\
40 22 8:1 /home/u/.local/share/enroot/pyxis_1 /home/u/.local/share/enroot/pyxis_1 rw - ext4 /dev/sda1 rw
41 40 0:50 / /home/u/.local/share/enroot/pyxis_1/dev rw - tmpfs tmpfs rw
42 41 0:51 / /home/u/.local/share/enroot/pyxis_1/dev/pts rw - devpts devpts rw
43 41 0:21 / /home/u/.local/share/enroot/pyxis_1/dev/shm rw - tmpfs tmpfs rw
"""
    host = mounttable.host_filesystems(enroot, "/home/u/.local/share/enroot/pyxis_1")
    assert "0:50" not in host and "0:51" not in host  # the container's tmpfs and devpts: private
    assert host["8:1"] == "/" and host["0:21"] == "/dev/shm"  # the host's, wherever else they are bound
    # a sibling that merely starts with the same name is not below the rootfs
    sibling = enroot + "44 22 0:52 / /home/u/.local/share/enroot/pyxis_10 rw - tmpfs tmpfs rw\n"
    assert mounttable.host_filesystems(sibling, "/home/u/.local/share/enroot/pyxis_1")["0:52"].endswith("pyxis_10")


def test_a_rootfs_at_the_root_leaves_nothing_out_but_claims_nothing():
    assert mounttable.host_filesystems(HOST, "/") == {}


def test_escape_matches_the_kernels_mount_points():
    assert mounttable.escape("/srv/my data\\x\tb\nc") == "/srv/my\\040data\\134x\\011b\\012c"
    assert "0:41" not in mounttable.host_filesystems(HOST, mounttable.escape("/srv/my data"))


def test_device_of_a_mount_id():
    table = HOST + "garbage\n\n"
    assert [mounttable.device_of(table, i) for i in range(22, 28)] == ["8:1", "0:5", "0:21", "0:22", "0:40", "0:41"]
    assert mounttable.device_of(table, 2) is None and mounttable.device_of(table, 220) is None


_POINT = st.sampled_from(["/", "/dev", "/run", "/r", "/r/dev", "/r/x", "/rr", "0:5", "/srv/my\\040data"])


@given(st.lists(st.tuples(st.sampled_from(["8:1", "0:5", "0:21"]), st.sampled_from(["/", "0:5", "/r"]), _POINT),
                max_size=10), st.sampled_from([None, "/", "/r", "/r/"]))
def test_filesystem_point_answers_as_the_whole_map(rows, rootfs_point):
    """From the lines naming the filesystem only, the same first point outside the rootfs as parsing every line;
    the same text as a root, a point or a source is not a filesystem."""
    table = "".join(f"{30 + i} 1 {dev} {root} {point} rw shared:1 - tmpfs {dev} rw\n"
                    for i, (dev, root, point) in enumerate(rows))
    whole = mounttable.host_filesystems(table, rootfs_point)
    for dev in ("8:1", "0:5", "0:21", "0:99"):
        assert mounttable.filesystem_point(table, dev, rootfs_point) == whole.get(dev)


def test_rootfs_point_only_when_it_is_the_directory_written_in(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to("real")
    st = os.stat(real)
    assert hostdirs.rootfs_point(str(tmp_path / "link"), st) == str(real)
    # the name leads elsewhere now than where the child writes: no point, nothing left out
    assert hostdirs.rootfs_point(str(tmp_path / "link"), os.stat(tmp_path)) is None
    assert hostdirs.rootfs_point(str(tmp_path / "gone"), st) is None


def test_the_mount_tables_are_read_once_and_the_hosts_fd_released():
    """The host's mountinfo fd, opened at construction, is read once (the map is kept) and closed by that read;
    the rootfs's own mount is the container's, another mount of this namespace is judged by the table."""
    import errno
    import fcntl

    import pytest

    with open("/proc/self/mountinfo") as f:
        want = mounttable.host_filesystems(f.read(), None)
    h = hostdirs.HostDirs(None)
    fd = h._ours
    try:
        assert h.host_devices() == frozenset(want) == h.host_devices()
        with pytest.raises(OSError) as e:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        assert e.value.errno == errno.EBADF
        root = os.open("/", os.O_PATH | os.O_DIRECTORY)
        proc = os.open("/proc", os.O_PATH | os.O_DIRECTORY)
        try:
            assert h.why(root, root) is None
            assert "host directory" in (h.why(proc, root) or "")  # /proc is a mount of this (the hook's) namespace
        finally:
            os.close(root)
            os.close(proc)
    finally:
        h.close()
    h.close()


def test_a_table_the_start_read_already_is_used_not_read_again():
    """Pinning read the hook's own mount table; the same start's HostDirs takes it and opens none of its own."""
    h = hostdirs.HostDirs(None, HOST)
    try:
        assert h._ours == -1
        assert h.host_devices() == frozenset({"8:1", "0:5", "0:21", "0:22", "0:40", "0:41"})
    finally:
        h.close()
