"""The container's ld.so.cache updated by the merge: what of the image it needs, read, and the new file written.

Why its own module: `loader.ldmerge` is glibc's cache model, pure (bytes
in, bytes out); this is the side that touches the container.  It runs in
the container's mount namespace on every GPU start whose plan says
`ldcache = "merge"` (`apply.child`, where nothing may be imported: the
child preloads it), and read-only for `pyxis-hook plan` (`preview`).
Rules kept:

* the image's directories are the ones glibc 2.36's ldconfig scans
  (elf/ldconfig.c): the image's compat dir first when the plan has one (a
  directory on ldconfig's command line), then ld.so.conf's (read by
  `ldconf.require_safe`, which refuses a configuration ldconfig must not
  run on either), then the built-in ones (`BUILTIN_DIRS`); a missing one
  is skipped and one inode counts once under its first name
  (add_dir_1/add_single_dir: `ldconf.dirs_by_inode`);
* each injected library's directory must be one of them, named as
  ldconfig names it; a compat dir's SONAME links must already be the ones
  ldconfig would make (the merge writes only the cache);
* whatever the image holds that the model cannot follow (no ld.so.conf,
  one that cannot be read through, no cache, a corrupt one, a symlink
  loop) is a `CannotMerge`, never another error: the caller then runs the
  confined ldconfig rather than failing the container;
* the new cache replaces the old one whole (`cachefile.write_cache`:
  glibc's temp name, then a rename), and only when an entry was added.
"""

from __future__ import annotations

import errno
import posix

from pyxis_hook.errors import LdCacheError, PathError, PyxisHookError
from pyxis_hook.loader.ldconf import UnsafeLoaderConfig, dir_identity, dirs_by_inode, require_safe
from pyxis_hook.plan.build import LdcacheUpdate
from pyxis_hook.rootfs import RootFS, RootPathError
from pyxis_hook.loader.cachefile import CACHE, write_cache
from pyxis_hook.loader.ldcache import CACHE_LIMIT
from pyxis_hook.loader.ldmerge import CannotMerge, InjectedLib, indexed_by_ldconfig, merge_cache
from pyxis_hook.loader.machines import MACHINES

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Sequence


#: ldconfig's built-in directories, after the configured ones (Debian 12's glibc 2.36, measured with
#: `ldconfig -v`: "(from <builtin>:0)"); the fallback runs the host's ldconfig, so these are the host's.
BUILTIN_DIRS: dict[str, tuple[str, ...]] = {
    m.name: (f"/lib/{m.triplet}", f"/usr/lib/{m.triplet}", "/lib", "/usr/lib") for m in MACHINES.values()}

_CONF = "/etc/ld.so.conf"


def scan_dirs_in(rfs, conf_dirs: Sequence[str], builtin: Sequence[str],
                 seen: dict | None = None) -> tuple[tuple[str, ...], dict]:
    """ldconfig's directory list inside the rootfs: (names in scan order, {(dev, ino): name}).

    Like add_dir_1/add_single_dir: a directory that does not exist is
    skipped, one reached twice (same inode) keeps its first name
    (`ldconf.dirs_by_inode`, the one implementation of that rule; `seen`
    gets each name's identity).
    """

    ids = dirs_by_inode(rfs, tuple(conf_dirs) + tuple(builtin), seen)
    return tuple(ids.values()), ids


def _read_cache(rfs) -> bytes:

    try:
        return rfs.read_bytes(CACHE, CACHE_LIMIT)
    except RootPathError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise CannotMerge(f"{CACHE}: the image has no ld.so.cache") from None
        raise CannotMerge(str(e)) from None


def model_image(rfs, libs: Sequence[InjectedLib], *, machine: str | None = None):
    """Everything the merge needs from the rootfs; raises CannotMerge where it cannot be modelled.

    Returns (cache bytes, scan dirs, libs with their dir named as ldconfig names it).
    Whatever the image holds (a symlink loop, a corrupt cache) is a
    CannotMerge, never another error: the caller then runs the confined
    ldconfig rather than failing the container.  The one exception is a
    loader configuration ldconfig must not run on either (a FIFO, a device,
    an include loop, a limit: `ldconf.require_safe`): UnsafeLoaderConfig.
    """

    try:
        return _model_image(rfs, libs, machine)
    except (CannotMerge, UnsafeLoaderConfig):
        raise
    except (PathError, LdCacheError) as e:
        raise CannotMerge(str(e)) from None


def _model_image(rfs, libs: Sequence[InjectedLib], machine: str | None):

    conf = require_safe(rfs)  # a missing file reads as nothing: asked next, unless it was read
    if _CONF not in conf.files_read and not rfs.exists(_CONF):
        raise CannotMerge("the image has no /etc/ld.so.conf (musl or distroless?)")
    if conf.truncated:
        why = conf.problems[0] if conf.problems else "incomplete"
        raise CannotMerge(f"/etc/ld.so.conf cannot be read as ldconfig reads it: {why}")
    machine = machine or posix.uname().machine
    first = tuple(dict.fromkeys(lib.dir for lib in libs if lib.first))
    seen: dict = {}  # each name's identity, as the scan found it: the libraries' dirs are among them
    dirs, ids = scan_dirs_in(rfs, first + tuple(conf.dirs), BUILTIN_DIRS.get(machine, ()), seen)
    mapped = []
    for lib in libs:
        ident = seen[lib.dir] if lib.dir in seen else seen.setdefault(lib.dir, dir_identity(rfs, lib.dir))
        if ident is None or ident not in ids:
            raise CannotMerge(f"{lib.dir} is not in the image's ld.so.conf nor a built-in directory")
        if lib.first:
            _check_soname_link(rfs, lib)
        mapped.append(InjectedLib(ids[ident], lib.name, lib.soname, lib.flags, lib.first))
    return _read_cache(rfs), dirs, tuple(mapped)


def _check_soname_link(rfs, lib: InjectedLib) -> None:
    """The image's `dir/SONAME` must already reach `dir/name` (ldconfig would make that link; we do not)."""
    if lib.soname == lib.name or not indexed_by_ldconfig(lib.name):
        return
    ids = []
    for name in (lib.soname, lib.name):
        try:
            fd = rfs.open(f"{lib.dir}/{name}", posix.O_PATH)
        except PathError:
            raise CannotMerge(f"{lib.dir}/{lib.soname}: no such link to {lib.name} (ldconfig would make it)") from None
        try:
            st = posix.fstat(fd)
        finally:
            posix.close(fd)
        ids.append((st.st_dev, st.st_ino))
    if ids[0] != ids[1]:
        raise CannotMerge(f"{lib.dir}/{lib.soname} does not lead to {lib.name} (ldconfig would re-point it)")


def update_container_cache(rfs, libs: Sequence[InjectedLib]) -> str:
    """Merge `libs` into the rootfs's /etc/ld.so.cache; return a one-line summary for the log.

    Raises CannotMerge when the caller should run ldconfig instead.
    """
    if not libs:
        return "ld.so.cache: merge: no library to add"
    data, dirs, mapped = model_image(rfs, libs)
    result = merge_cache(data, dirs, mapped, CACHE)
    if result.added:
        write_cache(rfs, result.data)  # cachefile: temp name + rename, the temp removed on any failure
    return (f"ld.so.cache: merged {len(result.added)} entries ({result.fmt} format"
            + (f", {len(result.present)} already listed" if result.present else "") + ")")


def libs_from_plan(update: LdcacheUpdate) -> tuple[InjectedLib, ...]:
    """The plan's LdcacheUpdate.libs rows (dir, name, soname, flags) as InjectedLib.

    A row whose dir is one of the update's `first_dirs` (CUDA forward
    compat) is marked `first`: that is how the scan order reaches
    `update_container_cache` through apply's unchanged call.
    """
    first = set(getattr(update, "first_dirs", ()))
    return tuple(InjectedLib(d, n, s, f, first=d in first) for d, n, s, f in update.libs)


def preview(rootfs: str, update: LdcacheUpdate) -> str | None:
    """For `pyxis-hook plan`: None when the merge would apply, else why ldconfig would run instead."""

    try:
        with RootFS(rootfs) as rfs:
            data, dirs, mapped = model_image(rfs, libs_from_plan(update))
            merge_cache(data, dirs, mapped, CACHE)
    except (CannotMerge, PyxisHookError) as e:  # a corrupt cache, a path refused inside the rootfs
        return str(e)
    except OSError as e:
        return f"{rootfs}: {e.strerror}"
    return None
