"""Root tests: pyxis_hook.loader.ldconf's reader: one reader for the hook and ldcheck, bounded, blind to /proc and /sys.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/loader/test_ldconf.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import stat
import pytest

from pyxis_hook.loader.conftree import DEVICE
from unit.loader.test_ldconf import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    live_proc_and_sys,
    read,
    write,
)


@pytest.mark.root
def test_device_nodes_are_refused(tmp_path, no_hang):
    """A conf.d file that is a device, and ld.so.conf linked to the image's /dev/zero (runc's, at prestart)."""
    write(tmp_path, "/etc/ld.so.conf", "/opt/a\ninclude /etc/ld.so.conf.d/*.conf\n")
    os.mkdir(tmp_path / "etc/ld.so.conf.d")
    os.mknod(tmp_path / "etc/ld.so.conf.d/tape.conf", stat.S_IFCHR | 0o600, os.makedev(9, 0))
    conf = read(tmp_path)
    assert conf.stop == DEVICE and conf.unsafe and conf.dirs == ("/opt/a",)
    assert conf.problems == (f"/etc/ld.so.conf.d/tape.conf (in {tmp_path}) (included at /etc/ld.so.conf:2): "
                             "a character device, not a configuration file",)

    os.unlink(tmp_path / "etc/ld.so.conf")
    os.symlink("/dev/zero", tmp_path / "etc/ld.so.conf")
    os.mkdir(tmp_path / "dev")
    os.mknod(tmp_path / "dev/zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    conf = read(tmp_path)
    assert conf.stop == DEVICE and conf.files_read == () and "a character device" in conf.problems[0]


@pytest.mark.root
def test_live_proc_and_sys_are_never_read_nor_walked(live_proc_and_sys, no_hang):
    root = live_proc_and_sys
    write(root, "/opt/a/x.conf", "/opt/x\n")
    os.symlink("/proc/version", root / "opt/version.conf")
    write(root, "/etc/ld.so.conf", "include /proc/version /proc/self/status /opt/version.conf\n"
                                   "include /sys/kernel/*\n" + "include /*/*/*/*/*/*\n" * 300 + "include /*/*/*.conf\n")
    conf = read(root)
    assert conf.stop == "" and not conf.truncated
    assert conf.files_read == ("/etc/ld.so.conf", "/opt/a/x.conf") and conf.dirs == ("/opt/x",)
    # /opt/version.conf exists (a link, as glob's lstat sees it) and leads to nothing
    assert conf.unmatched_includes[:3] == (("/etc/ld.so.conf", 1, "/proc/version"),
                                           ("/etc/ld.so.conf", 1, "/proc/self/status"),
                                           ("/etc/ld.so.conf", 2, "/sys/kernel/*"))
