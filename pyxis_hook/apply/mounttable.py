"""Queries on a mountinfo text (`/proc/<pid>/mountinfo`), answered without parsing every line into records.

Each query splits off only the field it needs, or finds its line with
`str.find`: a node may have thousands of mounts
(docs/decisions/2026-12-07-real-node-shapes.md).  A line is `id parent
major:minor root point options ... - fstype source superoptions`; no field
holds a raw space (the kernel escapes space, tab, newline and backslash as
octal: fs/proc_namespace.c, `seq_path_root(..., " \t\n\\")`).
"""

from __future__ import annotations

#: what mountinfo escapes in a path
_ESCAPED = " \t\n\\"


def escape(path: str) -> str:
    """`path` as mountinfo prints it (octal escapes), so it compares with its mount points."""
    return "".join(f"\\{ord(c):03o}" if c in _ESCAPED else c for c in path)


def mount_line(mountinfo: str, mount_id: int | str) -> str | None:
    """The line of mount `mount_id`, or None."""
    head = f"{mount_id} "
    if mountinfo.startswith(head):
        at = 0
    else:
        at = mountinfo.find("\n" + head) + 1
        if not at:
            return None
    end = mountinfo.find("\n", at)
    return mountinfo[at:] if end == -1 else mountinfo[at:end]


def mount_points(mountinfo: str) -> list[str]:
    """The mount point of each line (the fifth field, escaped): stacked mounts repeat, in table order.

    Both namespaces escape the same way, and an escape holds no '/', so
    escaped points compare and climb like the paths.
    """
    return [line.split(" ", 5)[4] for line in mountinfo.splitlines() if line.count(" ") >= 5]


def device_of(mountinfo: str, mount_id: int | str) -> str | None:
    """The filesystem (`major:minor`, the superblock) of mount `mount_id`, or None when the table lacks it."""
    line = mount_line(mountinfo, mount_id)
    if line is None:
        return None
    fields = line.split(" ", 3)
    return fields[2] if len(fields) == 4 else None


def _outside(point: str, rootfs_point: str | None) -> bool:
    return rootfs_point is None or not (point == rootfs_point or point.startswith(rootfs_point.rstrip("/") + "/"))


def filesystem_point(mountinfo: str, device: str, rootfs_point: str | None) -> str | None:
    """The first mount point of filesystem `device` (`major:minor`) outside `rootfs_point` (escaped), or None.

    `rootfs_point` None leaves nothing out.  The same answer as
    `host_filesystems(mountinfo, rootfs_point).get(device)`, from the lines
    that name `device` only.
    """
    needle = f" {device} "
    at = mountinfo.find(needle)
    while at != -1:
        start = mountinfo.rfind("\n", 0, at) + 1
        if mountinfo.count(" ", start, at) == 1:  # the third field: after the id and the parent
            end = mountinfo.find("\n", at)
            fields = mountinfo[start:end if end != -1 else len(mountinfo)].split(" ", 5)
            if len(fields) == 6 and _outside(fields[4], rootfs_point):
                return fields[4]
        at = mountinfo.find(needle, at + 1)
    return None


def host_filesystems(mountinfo: str, rootfs_point: str | None) -> dict[str, str]:
    """major:minor -> the first mount point of that filesystem, for mounts outside `rootfs_point` (escaped).

    `rootfs_point` None leaves nothing out.
    """
    out: dict[str, str] = {}
    for line in mountinfo.splitlines():
        f = line.split(" ", 5)
        if len(f) == 6 and _outside(f[4], rootfs_point):
            out.setdefault(f[2], f[4])
    return out
