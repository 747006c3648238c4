"""Facts about a container's rootfs that decide where injected files land.

Only existence checks and small reads, always resolved inside the rootfs
(`rootfs.resolve_in_root`), never executing anything from the image.  The
rules are libnvidia-container's: an image with /etc/debian_version gets the
multiarch dirs, any other gets /usr/lib64 (and /usr/lib32 or /usr/lib for
32-bit libraries).
"""

from __future__ import annotations

import os

from pyxis_hook.plan import ContainerFacts
from pyxis_hook.rootfs import try_resolve_in_root

#: machine -> (Debian multiarch triplet, 32-bit companion triplet or None)
TRIPLETS = {
    "x86_64": ("x86_64-linux-gnu", "i386-linux-gnu"),
    "aarch64": ("aarch64-linux-gnu", None),
    "ppc64le": ("powerpc64le-linux-gnu", None),
}


def _exists(rootfs: str, path: str) -> bool:
    host = try_resolve_in_root(rootfs, path)  # a looping link in the image: as if absent
    return host is not None and os.path.lexists(host)


def _isdir(rootfs: str, path: str) -> bool:
    host = try_resolve_in_root(rootfs, path)
    return host is not None and os.path.isdir(host)


def container_facts(rootfs: str, *, machine: str | None = None) -> ContainerFacts:
    """Inspect `rootfs` (a host path) and return where libraries, 32-bit libraries and binaries go."""
    machine = machine or os.uname().machine  # not `platform` (hook path imports)
    triplet, triplet32 = TRIPLETS.get(machine, (f"{machine}-linux-gnu", None))
    debian_like = _exists(rootfs, "/etc/debian_version")
    if debian_like:
        lib_dir = f"/usr/lib/{triplet}"
        lib32_dir = f"/usr/lib/{triplet32}" if triplet32 else ""
    else:
        lib_dir = "/usr/lib64"
        if _isdir(rootfs, "/usr/lib32"):
            lib32_dir = "/usr/lib32"
        elif try_resolve_in_root(rootfs, "/usr/lib") != try_resolve_in_root(rootfs, lib_dir):
            lib32_dir = "/usr/lib"
        else:
            lib32_dir = ""
    return ContainerFacts(
        rootfs=rootfs,
        lib_dir=lib_dir,
        lib32_dir=lib32_dir,
        bin_dir="/usr/bin",
        has_ld_so_conf=_exists(rootfs, "/etc/ld.so.conf"),
    )
