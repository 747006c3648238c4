"""Which user namespace this process runs in, as /proc/self/uid_map says.

Read anew on each ask: a process (a forked child) may enter another user
namespace, and the map is a few dozen bytes of procfs.
"""

import posix

#: the initial user namespace's map: every uid is itself
_IDENTITY = [(0, 0, 4294967295)]


def uid_map() -> "list[tuple[int, int, int]] | None":
    """/proc/self/uid_map as (inside, outside, count) lines; None when it cannot be read."""
    try:
        fd = posix.open("/proc/self/uid_map", posix.O_RDONLY | posix.O_CLOEXEC)
    except OSError:
        return None
    try:
        raw = posix.read(fd, 65536)
    except OSError:
        return None
    finally:
        posix.close(fd)
    try:
        return [(int(a), int(b), int(c)) for a, b, c in (line.split() for line in raw.splitlines() if line.strip())]
    except ValueError:
        return None


def in_user_namespace() -> bool:
    """Whether this process runs in a user namespace other than the initial one (False when /proc says nothing)."""
    mapped = uid_map()
    return mapped is not None and mapped != _IDENTITY


def host_uid(uid: int) -> "int | None":
    """`uid` of this namespace as the parent user namespace sees it; None when it is unmapped."""
    for inside, outside, count in uid_map() or _IDENTITY:
        if inside <= uid < inside + count:
            return outside + uid - inside
    return None
