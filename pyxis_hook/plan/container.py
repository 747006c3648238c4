"""Facts about a container's rootfs that decide where injected files land.

Only existence checks and small reads, always resolved inside the rootfs
(`rootfs.resolve_in_root`), never executing anything from the image.  The
rules are libnvidia-container's: an image with /etc/debian_version gets the
multiarch dirs, any other gets /usr/lib64 (and /usr/lib32 or /usr/lib for
32-bit libraries).

The image's CUDA forward-compat driver, when it has one, is read by
`plan/compat.py` (imported only for an image with /usr/local/cuda/compat).
"""

from __future__ import annotations

import posix
import stat

from pyxis_hook import pathnames
from pyxis_hook.errors import PathError
from pyxis_hook.loader import machines
from pyxis_hook.plan.build import COMPAT_DIR, ContainerFacts, link_paths
from pyxis_hook.record import replace
from pyxis_hook.rootfs import try_resolve_in_root


def _exists(rootfs: str, path: str) -> bool:
    host = try_resolve_in_root(rootfs, path)  # a looping link in the image: as if absent
    return host is not None and pathnames.lexists(host)


def _isdir(rootfs: str, path: str) -> bool:
    host = try_resolve_in_root(rootfs, path)
    return host is not None and pathnames.isdir(host)


def container_facts(rootfs: str, *, machine: str | None = None, files=()) -> ContainerFacts:
    """Inspect `rootfs` (a host path) and return where libraries, 32-bit libraries and binaries go.

    `files` are the driver files the container gets (`Inventory.select`): what
    the image holds at their links' paths becomes `link_occupants`.
    """
    machine = machine or posix.uname().machine  # not `platform` (hook path imports)
    triplet, triplet32 = machines.triplets(machine)
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
    libcuda, drivers, libs, problem = "", None, (), ""
    if _isdir(rootfs, COMPAT_DIR):
        from pyxis_hook.plan.compat import compat_facts

        libcuda, drivers, libs, problem = compat_facts(rootfs, machine)
    facts = ContainerFacts(
        rootfs=rootfs,
        lib_dir=lib_dir,
        lib32_dir=lib32_dir,
        bin_dir="/usr/bin",
        has_ld_so_conf=_exists(rootfs, "/etc/ld.so.conf"),
        compat_libcuda=libcuda,
        compat_drivers=drivers,
        compat_libs=libs,
        compat_problem=problem,
    )
    return with_occupants(facts, rootfs, files) if files else facts


def with_occupants(facts: ContainerFacts, rootfs: str, files) -> ContainerFacts:
    """`facts` with what the image at `rootfs` holds at the links' paths of the driver `files`."""
    return replace(facts, link_occupants=link_occupants(rootfs, link_paths(files, facts)))


def link_occupants(rootfs: str, paths) -> tuple[tuple[str, str], ...]:
    """What the image holds at container `paths`, other than nothing or a symlink: (path, what).

    `what` is "regular file", "directory" or "special file" (a device, FIFO
    or socket).  Each parent dir is opened through `RootFS` (inside the
    root: a symlinked dir is followed there, never out of it) and the name
    is lstat'ed relative to it, so nothing at the name is opened or
    followed.  A dir that cannot be opened (missing: apply creates it)
    holds nothing; apply reports whatever else is wrong with it.
    """
    from pyxis_hook.rootfs import RootFS

    out = []
    dirs: dict[str, int] = {}
    try:
        with RootFS(rootfs) as rfs:
            try:
                for path in paths:
                    d, name = pathnames.split(path)
                    if d not in dirs:
                        try:
                            dirs[d] = rfs.open(d, posix.O_PATH | posix.O_DIRECTORY)
                        except (PathError, OSError):
                            dirs[d] = -1
                    if dirs[d] < 0:
                        continue
                    try:
                        mode = posix.stat(name, dir_fd=dirs[d], follow_symlinks=False).st_mode
                    except OSError:
                        continue
                    if not stat.S_ISLNK(mode):
                        out.append((path, "regular file" if stat.S_ISREG(mode)
                                    else "directory" if stat.S_ISDIR(mode) else "special file"))
            finally:
                for fd in dirs.values():
                    if fd >= 0:
                        posix.close(fd)
    except (PathError, OSError):
        return ()
    return tuple(out)
