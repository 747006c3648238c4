"""The driver's daemons as they are now: which IPC sockets exist and whether the MPS pipe dir does.

Daemons (persistenced, fabricmanager, MPS) start and stop at any time, so
no node artifact may freeze their sockets: every start probes again.  This
is that probe, and only that: `inventory.ipc_files` turns it into the
inventory's files.
"""

from __future__ import annotations

import posix
import stat

from pyxis_hook import pathnames
from pyxis_hook.errors import PathError
from pyxis_hook.host.capabilities import IPC_SOCKETS, MPS_CAPABILITIES
from pyxis_hook.rootfs import resolve_in_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable


def ipc_paths(root: str, mps_pipe_dir: str, warn: "Callable[[str], object]") -> tuple[tuple[str, str, str], ...]:
    """(capability, host path, source) of each daemon socket and of the MPS pipe dir present in `root`.

    A socket counts when it is one now; the MPS dir serves each of
    MPS_CAPABILITIES.  Absence is normal (no daemon).  `warn` hears of
    paths that escape the root or loop.
    """
    out: list[tuple[str, str, str]] = []

    def where(path: str) -> str | None:
        try:
            return resolve_in_root(root, path)
        except PathError as e:
            warn(str(e))
            return None

    for cap, path in IPC_SOCKETS:
        real = where(path)
        try:
            sock = real is not None and stat.S_ISSOCK(posix.stat(real).st_mode)
        except OSError:
            sock = False
        if sock and real is not None:
            out.append((cap, real, f"ipc:{path}"))
    real = where(mps_pipe_dir)
    if real is not None and pathnames.isdir(real):
        out.extend((cap, real, f"mps:{mps_pipe_dir}") for cap in MPS_CAPABILITIES)
    return tuple(out)
