"""Whether a directory of the container is a host directory bound in: asked before anything is created in it.

Why: a runtime may bind a directory of the host into the rootfs.  enroot
without `ENROOT_RESTRICT_DEV` binds the node's whole /dev (its
`mounts.d/10-system.fstab`: `/dev /dev none rbind`), and users bind volumes
(`-v /usr/bin:/usr/bin`, `-v /dev:/dev`).  A mount point, link or cache file
the hook creates there is created on the host, by root, outside the
container's rootfs (docs/security.md): an empty `/dev/nvidia3` on the node
itself.  Mounting onto an entry that is already there changes nothing on the
host and stays allowed; only creating (and replacing a link) is asked about.

The rule compares mounts, not paths: a directory is the container's when
- it is on the rootfs's own mount (the image: where nearly everything is
  created), or
- it is on a filesystem that the hook's own mount namespace does not have
  mounted outside the rootfs: one the runtime made for this container
  (runc's and crun's tmpfs /dev, enroot's under `ENROOT_RESTRICT_DEV`, a
  devpts, a tmpfs volume) exists only there.
Any other directory is on a filesystem the host has mounted (mountinfo's
major:minor, the superblock; not `st_dev`, which btrfs gives per subvolume):
a bind of a host directory, which the hook never writes.  The container's
mounts are read in its namespace (mount ids are global: statx's
`stx_mnt_id`, or `mnt_id` of `/proc/self/fdinfo` before Linux 5.8), the
host's from a mountinfo opened before the child entered it (the file keeps
the namespace it was opened in).

"Outside the rootfs": enroot hooks (and CDI createContainer hooks) run in
the container's own namespace before it switches root, so the hook's
namespace also holds the container's mounts, below the rootfs.  Mounts at
or below the rootfs's mount point there are the container's and are left
out; that point is `realpath(rootfs)` in the hook's namespace, taken only
when it is the very directory the child writes in (`rootfs_point`).
"""

from __future__ import annotations

import posix

from pyxis_hook import pathnames
from pyxis_hook.apply.mounttable import device_of, escape, filesystem_point, host_filesystems
from pyxis_hook.kernel import lookup
from pyxis_hook.rootfs import PROC_LIMIT, read_to_end

def rootfs_point(rootfs: str, want: posix.stat_result) -> str | None:
    """The rootfs's mount point as the hook's namespace names it (escaped), or None when unsure.

    `want` is the directory the child writes in (the pinned rootfs, or
    `rootfs` itself); a realpath that is not that directory is not used, so
    a name swapped meanwhile never makes a host filesystem look private.
    """
    try:
        real = pathnames.realpath(rootfs)
        st = posix.stat(real)
    except OSError:
        return None
    if (st.st_dev, st.st_ino) != (want.st_dev, want.st_ino):
        return None
    return escape(real)


def _read_text(fd: int) -> str:
    """A mountinfo's text, read to its end with `posix` calls (no io stack; in the container's namespace too),
    at most `rootfs.PROC_LIMIT` bytes; `fd` is closed."""
    return read_to_end(fd, PROC_LIMIT).decode("utf-8", "surrogateescape")


class HostDirs:
    """The question `why(dir_fd)`, for one container; made by apply's child before it enters the namespace.

    Everything is read lazily, once: a start that creates nothing reads no
    mountinfo.  `own_table`, `their_table`: the hook's own and the
    container's mount tables as this start already read them
    (`rootpin.PinnedRoot`), else they are read here (the container's again
    for a mount it does not list: one made since).  `close` releases the
    host mountinfo fd.
    """

    def __init__(self, point: str | None, own_table: str | None = None, their_table: str | None = None):
        self._point = point
        # opened here, in the hook's own namespace: reading it later still lists that namespace's mounts
        self._ours = -1 if own_table is not None else posix.open("/proc/self/mountinfo", posix.O_RDONLY | posix.O_CLOEXEC)
        self._host_text: str | None = own_table
        self._host: dict[str, str] | None = None
        self._theirs: str | None = their_table
        self._root_mount: int | None = None
        self._verdicts: dict[int, str | None] = {}

    def close(self) -> None:
        if self._ours >= 0:
            posix.close(self._ours)
            self._ours = -1

    def _host_table(self) -> str:
        if self._host_text is None:
            fd, self._ours = self._ours, -1  # read once: the text is kept
            self._host_text = _read_text(fd)
        return self._host_text

    def host_devices(self) -> frozenset[str]:
        """The host's filesystems (major:minor): the confined ldconfig's view makes their mounts read-only."""
        if self._host is None:
            self._host = host_filesystems(self._host_table(), self._point)
        return frozenset(self._host)

    def why(self, dir_fd: int, root_fd: int) -> str | None:
        """None when the directory `dir_fd` is the container's; else why it is a host directory.

        `root_fd` is the rootfs the caller writes in.  A mount the
        container's mount table does not list (it went away meanwhile) is
        not judged the container's.
        """
        mid = lookup.mount_id(dir_fd)  # one statx (or an fdinfo read before Linux 5.8)
        if self._root_mount is None:
            self._root_mount = lookup.mount_id(root_fd)
        if mid == self._root_mount:
            return None
        if mid in self._verdicts:
            return self._verdicts[mid]
        dev = device_of(self._theirs, mid) if self._theirs is not None else None
        if dev is None:  # read again for a mount made since (a dir bind)
            # now: the container's namespace
            fd = posix.open(lookup.proc_self_path("mountinfo"), posix.O_RDONLY | posix.O_CLOEXEC)
            self._theirs = _read_text(fd)
            dev = device_of(self._theirs, mid)
        if dev is None:
            verdict: str | None = f"its mount ({mid}) is not in the container's mount table"
        else:
            where = filesystem_point(self._host_table(), dev, self._point)
            verdict = None if where is None else \
                f"it is a host directory bound into the container (its filesystem, {dev}, is mounted at {where} on the host)"
        self._verdicts[mid] = verdict
        return verdict
