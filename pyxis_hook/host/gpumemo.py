"""The host's GPUs for a container start: from a memo when discovery's every look finds what it found.

A container start reads the GPUs' facts fresh (a GPU can be added, removed
or reset between two containers), but parsing every GPU's `information`
file and building its records is most of what a start spends per GPU.
Discovery is a pure function of what it looks at (`host/gpuscan.py`), and
which looks it makes depends only on what the earlier ones found: when a
start makes the same looks, in the same order, and each finds exactly what
it found when the memo was kept (`gpulooks.replay`), discovery would decide
the same HostGpus, so the memo's is used.  The looks themselves are made on
every start: only the parsing is saved.

The memo is `<snapshot-dir>/gpus-<digest>.bin`, one per (proc-root,
dev-root), trusted as the snapshot is (`snapshot.open_trusted`: a regular
file, root's or ours, in a directory closed to others), written atomically,
and bound to the code that made it (the package's version and the file
signature of each module discovery runs): anything else about it, damaged,
foreign or stale, is a miss, and the start discovers as it always did.
"""

from __future__ import annotations

import marshal
import sys

from pyxis_hook.errors import SnapshotError
from pyxis_hook.host import gpulooks
from pyxis_hook.host.gpus import HostGpus

FORMAT = b"gpus 2\n"
_PREFIX = "gpus-"
_READ_LIMIT = 16 << 20
#: the modules whose code decides a HostGpus from the looks (a memo made by other code is not used)
_CODE = ("pyxis_hook.host.gpus", "pyxis_hook.host.gpufiles", "pyxis_hook.host.gpuscan", "pyxis_hook.host.gpulooks",
         "pyxis_hook.host.gpumemo", "pyxis_hook.pathnames", "pyxis_hook.record", "pyxis_hook.rootfs")


def memo_path(config) -> str:
    """The memo file for `config`'s proc-root and dev-root."""
    from pyxis_hook.host import snapshot

    return snapshot.kept_path(config, _PREFIX, marshal.dumps((config.proc_root, config.dev_root)))


def _code() -> tuple:
    from pyxis_hook import startimage

    return startimage.code_signature(sys.modules[name].__file__ for name in _CODE)


def _read(path: str, roots: tuple[str, str]) -> tuple | None:
    """(looks as marshalled, the HostGpus as a dict) of a usable memo at `path` for `roots`, or None."""
    from pyxis_hook import startimage
    from pyxis_hook.host import snapshot

    try:
        code, kept_roots, looks, host = snapshot.load_kept(path, FORMAT, _READ_LIMIT)
        ok = kept_roots == roots and type(looks) is bytes and startimage.same_code(code)
    except (SnapshotError, ValueError, TypeError):
        return None
    return (looks, host) if ok else None


def start_gpus(config, keep: bool = True, on_miss=None) -> tuple[HostGpus, bytes]:
    """(the host's GPUs, the looks they were decided from, marshalled) for a container start.

    The looks stand for the GPU facts in a decision's key (`plan.decisions`):
    equal looks give an equal HostGpus.  `keep`: write a memo when there was
    none to use (a start that keeps decisions; never raises for it).
    `on_miss`: called before discovery's modules are imported, when the
    memo cannot be used (the start then plans: its key is new).
    """
    path = memo_path(config)
    roots = (config.proc_root, config.dev_root)
    memo = _read(path, roots)
    if memo is not None:
        looks, host = memo
        try:
            if gpulooks.replay(marshal.loads(looks)):
                # the looks' bytes as kept: the key is then the same bytes on every start that uses the memo
                return HostGpus.from_dict(host), looks
        except (EOFError, KeyError, TypeError, ValueError):
            pass  # a damaged memo: discover
    if on_miss is not None:
        on_miss()
    from pyxis_hook.host import gpuscan  # discovery and its parsers: a start whose memo replays loads neither

    reader = gpulooks.Reader()
    found = gpuscan.discover_gpus(config.proc_root, config.dev_root, reader)
    looks = marshal.dumps(reader.seen)
    if keep:
        _write(path, roots, looks, found)
    return found, looks


def _write(path: str, roots: tuple[str, str], looks: bytes, host: HostGpus) -> None:
    from pyxis_hook.host import snapshot

    try:
        snapshot.keep(path, FORMAT, (_code(), roots, looks, host.to_dict()))
    except (OSError, ValueError, SnapshotError):
        pass  # a read-only, full or untrusted snapshot dir: the next start discovers again
