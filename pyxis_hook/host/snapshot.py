"""The inventory snapshot: discovery's result kept on disk for the per-container path.

Why: discovery reads every driver library with pyelftools (~37 ms of import
alone, plus the reading); the prestart hook runs for every container and must
cost almost nothing.  So the inventory is saved as JSON and reused while it is
provably current:

- keyed by the configuration it was built for (driver/proc/dev roots, PATH,
  MPS dir, graphics-config-files): one file per key under `snapshot-dir`;
- invalidated by the driver version the kernel module reports now, by the tree
  the driver root leads to now (a link swapped to another driver) and by the
  stat signature (st_dev, st_ino, st_size, st_mtime_ns) of every file it came
  from (ld.so.cache, each library/binary/firmware/ICD file, procfs version);
- GPU facts (GPUs, MIG devices, nodes) are re-read from procfs on every load,
  and the IPC sockets / MPS dir re-checked (cheap, no ELF parsing): they change
  without any driver file changing.

A snapshot that is stale, corrupt, not owned by root (or by us) or writable
by others is rebuilt, never trusted.  Written atomically (tmp + rename),
mode 0644 in a 0755 directory.  Loading imports only fastjson, posix and pathnames: never
json, pyelftools or jsonschema (tests check sys.modules).
"""

from __future__ import annotations

import marshal
import posix
import stat
import sys

from pyxis_hook import fastjson, log, pathnames
from pyxis_hook.errors import SnapshotError
from pyxis_hook.rootfs import read_to_end

#: bumped whenever discovery records something else for the same driver files, so an upgrade
#: rebuilds the snapshot instead of trusting the old result (2: per-capability DT_NEEDED closure,
#: firmware also from /usr/lib/firmware; 3: binaries also in the driver libraries' <prefix>/bin)
FORMAT = 3

_DIGEST_PRIME = 4294967291  # 2**32 - 5


def config_key(config) -> dict:
    """The configuration values a snapshot depends on."""
    return {
        "driver_root": pathnames.normpath(pathnames.abspath(config.driver_root)),
        "proc_root": config.proc_root,
        "dev_root": config.dev_root,
        "path": list(config.path),
        "mps_pipe_dir": config.mps_pipe_dir,
        "graphics_config_files": bool(config.graphics_config_files),
    }


def snapshot_path(config) -> str:
    # only a file name: the key itself is stored inside and compared on load.  The digest is the
    # key's bytes as one integer modulo the largest 32-bit prime: stable across runs and Python
    # versions (hash() of a str is not), computed by int arithmetic in C, and without loading zlib
    # or hashlib (each an extension module and a shared library to map: ~0.5 ms of a start)
    raw = repr(sorted(config_key(config).items())).encode()
    digest = f"{int.from_bytes(raw, 'big') % _DIGEST_PRIME:08x}"
    return pathnames.join(config.snapshot_dir, f"inventory-{digest}.json")


def _trusted_file(fd: int, path: str) -> None:
    st = posix.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise SnapshotError(f"{path}: not a regular file")
    if st.st_uid not in (0, posix.geteuid()):
        raise SnapshotError(f"{path}: owned by uid {st.st_uid}, not root")
    if st.st_mode & 0o022:
        raise SnapshotError(f"{path}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")


def trusted_dir(path: str) -> None:
    """The dir of `path` must be ours (root's) and closed to others, or anyone could swap the file; SnapshotError.

    For every file kept beside the snapshot (decisions, the GPU memo): one
    a later start would refuse to read is not worth writing.
    """
    d = pathnames.dirname(path)
    try:
        st = posix.stat(d)
    except OSError as e:
        raise SnapshotError(f"{d}: {e.strerror}") from None
    if st.st_uid not in (0, posix.geteuid()):
        raise SnapshotError(f"{d}: owned by uid {st.st_uid}, not root")
    if st.st_mode & 0o022:
        raise SnapshotError(f"{d}: writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})")


def stat_signature(path: str) -> tuple[str, int, int, int, int] | None:
    """(path, st_dev, st_ino, st_size, st_mtime_ns) of a file, None when it cannot be stat'ed."""
    try:
        st = posix.stat(path)
    except OSError:
        return None
    return (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def currency(inv) -> tuple:
    """What decides whether an inventory is still current (`stale_reason`): plain values, marshal-able."""
    return (inv.driver_root, inv.version_source, inv.driver_version, inv.sources)


def stale_reason(current: tuple, config, host, root: str = "") -> str:
    """Why an inventory whose `currency` was `current` is out of date now ("" when it is still current).

    The driver root must lead where it led (the inventory names one tree's
    files), every file it came from must have its stat signature, and the
    kernel module must report the version it was built for.  `root`: where
    the driver root leads now, when the caller has just asked.
    """
    driver_root, version_source, driver_version, sources = current
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


def _identity(st) -> tuple[int, int, int, int]:
    """What tells one snapshot file from another: a rewrite is a new inode (tmp + rename), an edit a new mtime."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def open_trusted(path: str) -> int:
    """An fd of the file at `path` when it and its dir may hold what root acts on; SnapshotError saying why not."""
    trusted_dir(path)
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC)
    except OSError as e:
        raise SnapshotError(f"{path}: {e.strerror}") from None
    try:
        _trusted_file(fd, path)
    except BaseException:
        posix.close(fd)
        raise
    return fd


def kept_path(config, prefix: str, key: bytes) -> str:
    """`<snapshot-dir>/<prefix><digest of key>.bin`: where a start keeps something beside the snapshot.

    The key itself is stored inside and compared by the reader; the digest
    only spreads keys over files.  It is the key's bytes as one integer, as
    the snapshot's file name (`snapshot_path`), reduced by `hash()`, which
    for an int is its value modulo 2**61 - 1 on every run (only str and
    bytes hashes are salted): a decision's key is a few KB, and dividing
    that by the 32-bit prime was ~5 us of every start.
    """
    return pathnames.join(config.snapshot_dir, f"{prefix}{hash(int.from_bytes(key, 'big')) % _DIGEST_PRIME:08x}.bin")


def _kept_header(fmt: bytes) -> bytes:
    return sys.modules["_frozen_importlib_external"].MAGIC_NUMBER + fmt  # marshal's format is the interpreter's


def load_kept(path: str, fmt: bytes, limit: int):
    """The value `keep` wrote at `path` in format `fmt`, trusted as the snapshot is; SnapshotError saying why not.

    For what a start keeps beside the snapshot (decisions, the GPU memo):
    the file must pass `open_trusted`, be at most `limit` bytes, start with
    this interpreter's bytecode magic (marshal's format is the interpreter's)
    and `fmt`, and unmarshal; what the value holds is the caller's to check.
    """
    fd = open_trusted(path)
    try:
        data = read_to_end(fd, limit, limit + 1)  # one read: these files are a few KB to a few hundred
    except OSError as e:
        raise SnapshotError(f"{path}: {e.strerror}") from None
    header = _kept_header(fmt)
    if not data.startswith(header):
        raise SnapshotError(f"{path}: written by another version or Python")
    try:
        return marshal.loads(memoryview(data)[len(header):])
    except (EOFError, ValueError, TypeError) as e:
        raise SnapshotError(f"{path}: corrupt: {e}") from None


def keep(path: str, fmt: bytes, value) -> None:
    """Write `value` (marshal's plain values) at `path` for `load_kept`: only where a start would trust it, atomically.

    Raises SnapshotError (an untrusted directory: what no start would read
    is not written), OSError or ValueError (a value marshal cannot write).
    Readable by its owner only: a decision keeps the env values its request
    read, and a container's env may hold secrets; only root or the owner
    reads a kept file.
    """
    trusted_dir(path)
    write_atomically(path, _kept_header(fmt) + marshal.dumps(value), mode=0o600)


def identity(config) -> tuple[int, int, int, int]:
    """The identity of the snapshot `load` would read now (trusted as `load` trusts it); SnapshotError if none."""
    fd = open_trusted(snapshot_path(config))
    try:
        return _identity(posix.fstat(fd))
    finally:
        posix.close(fd)


def load(config, host=None, seen: list | None = None):
    """The saved Inventory if it is current for `config`, else raise SnapshotError saying why.

    `host` are fresh GPU facts (discovered when None); they replace the saved ones.
    `seen` gets the identity of the file read (`identity`), for the decision cache.
    """
    from pyxis_hook.host.gpuscan import discover_gpus
    from pyxis_hook.host.inventory import Inventory, refresh_live

    path = snapshot_path(config)
    fd = open_trusted(path)
    try:
        read_from = _identity(posix.fstat(fd))
        with open(fd, "rb", closefd=False) as f:
            raw = f.read()
    finally:
        posix.close(fd)
    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    try:
        data = fastjson.loads(raw)
        if data.get("format") != FORMAT:
            raise SnapshotError(f"{path}: format {data.get('format')!r}, expected {FORMAT}")
        if data.get("key") != config_key(config):
            raise SnapshotError(f"{path}: built for another configuration")
        inv = Inventory.from_dict(data["inventory"], host)  # fresh GPU facts: the saved ones are not rebuilt
    except SnapshotError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise SnapshotError(f"{path}: corrupt: {type(e).__name__}: {e}") from None
    why = stale_reason(currency(inv), config, host)
    if why:
        raise SnapshotError(f"{path}: stale: {why}")
    if seen is not None:
        seen.append(read_from)
    return refresh_live(inv, config)


def save(config, inv, seen: list | None = None) -> str:
    """Write the snapshot atomically; return its path.  Raises SnapshotError on failure.

    `seen` gets the identity of the file written (`identity`), once it is in place.
    """
    path = snapshot_path(config)
    d = pathnames.dirname(path)
    try:
        if not pathnames.isdir(d):
            import os  # only when writing (a rebuild): `os` is ~1.5 ms of a start (pathnames.py)

            os.makedirs(d, mode=0o755, exist_ok=True)
            posix.chmod(d, 0o755)
        # a snapshot `load` would refuse is not worth writing: say so (once per rebuild) instead
        trusted_dir(path)
        import json  # only when writing

        payload = json.dumps({"format": FORMAT, "key": config_key(config), "inventory": inv.to_dict()},
                             indent=1, sort_keys=True).encode()
        written = write_atomically(path, payload)
        if seen is not None:
            seen.append(written)
    except OSError as e:
        raise SnapshotError(f"{path}: cannot save the inventory snapshot: {e.strerror}") from None
    return path


def write_atomically(path: str, data: bytes, mode: int = 0o644, dir_fd: int | None = None) -> tuple[int, int, int, int]:
    """Put `data` at `path` whole or not at all (a hidden temp file beside it, fsync'ed, renamed); its identity.

    `mode` whatever the umask.  The temp name is this process's own and
    made with O_EXCL|O_NOFOLLOW: nothing another user placed is written
    through.  With `dir_fd`, `path` is a name in that directory (one the
    caller opened and checked: nothing on the way to it is looked up
    again).  Raises OSError; the temp file is gone then.
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
            written = _identity(posix.fstat(fd))  # the rename keeps the inode, size and mtime
        finally:
            posix.close(fd)
        posix.rename(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            posix.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise
    return written


#: how long a start waits for another start that is building the same snapshot, before it builds
#: its own (a herd of containers on a fresh node: one discovery instead of one per container)
BUILD_WAIT_S = 10.0


def lock_path(config) -> str:
    """The build lock beside the snapshot (a hidden name: not a snapshot)."""
    d, name = pathnames.split(snapshot_path(config))
    return pathnames.join(d, "." + name.replace(".json", ".lock"))


def _build_lock(config):
    """An fd holding the exclusive build lock, or None (no trusted dir, or still held after BUILD_WAIT_S).

    flock: the kernel drops it when its holder exits, killed or not, so a start killed while
    building costs the others nothing but the wait.
    """
    import fcntl  # only when the snapshot must be built
    import time

    path = lock_path(config)
    try:
        trusted_dir(path)
        fd = posix.open(path, posix.O_RDWR | posix.O_CREAT | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK, 0o600)
    except (OSError, SnapshotError):
        return None
    try:
        _trusted_file(fd, path)
    except SnapshotError:
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


def load_or_build(config, *, strict: bool = True, host=None, seen: list | None = None):
    """The current inventory: the snapshot when valid, else a fresh discovery (saved if usable).

    Starts that find no valid snapshot at once take a build lock: the first builds, the others
    wait for it (at most BUILD_WAIT_S) and then load what it saved.  Failure to save is a
    warning: the hook still works, only slower.  `host`: the GPU facts when the caller has
    just discovered them.  `seen` gets the identity of the snapshot the inventory is
    (nothing when it was not saved).
    """
    from pyxis_hook.host.gpuscan import discover_gpus

    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    try:
        return load(config, host, seen)
    except SnapshotError as e:
        log.debug(f"rebuilding the inventory: {e}")
    lock = _build_lock(config)
    try:
        if lock is not None:
            try:
                return load(config, host, seen)  # built by the start that held the lock
            except SnapshotError:
                pass
        from pyxis_hook.host.discovery import discover
        import gc

        gc.enable()  # the hook's start turns it off; a build parses ELF files for seconds
        inv = discover(config, strict=strict, host=host)
        if inv.usable:
            try:
                save(config, inv, seen)
            except SnapshotError as e:
                log.warning(str(e))
        return inv
    finally:
        if lock is not None:
            posix.close(lock)  # releases the flock
