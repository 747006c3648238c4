"""The node artifact: the driver's inventory, built once per driver change, read by every start.

`load_or_build` returns the inventory for the configuration: the artifact
file when it is trusted (`pyxis_hook.trust`: the package owner's, writable
by nobody else) and fresh (`host/freshness.py`), else a fresh discovery,
which is saved only by a process running as the package's owner (root on
a node).  Any other process (an ordinary user's start, in a user namespace
or not) discovers in memory and says so once in the log.  `build` is the
admin's rebuild (`pyxis-hook refresh`).

One file per configuration key (`config_key`) under `snapshot-dir`, JSON,
mode 0644 in a 0755 directory, written whole (temp file + rename).  GPU
facts, IPC sockets and the MPS dir are never taken from it: they change
without any driver file changing, so each start reads them afresh.
Loading imports neither json, pyelftools nor jsonschema.
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

#: bumped whenever discovery records something else for the same driver files, so an upgraded
#: package rebuilds the artifact instead of trusting the old result
FORMAT = 3

_DIGEST_PRIME = 4294967291  # 2**32 - 5
#: the largest artifact read (a driver with every capability is ~200 KB)
ARTIFACT_LIMIT = 64 << 20
#: how long a build waits for another process building the same artifact before building its own
BUILD_WAIT_S = 10.0
#: how this process's `load_or_build` got its inventory, last one last: "read" (the artifact),
#: "built" (discovered and saved) or "discovered" (in memory); a start's record says which
SOURCES: list[str] = []


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
    raw = repr(sorted(config_key(config).items())).encode()
    return pathnames.join(config.snapshot_dir, f"inventory-{int.from_bytes(raw, 'big') % _DIGEST_PRIME:08x}.json")


def lock_path(config) -> str:
    """The build lock beside the artifact (a hidden name)."""
    d, name = pathnames.split(artifact_path(config))
    return pathnames.join(d, "." + name.replace(".json", ".lock"))


def _check(st, path: str, what: str = "file") -> None:
    if what == "file" and not stat.S_ISREG(st.st_mode):
        raise ArtifactError(f"{path}: not a regular file")
    why = trust.why_untrusted(st)
    if why:
        raise ArtifactError(f"{path}: {why}")


def trusted_dir(path: str) -> None:
    """The directory of `path` must pass the trust rule, or anyone could swap the file; ArtifactError."""
    d = pathnames.dirname(path)
    try:
        _check(posix.stat(d), d, "dir")
    except OSError as e:
        raise ArtifactError(f"{d}: {e.strerror}") from None


def load(config, host=None) -> Inventory:
    """The artifact's inventory when trusted and fresh for `config`, else ArtifactError saying why.

    `host`: the GPU facts read now (read when None); they replace the saved ones.
    """
    path = artifact_path(config)
    trusted_dir(path)
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK)
    except OSError as e:
        raise ArtifactError(f"{path}: {e.strerror}") from None
    try:
        _check(posix.fstat(fd), path)
    except BaseException:
        posix.close(fd)
        raise
    try:
        raw = read_to_end(fd, ARTIFACT_LIMIT, 1 << 20)  # closes fd
    except OSError as e:
        raise ArtifactError(f"{path}: {e.strerror}") from None
    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    try:
        data = fastjson.loads(raw)
        if data.get("format") != FORMAT:
            raise ArtifactError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
        if data.get("key") != config_key(config):
            raise ArtifactError(f"{path}: built for another configuration")
        inv = Inventory.from_dict(data["inventory"], host)
    except ArtifactError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ArtifactError(f"{path}: corrupt: {type(e).__name__}: {e}") from None
    why = stale_reason(freshness_key(inv), config, host)
    if why:
        raise ArtifactError(f"{path}: stale: {why}")
    return refresh_live(inv, config)


def save(config, inv: Inventory) -> str:
    """Write the artifact whole; its path.  ArtifactError when it cannot, or no start would trust it."""
    path = artifact_path(config)
    d = pathnames.dirname(path)
    try:
        if not pathnames.isdir(d):
            import os  # only when building

            os.makedirs(d, mode=0o755, exist_ok=True)
            posix.chmod(d, 0o755)
        trusted_dir(path)
        import json  # only when building

        payload = json.dumps({"format": FORMAT, "key": config_key(config), "inventory": inv.to_dict()},
                             indent=1, sort_keys=True).encode()
        write_atomically(path, payload)
    except OSError as e:
        raise ArtifactError(f"{path}: cannot save the node artifact: {e.strerror}") from None
    return path


def write_atomically(path: str, data: bytes, mode: int = 0o644, dir_fd: int | None = None) -> None:
    """Put `data` at `path` whole or not at all (a temp file beside it, fsync'ed, renamed).

    `mode` whatever the umask; the temp name is this process's own, made
    with O_EXCL|O_NOFOLLOW.  With `dir_fd`, `path` is a name in that
    directory.  Raises OSError; the temp file is gone then.
    """
    directory, name = pathnames.split(path)
    tmp = pathnames.join(directory, f".{name}.{posix.getpid()}.tmp")
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC, mode,
                    dir_fd=dir_fd)
    try:
        try:
            posix.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
            posix.fsync(fd)
        finally:
            posix.close(fd)
        posix.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            posix.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


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
    try:
        _check(posix.fstat(fd), path)
    except ArtifactError:
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


def build(config, *, strict: bool = True, host=None) -> tuple[Inventory, str]:
    """Discover the driver now and save the artifact: (inventory, path).

    Holds the build lock meanwhile, so a start that finds the artifact
    stale waits for this one (at most BUILD_WAIT_S) and reads what it saved.
    ArtifactError when this process may not write it or the driver is not
    usable; DriverError (strict) naming the driver's first problem.
    """
    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    if not trust.may_write():
        raise ArtifactError(f"{artifact_path(config)}: only the package's owner (uid {trust.package_owner()}) "
                            "writes the node artifact")
    lock = _build_lock(config)
    try:
        inv = _discover(config, strict, host)
        if not inv.usable:
            raise ArtifactError(f"{artifact_path(config)}: not saved: {inv.errors[0] if inv.errors else 'no driver'}")
        return inv, save(config, inv)
    finally:
        if lock is not None:
            posix.close(lock)


def load_or_build(config, *, strict: bool = True, host=None) -> Inventory:
    """The inventory for `config`: the artifact when trusted and fresh, else a fresh discovery.

    The package's owner saves what it discovers (a failure to save is a
    warning: the start goes on); any other process discovers in memory
    and logs why once.  `host`: the GPU facts when the caller has just
    read them.
    """
    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    try:
        inv = load(config, host)
        SOURCES.append("read")
        return inv
    except ArtifactError as e:
        why = str(e)
    if not trust.may_write():
        log.info(f"node artifact not used ({why}): discovering the driver in memory; "
                 "`pyxis-hook refresh` as root rebuilds it")
        SOURCES.append("discovered")
        return _discover(config, strict, host)
    log.debug(f"rebuilding the node artifact: {why}")
    lock = _build_lock(config)
    try:
        if lock is not None:
            try:
                inv = load(config, host)  # built by the process that held the lock
                SOURCES.append("read")
                return inv
            except ArtifactError:
                pass
        inv = _discover(config, strict, host)
        SOURCES.append("discovered")
        if inv.usable:
            try:
                save(config, inv)
                SOURCES[-1] = "built"
            except ArtifactError as e:
                log.warning(str(e))
        return inv
    finally:
        if lock is not None:
            posix.close(lock)
