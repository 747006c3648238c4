"""Facts about a container's rootfs that decide where injected files land.

Only existence checks and small reads, always through `rootfs.RootFS` fds
inside the rootfs (a link in the image never leads out of it), never
executing anything from the image.  The image is read as the confined
ldconfig sees it: its `/proc` and `/sys` are missing (`rootfs.HIDDEN`), so a
link through `/proc/self/root` names nothing.  The rules are
libnvidia-container's: an image with /etc/debian_version gets the multiarch
dirs, any other gets /usr/lib64 (and /usr/lib32 or /usr/lib for 32-bit
libraries).

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
from pyxis_hook.rootfs import HIDDEN, RootFS


def _stat(rfs: RootFS | None, path: str) -> posix.stat_result | None:
    """What `path` names in the image (links followed inside it), None when it names nothing there.

    Missing, under /proc or /sys, a looping link, a link nobody can follow, a
    component that keeps changing type: the image has nothing at `path`.
    """
    if rfs is None:
        return None
    try:
        fd = rfs.open(path, posix.O_PATH)
    except PathError:
        return None
    try:
        return posix.fstat(fd)
    finally:
        posix.close(fd)


def container_facts(rootfs: str, *, machine: str | None = None, files=()) -> ContainerFacts:
    """Inspect `rootfs` (a host path) and return where libraries, 32-bit libraries and binaries go.

    `files` are the driver files the container gets (`Inventory.select`): what
    the image holds at their links' paths becomes `link_occupants`.  Never
    raises for what the image holds; a rootfs that cannot be opened holds nothing.
    """
    machine = machine or posix.uname().machine  # not `platform` (hook path imports)
    try:
        rfs: RootFS | None = RootFS(rootfs, hidden=HIDDEN)
    except PathError:
        rfs = None
    try:
        facts = _facts(rfs, rootfs, machine)
    finally:
        if rfs is not None:
            rfs.close()
    return with_occupants(facts, rootfs, files) if files else facts


def _facts(rfs: RootFS | None, rootfs: str, machine: str) -> ContainerFacts:
    triplet, triplet32 = machines.triplets(machine)
    debian_like = _stat(rfs, "/etc/debian_version") is not None
    if debian_like:
        lib_dir = f"/usr/lib/{triplet}"
        lib32_dir = f"/usr/lib/{triplet32}" if triplet32 else ""
    else:
        lib_dir = "/usr/lib64"
        lib32 = _stat(rfs, "/usr/lib32")
        if lib32 is not None and stat.S_ISDIR(lib32.st_mode):
            lib32_dir = "/usr/lib32"
        elif not _same(_stat(rfs, "/usr/lib"), _stat(rfs, lib_dir)):
            lib32_dir = "/usr/lib"
        else:
            lib32_dir = ""
    libcuda, drivers, libs, problem = "", None, (), ""
    compat = _stat(rfs, COMPAT_DIR)
    if compat is not None and stat.S_ISDIR(compat.st_mode):
        from pyxis_hook.plan.compat import compat_facts

        libcuda, drivers, libs, problem = compat_facts(rootfs, machine)
    return ContainerFacts(
        rootfs=rootfs,
        lib_dir=lib_dir,
        lib32_dir=lib32_dir,
        bin_dir="/usr/bin",
        has_ld_so_conf=_stat(rfs, "/etc/ld.so.conf") is not None,
        compat_libcuda=libcuda,
        compat_drivers=drivers,
        compat_libs=libs,
        compat_problem=problem,
    )


def _same(a: posix.stat_result | None, b: posix.stat_result | None) -> bool:
    """Whether two lookups found one and the same file (/usr/lib64 a link to /usr/lib); never for nothing."""
    return a is not None and b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def with_occupants(facts: ContainerFacts, rootfs: str, files) -> ContainerFacts:
    """`facts` with what the image at `rootfs` holds at the links' paths of the driver `files`."""
    return replace(facts, link_occupants=link_occupants(rootfs, link_paths(files, facts)))


def link_occupants(rootfs: str, paths) -> tuple[tuple[str, str], ...]:
    """What the image holds at container `paths`, other than nothing or a symlink: (path, what).

    `what` is "regular file", "directory" or "special file" (a device, FIFO
    or socket).  Each parent dir is opened through `RootFS` (inside the
    root: a symlinked dir is followed there, never out of it; /proc and /sys
    hidden, as for the other facts) and the name is lstat'ed relative to it,
    so nothing at the name is opened or followed.  A dir that cannot be
    opened (missing: apply creates it) holds nothing; apply reports whatever
    else is wrong with it.
    """
    out = []
    dirs: dict[str, int] = {}
    try:
        with RootFS(rootfs, hidden=HIDDEN) as rfs:
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
