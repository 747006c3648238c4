"""Torque's GPU file (`PBS_GPUFILE`): which GPUs of this node a Torque job was given.

Torque's mother superior writes `<node>-gpu<N>` lines, one for each GPU of
every node of the job, to `$TORQUE_HOME/aux/<jobid>gpu`, and only for a job
that has GPUs; `PBS_GPUFILE` names that path for every job it starts
(adaptivecomputing/torque `src/resmom/start_exec.c`: `write_attr_to_file`,
the job's environment).  `<node>` is the node's name on the server, which
the MoM matches against its own name, `gethostname()` unless `-A` names an
alias.  docs/schedulers.md has the rules.
"""

from __future__ import annotations

import errno
import posix

from pyxis_hook.errors import RequestError
from pyxis_hook.rootfs import read_regular_path

#: a GPU file larger than this is refused: ~40 bytes a GPU, so room for ~25,000 GPUs
GPUFILE_LIMIT = 1 << 20
_DIGITS = frozenset("0123456789")


def _short(name: str) -> str:
    return name.split(".", 1)[0]


def node_indices(text: str, node: str) -> tuple[int, ...]:
    """The `<N>` of every `<host>-gpu<N>` line whose host is `node`, sorted, each once.

    `node` is this machine's host name; a line's host matches when it equals
    `node` or its short form (before the first '.'), or when its own short
    form equals `node` (the server knows the node by its full name, the
    machine calls itself by the short one).  Other lines are other nodes'
    (or not GPU lines) and are skipped.
    """
    names = {node, _short(node)}
    found = set()
    for line in text.split("\n"):
        host, sep, num = line.strip().rpartition("-gpu")
        if not sep or not host or not (0 < len(num) <= 9 and _DIGITS.issuperset(num)):
            continue
        if host in names or _short(host) == node:
            found.add(int(num))
    return tuple(sorted(found))


def read_gpufile(path: str) -> str | None:
    """The text of the GPU file at `path`; None when there is none (Torque writes none for a job without GPUs).

    Raises RequestError (one line naming `PBS_GPUFILE` and the path) for a
    relative path, anything but a regular file, a file over `GPUFILE_LIMIT`
    or one that cannot be read.
    """
    label = f"PBS_GPUFILE={path}"
    if not path.startswith("/"):
        raise RequestError(f"{label}: not an absolute path")
    try:
        data = read_regular_path(path, GPUFILE_LIMIT)
    except FileNotFoundError:
        return None
    except OSError as e:
        why = e.strerror or str(e)
        if e.errno == errno.EFBIG:
            why = f"larger than {GPUFILE_LIMIT} bytes"
        raise RequestError(f"{label}: cannot read Torque's GPU file ({why})") from None
    return data.decode("utf-8", "replace")


def node_name() -> str:
    """This machine's host name, as `gethostname()` gives it to Torque's MoM."""
    return posix.uname().nodename
