"""Paths inside a root (a container rootfs or the host's driver-root) that never escape it.

`resolve_in_root` is the string-level walk glibc's and the kernel's chroot
semantics imply: absolute symlinks restart at the root, `..` at the root stays
at the root (as openat2's RESOLVE_IN_ROOT does), a chain of more than 40 links
is a loop.  It is used for *reading* (discovery, ldd, ldcheck).  Code that
*writes or mounts* inside a container must use the fd-based helpers, which do
not re-resolve names after checking them.
"""

from __future__ import annotations

import errno
import os
import stat

from pyxis_hook.errors import PathError

MAX_SYMLINKS = 40


def resolve_in_root(root: str, path: str, *, follow_last: bool = True) -> str:
    """Return the host path that `path` names when `root` is '/'.

    Missing components are kept as they are (callers decide whether a missing
    file is an error).  The result always starts with `root` (normalised).
    Raises PathError on a symlink loop.
    """
    root = os.path.normpath(os.path.abspath(root))
    if root == "/":
        prefix = ""
    else:
        prefix = root
    todo = [c for c in path.split("/") if c not in ("", ".")]
    todo.reverse()
    done: list[str] = []
    links = 0
    while todo:
        comp = todo.pop()
        if comp == "..":
            if done:
                done.pop()
            continue
        candidate = prefix + "/" + "/".join(done + [comp])
        is_last = not todo
        try:
            st = os.lstat(candidate)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                done.append(comp)
                continue
            raise PathError(f"{candidate}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode) and (follow_last or not is_last):
            links += 1
            if links > MAX_SYMLINKS:
                raise PathError(f"{path}: too many levels of symbolic links inside {root}")
            target = os.readlink(candidate)
            parts = [c for c in target.split("/") if c not in ("", ".")]
            if target.startswith("/"):
                done = []
            todo.extend(reversed(parts))
            continue
        done.append(comp)
    return (prefix + "/" + "/".join(done)) if done else (prefix or "/")


def to_root_relative(root: str, host_path: str) -> str:
    """Inverse of resolve_in_root's prefixing: '/ROOT/usr/lib/x' -> '/usr/lib/x'."""
    root = os.path.normpath(os.path.abspath(root))
    if root == "/":
        return host_path
    if host_path == root:
        return "/"
    if not host_path.startswith(root + "/"):
        raise PathError(f"{host_path} is not inside {root}")
    return host_path[len(root):]
