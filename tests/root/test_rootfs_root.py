"""Root tests: RootFS: fd-based resolution and creation inside a rootfs, with and without openat2.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/base/test_rootfs.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import errno
import os
import stat
import pytest
from pyxis_hook.apply.rootwrite import WritableRoot
from pyxis_hook.rootfs import RootPathError
from unit.base.test_rootfs import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    tree,
    use_openat2,
)


@pytest.mark.root
def test_a_device_node_under_a_file_name_is_never_opened(tree, use_openat2):
    """An image's char device named like a config file (or a link to one): refused from an O_PATH fstat.

    Major 240 is the local/experimental range with no driver here: opening it
    for reading would fail with ENXIO first, so "not a regular file" shows no
    driver open() ran (a watchdog device under that name would have been armed).
    """
    root, _ = tree
    os.mknod(root / "etc/ld.so.conf", 0o644 | stat.S_IFCHR, os.makedev(240, 0))
    os.symlink("ld.so.conf", root / "etc/link.conf")
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        for path in ("/etc/ld.so.conf", "/etc/link.conf"):
            with pytest.raises(RootPathError, match="not a regular file") as e:
                r.read_bytes(path, 4096)
            assert e.value.errno == errno.EINVAL
        with pytest.raises(RootPathError) as e:
            r.open_regular("/etc")
        assert e.value.errno == errno.EISDIR
        fd = r.open_regular("/etc/os-release")
        try:
            assert os.read(fd, 100) == b"ID=test\n"
        finally:
            os.close(fd)


@pytest.mark.root
def test_read_bytes_refuses_devices_and_dirs_and_caps_size(tree, use_openat2):
    root, _ = tree
    os.mknod(root / "etc/zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero: never ends
    (root / "etc/exact").write_bytes(b"y" * 4096)
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        with pytest.raises(RootPathError, match="not a regular file"):
            r.read_bytes("/etc/zero", 1 << 20)
        with pytest.raises(RootPathError) as e:
            r.read_bytes("/etc", 4096)
        assert e.value.errno == errno.EISDIR
        assert r.read_bytes("/etc/exact", 4096) == b"y" * 4096
        with pytest.raises(RootPathError, match="larger than"):
            r.read_bytes("/etc/exact", 4095)


@pytest.mark.root
def test_a_directory_mounted_over_between_two_entries_is_not_reused_stale(tree, use_openat2):
    """Entries into /opt/a, a tmpfs mounted onto /opt/a through its directory entry, more entries there:
    they land in the tmpfs (what the path names now), not in the directory it covers."""
    from pyxis_hook.kernel import lookup, mountapi

    root, _ = tree
    (root / "opt/a").mkdir(parents=True)
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        r.ensure_entry("/opt/a/x").close()
        d = r.ensure_entry("/opt/a", "dir")
        mountapi.mount("tmpfs", lookup.proc_fd_path(d.fd), "tmpfs", 0)
        d.close()
        try:
            r.ensure_entry("/opt/a/y").close()
            assert sorted(os.listdir(root / "opt/a")) == ["y"]  # the tmpfs, where the path leads now
            assert os.stat(root / "opt/a/y").st_dev != os.stat(root / "opt").st_dev
        finally:
            mountapi.umount2(str(root / "opt/a"))
        assert sorted(os.listdir(root / "opt/a")) == ["x"]
        assert r.rollback() == []
    assert os.listdir(root / "opt/a") == []
