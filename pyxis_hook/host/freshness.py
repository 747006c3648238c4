"""Freshness: whether a node artifact still describes the node's driver.

An inventory records what it was built from (`freshness_key`): the tree the
driver root led to, where the driver version came from, that version, and
the stat signature of every source file.  `stale_reason` compares that with
the node now.
"""

from __future__ import annotations

import posix

from pyxis_hook import pathnames


def stat_signature(path: str) -> tuple[str, int, int, int, int] | None:
    """(path, st_dev, st_ino, st_size, st_mtime_ns) of a file, None when it cannot be stat'ed."""
    try:
        st = posix.stat(path)
    except OSError:
        return None
    return signature(path, st)


def signature(path: str, st) -> tuple[str, int, int, int, int]:
    """`stat_signature` of the file at `path` whose stat result (or fstat's, of an fd open on it) is `st`."""
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def freshness_key(inv) -> tuple:
    """What decides whether inventory `inv` is still fresh: plain values."""
    return (inv.driver_root, inv.version_source, inv.driver_version, inv.sources)


def stale_reason(key: tuple, config, host, root: str = "") -> str:
    """Why an inventory whose `freshness_key` was `key` is stale now ("" when it is fresh).

    The driver root must lead where it led, every source file must have its
    stat signature, and the kernel module must report the version the
    inventory was built for (`host`: the GPU facts read now).  `root`: where
    the driver root leads now, when the caller has just asked.
    """
    driver_root, version_source, driver_version, sources = key
    now = root or pathnames.realpath(config.driver_root)
    if now != driver_root:
        return f"the driver root now leads to {now}"
    for sig in sources:
        if stat_signature(sig[0]) != tuple(sig):
            return f"{sig[0]} changed"
    if version_source == "procfs" and host.driver_version != driver_version:
        return f"driver version is now {host.driver_version}"
    if version_source == "files" and host.driver_version and host.driver_version != driver_version:
        return f"kernel module {host.driver_version} loaded since"
    return ""
