"""The node artifact: the driver's inventory, built once per driver change, read by every start.

`obtain` (`load_or_build`) returns the inventory for the configuration: the artifact
file when it is trusted (`pyxis_hook.trust`: the package owner's, writable
by nobody else) and fresh (`host/freshness.py`), else a fresh discovery,
which is saved only by a process running as the package's owner (root on
a node).  Any other process (an ordinary user's start, in a user namespace
or not) discovers in memory and says so once in the log.  `build` is the
admin's rebuild (`pyxis-hook refresh`).

One file per configuration key (`config_key`) under `snapshot-dir`, JSON,
mode 0644 in a 0755 directory, written whole (temp file + rename).  GPU
facts, IPC sockets and the MPS dir are never taken from it: they change
without any driver file changing, so each start reads them afresh.  It
also records pyxis.conf's verdicts (`pyxis_conf`: the texts that passed the
schema, newest first, `spec/config.py`), which a start looks up before its configuration
is trusted: `read` is that one read of the file, and `obtain` takes it on.
Loading imports neither json, pyelftools nor jsonschema.

The file as read is a `Stored` tuple, (path, document, why, verdict): the
document when the file passes the trust rule, parses, and has this FORMAT
and the configuration's key (fresh or not), else None and why not; and
pyxis.conf's verdicts: as the document records them (`read`), or as
`spec.config.read_config` replaced them for this start, which the package's
owner keeps in a build (`save`: a rebuild loses none), or writes into a
fresh artifact that records others (`record_verdict`).
"""

from __future__ import annotations

import posix
import stat

from pyxis_hook import fastjson, log, pathnames, trust
from pyxis_hook.errors import ArtifactError
from pyxis_hook.host.freshness import freshness_key, stale_reason
from pyxis_hook.host.gpuscan import discover_gpus
from pyxis_hook.host.inventory import Inventory, refresh_live
from pyxis_hook.rootfs import read_to_end

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only
    Stored = tuple[str, "dict | None", str, "list | None"]

#: bumped whenever discovery records something else for the same driver files, or the file's layout
#: changes (4: pyxis.conf's verdict; 5: no mig-minors table in the GPU facts), so an upgraded package rebuilds the
#: artifact instead of trusting the old one
FORMAT = 5

_DIGEST_PRIME = 4294967291  # 2**32 - 5
#: the largest artifact read (a driver with every capability is ~200 KB)
ARTIFACT_LIMIT = 64 << 20
#: how long a build waits for another process building the same artifact before building its own
BUILD_WAIT_S = 10.0


def config_key(config) -> dict:
    """The configuration values an artifact depends on."""
    return {
        "driver_root": pathnames.normpath(pathnames.abspath(config.driver_root)),
        "proc_root": config.proc_root,
        "dev_root": config.dev_root,
        "path": list(config.path),
        "mps_pipe_dir": config.mps_pipe_dir,
        "graphics_config_files": bool(config.graphics_config_files),
    }


def artifact_path(config) -> str:
    """`<snapshot-dir>/inventory-<digest>.json`: the digest of `config_key`, stable across runs and Pythons."""
    return _path(config.snapshot_dir, config_key(config))


def _path(snapshot_dir: str, key: dict) -> str:
    raw = repr(sorted(key.items())).encode()
    return pathnames.join(snapshot_dir, f"inventory-{int.from_bytes(raw, 'big') % _DIGEST_PRIME:08x}.json")


def lock_path(config) -> str:
    """The build lock beside the artifact (a hidden name)."""
    d, name = pathnames.split(artifact_path(config))
    return pathnames.join(d, "." + name.replace(".json", ".lock"))


def trusted_dir(path: str) -> None:
    """The directory of `path` must pass the trust rule, or anyone could swap the file; ArtifactError."""
    d = pathnames.dirname(path)
    try:
        why = trust.why_untrusted(posix.stat(d))
    except OSError as e:
        raise ArtifactError(f"{d}: {e.strerror}") from None
    if why:
        raise ArtifactError(f"{d}: {why}")


def read(config) -> Stored:
    """The artifact file for `config` as stored (module doc), with the verdicts it records: the trust rule, its format
    and its key; not its freshness."""
    key = config_key(config)
    path = _path(config.snapshot_dir, key)
    fd, why = trust.open_trusted(path)
    if why:
        return path, None, why, None
    try:
        data = fastjson.loads(read_to_end(fd, ARTIFACT_LIMIT, 1 << 20))  # closes fd
    except OSError as e:
        return path, None, f"{path}: {e.strerror}", None
    except ValueError as e:
        return path, None, f"{path}: corrupt: {type(e).__name__}: {e}", None
    if not isinstance(data, dict):
        why = f"{path}: corrupt: not a JSON object"
    elif data.get("format") != FORMAT:
        why = f"{path}: format {data.get('format')!r}, expected {FORMAT}"
    elif data.get("key") != key:
        why = f"{path}: built for another configuration"
    return (path, None, why, None) if why else (path, data, "", data.get("pyxis_conf"))


def load(config, host=None, stored: Stored | None = None) -> Inventory:
    """The artifact's inventory when trusted and fresh for `config`, else ArtifactError saying why.

    `host`: the GPU facts read now (read when None); they replace the saved ones.
    `stored`: the file as this process read it for `config` (`read`), else read now.
    """
    path, data, why, _ = stored if stored is not None else read(config)
    if data is None:
        raise ArtifactError(why)
    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    try:
        inv = Inventory.from_dict(data["inventory"], host)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(f"{path}: corrupt: {type(e).__name__}: {e}") from None
    why = stale_reason(freshness_key(inv), config, host)
    if why:
        raise ArtifactError(f"{path}: stale: {why}")
    return refresh_live(inv, config)


def _payload(doc: dict) -> bytes:
    import json  # only when writing

    return json.dumps(doc, indent=1, sort_keys=True).encode()


def record_verdict(stored: Stored) -> None:
    """Rewrite the artifact `stored` read whole with its `verdict`, the rest as read, when it records another.

    Only as the package's owner (`trust.may_write`); a failed write is a
    debug line (a later start checks pyxis.conf again).
    """
    path, data, _, verdict = stored
    if data is None or verdict is None or data.get("pyxis_conf") == verdict or not trust.may_write():
        return
    try:
        trust.write_whole(path, _payload(dict(data, pyxis_conf=verdict)))
    except OSError as e:
        log.debug(f"{path}: pyxis.conf's verdict not recorded: {e.strerror}")


def save(config, inv: Inventory, verdict: list | None = None) -> str:
    """Write the artifact whole, with pyxis.conf's `verdict`; its path.  ArtifactError when it cannot, or no start
    would trust it."""
    path = artifact_path(config)
    d = pathnames.dirname(path)
    try:
        if not pathnames.isdir(d):
            import os  # only when building

            os.makedirs(d, mode=0o755, exist_ok=True)
            posix.chmod(d, 0o755)
        trusted_dir(path)
        trust.write_whole(path, _payload({"format": FORMAT, "key": config_key(config), "inventory": inv.to_dict(),
                                          "pyxis_conf": verdict}))
    except OSError as e:
        raise ArtifactError(f"{path}: cannot save the node artifact: {e.strerror}") from None
    return path


def _build_lock(config) -> int | None:
    """An fd holding the build lock (flock: released when its holder exits), or None after BUILD_WAIT_S."""
    import fcntl  # only when building
    import time

    path = lock_path(config)
    try:
        trusted_dir(path)
        fd = posix.open(path, posix.O_RDWR | posix.O_CREAT | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK, 0o600)
    except (OSError, ArtifactError):
        return None
    st = posix.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or trust.why_untrusted(st):
        posix.close(fd)
        return None
    deadline = time.monotonic() + BUILD_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError:
            if time.monotonic() >= deadline:
                posix.close(fd)
                log.debug(f"{path}: still held after {BUILD_WAIT_S:.0f} s: building without it")
                return None
            time.sleep(0.02)


def _discover(config, strict: bool, host) -> Inventory:
    from pyxis_hook.host.discovery import discover
    import gc

    gc.enable()  # a start turns it off; a build parses ELF files for seconds
    return discover(config, strict=strict, host=host)


def _rebuild(config, strict: bool, host, reread: bool, verdict: list | None) -> tuple[Inventory, str, str]:
    """Under the build lock: the inventory, how it was got (`obtain`'s words) and why it was not saved ("").

    `reread`: first read what a process that held the lock meanwhile saved.
    `verdict`: pyxis.conf's, to record.
    """
    lock = _build_lock(config)
    try:
        if lock is not None and reread:
            again = (*read(config)[:3], verdict)
            try:
                inv = load(config, host, again)
            except ArtifactError:
                pass
            else:
                record_verdict(again)
                return inv, "read", ""
        inv = _discover(config, strict, host)
        if not inv.usable:
            return inv, "discovered", f"{artifact_path(config)}: not saved: {inv.errors[0] if inv.errors else 'no driver'}"
        try:
            save(config, inv, verdict)
        except ArtifactError as e:
            return inv, "discovered", str(e)
        return inv, "built", ""
    finally:
        if lock is not None:
            posix.close(lock)


def build(config, *, strict: bool = True, host=None, verdict: list | None = None) -> Inventory:
    """Discover the driver now and save the artifact, with pyxis.conf's `verdict` (`pyxis-hook refresh`), under the
    build lock.

    ArtifactError when this process may not write it, the driver is not
    usable or the file cannot be saved; DriverError (strict) naming the
    driver's first problem.
    """
    if not trust.may_write():
        raise ArtifactError(f"{artifact_path(config)}: only the package's owner (uid {trust.package_owner()}) "
                            "writes the node artifact")
    host = host if host is not None else discover_gpus(config.proc_root, config.dev_root)
    inv, _how, problem = _rebuild(config, strict, host, reread=False, verdict=verdict)
    if problem:
        raise ArtifactError(problem)
    return inv


def obtain(config, *, strict: bool = True, host=None, stored: Stored | None = None) -> tuple[Inventory, str]:
    """The inventory for `config` and how it was got: "read" (the artifact, trusted and fresh), "built"
    (discovered and saved by the package's owner) or "discovered" (in memory; logged once, with why).

    `host`: the GPU facts when the caller has just read them.  `stored`: the
    file as this start read it for `config` (`read`, with pyxis.conf's
    verdict), else read now; the package's owner records its verdict.
    """
    stored = stored if stored is not None else read(config)
    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    try:
        inv = load(config, host, stored)
    except ArtifactError as e:
        why = str(e)
    else:
        record_verdict(stored)
        return inv, "read"
    if not trust.may_write():
        log.info(f"node artifact not used ({why}): discovering the driver in memory; "
                 "`pyxis-hook refresh` as root rebuilds it")
        return _discover(config, strict, host), "discovered"
    log.debug(f"rebuilding the node artifact: {why}")
    inv, how, problem = _rebuild(config, strict, host, reread=True, verdict=stored[3])
    if problem and inv.usable:  # a usable driver left unsaved: every start will discover it again
        log.warning(problem)
    return inv, how


def load_or_build(config, *, strict: bool = True, host=None) -> Inventory:
    """`obtain`'s inventory."""
    return obtain(config, strict=strict, host=host)[0]
