"""Whether users other than root can change a bundle: the second wall behind `rootpin`.

Why: `rootpin` makes the hook act only on the rootfs the runtime mounted,
whatever config.json says by then.  A bundle another user can write still
decides everything else the hook reads from it (the environment that asks for
GPUs, annotations) and is the way a re-pointed `root.path` gets there at all.
A root hook on such a bundle is worth saying so in the log; with
`writable-bundle = "refuse"` in pyxis.conf the start fails instead.

"Another user" is anyone but root: an owner other than uid 0 (an owner can
always chmod), or a group or world write bit.  The bundle directory, its
config.json, and every directory above the bundle are probed: whoever can
rename an entry on the way can swap the whole bundle.  A sticky directory
(/tmp) lets others create entries but not rename root's, so it only counts
when the entry below it is not root's.
"""

from __future__ import annotations

import posix
import stat

from pyxis_hook import pathnames
from pyxis_hook.errors import OciError

#: the `writable-bundle` values
POLICIES = ("warn", "refuse")


class WritableBundleError(OciError):
    """`writable-bundle = "refuse"` and the bundle can be changed by a user other than root."""


def _others_can_write(path: str, st: posix.stat_result, child_uid: int | None = None) -> str | None:
    """Why users other than root can change `path` (or, for a directory on the way, its entry below)."""
    if st.st_uid != 0:
        return f"{path} is owned by uid {st.st_uid}"
    if not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    if child_uid == 0 and st.st_mode & stat.S_ISVTX:
        return None  # sticky: others may add entries, not rename or remove root's
    who = "every user" if st.st_mode & stat.S_IWOTH else f"group {st.st_gid}"
    return f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})"


def bundle_writers(bundle_dir: str, config_path: str) -> str | None:
    """The first place on the bundle's way a user other than root can change; None when there is none."""
    try:
        st = posix.stat(config_path, follow_symlinks=False)
        why = _others_can_write(config_path, st)
        if why:
            return why
        here = pathnames.normpath(bundle_dir)
        st = posix.stat(here)
        why = _others_can_write(here, st)
        while why is None and here != "/":
            child_uid = st.st_uid
            here = pathnames.dirname(here)
            st = posix.stat(here)
            why = _others_can_write(here, st, child_uid)
        return why
    except OSError as e:
        return f"{e.filename}: cannot tell who can write it: {e.strerror}"


def check_bundle(bundle_dir: str, config_path: str, policy: str, euid: int | None = None) -> str | None:
    """Warn (return the line to log) or refuse (raise) when a root hook reads a bundle others can write.

    Returns None when the hook does not run as root (it then has no more
    rights than the bundle's owner) or nobody else can write the bundle.
    """
    if (posix.geteuid() if euid is None else euid) != 0:
        return None
    why = bundle_writers(bundle_dir, config_path)
    if why is None:
        return None
    line = f"bundle {bundle_dir}: {why}: a user other than root can change what this root hook reads"
    if policy == "refuse":
        raise WritableBundleError(f'{line} (writable-bundle = "refuse")')
    return f'{line} (writable-bundle = "refuse" in pyxis.conf refuses such bundles)'
