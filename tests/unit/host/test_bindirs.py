"""The prefix of a driver library's directory, where a prefix install keeps its binaries."""

from __future__ import annotations

import pytest

from pyxis_hook.host.bindirs import driver_prefix, prefix_bin_dirs


@pytest.mark.parametrize("lib_dir, prefix", [
    ("/usr/local/nvidia/lib64", "/usr/local/nvidia"),
    ("/usr/local/nvidia/lib", "/usr/local/nvidia"),
    ("/opt/nvidia/535/lib64", "/opt/nvidia/535"),
    ("/home/kubernetes/bin/nvidia/lib64", "/home/kubernetes/bin/nvidia"),
    ("/usr/lib/x86_64-linux-gnu", "/usr"),                     # NVIDIA's installer on Debian
    ("/usr/lib/x86_64-linux-gnu/nvidia/current", "/usr"),      # Debian's packages
    ("/usr/lib64", "/usr"),
    ("/var/lib/nvidia/lib64", "/var/lib/nvidia"),              # the last lib component ends the prefix
    ("/lib64", "/"),
    ("/opt/nvidia", None),                                     # no library dir name: no prefix to tell
    ("/opt/libnvidia/x", None),
])
def test_driver_prefix(lib_dir, prefix):
    assert driver_prefix(lib_dir) == prefix


def test_prefix_bin_dirs_in_first_seen_order_each_once():
    dirs = ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/opt/x", "/lib64", "/usr/lib/i386-linux-gnu"]
    assert prefix_bin_dirs(dirs) == ["/usr/local/nvidia/bin", "/usr/local/nvidia/sbin", "/bin", "/sbin",
                                     "/usr/bin", "/usr/sbin"]
