"""ld.so's lookup in an ld.so.cache: which entry the loader takes for a name (glibc's elf/dl-cache.c).

The file format (reading, writing, the entries' order, the flags ldconfig
writes) is `ldcache`; this is the loader's side of it: the flags each ld.so
accepts (`LOADER_FLAGS`, `_dl_cache_check_flags`), the binary search by
`libcmp`, then the choice among the entries under one key by flags,
glibc-hwcaps subdirectory priority, x86 ISA level and legacy hwcap word
(`search_cache` in dl-cache.c).  Discovery, the loader model (`loaderenv`)
and the explaining tools use it; a container start does not (it only merges
and writes).
"""

from __future__ import annotations

import posix

from pyxis_hook.loader.ldcache import FLAG_ELF, FLAG_REQUIRED_MASK, FLAG_X8664_LIB64_LIBC6, libcmp

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only
    from typing import Iterable

    from pyxis_hook.loader.ldcache import CacheEntry, LdCache


#: `_dl_cache_check_flags` per loader: the entry flags each ld.so accepts.  The
#: last element is that loader's `_DL_CACHE_DEFAULT_ID` (an entry with it ends
#: the search at once).  i386 and other "generic" loaders accept 1 or 3.
LOADER_FLAGS: dict[str, tuple[int, ...]] = {
    "x86_64": (0x0303,),
    "x32": (0x0803,),
    "i386": (0x0001, 0x0003),
    "aarch64": (0x0A03,),
    "armhf": (0x0003, 0x0903),
    "armel": (0x0003, 0x0B03),
    "ppc64le": (0x0503,),
    "ppc64": (0x0503,),
    "s390x": (0x0403,),
    "sparc64": (0x0103,),
    "riscv64": (0x1003,),
    "mips64": (0x0703,),
    "generic": (0x0001, 0x0003),
}


def accepted_flags(elfclass: int, machine: str | None = None) -> tuple[int, ...]:
    """The cache flags the ld.so of a class on `machine` accepts (`LOADER_FLAGS`, `_dl_cache_check_flags`).

    x86-64: 0x0303 (64-bit), 0x0001/0x0003 (i386); aarch64: 0x0A03 (64-bit),
    0x0003/0x0903 (armhf).  A machine without a loader of that class gets glibc's generic answer.
    """
    from pyxis_hook.loader.machines import machine as row_of

    name = machine or posix.uname().machine
    row = row_of(name)
    if elfclass == 64:
        key = row.cache_loader if row is not None else name
    else:
        key = row.cache_loader32 if row is not None else "generic"
    return LOADER_FLAGS.get(key, LOADER_FLAGS["generic"])


def hwcaps_priorities(supported: Iterable[str]) -> dict[str, int]:
    """Map glibc-hwcaps subdirectory names to ld.so priorities (1 = best).

    `supported` is in the loader's preference order, most preferred first
    (e.g. ("x86-64-v4", "x86-64-v3", "x86-64-v2") as `ld.so --list-diagnostics`
    or `--help` shows for this CPU).
    """
    return {name: i + 1 for i, name in enumerate(supported)}


def lookup(
    cache: LdCache,
    name: str,
    flags_ok: int | Iterable[int] = FLAG_X8664_LIB64_LIBC6,
    *,
    hwcaps: Iterable[str] = (),
    isa_levels: int | None = None,
    default_id: int | None = None,
    legacy_ok=None,
) -> tuple[CacheEntry, ...]:
    """Look `name` up the way ld.so's `search_cache` (elf/dl-cache.c) does.

    `flags_ok` is the loader's `_dl_cache_check_flags`: one flag value
    (x86-64: 0x0303) or several (i386: (1, 3)); `default_id` (default: the
    largest of them) ends the search at once when a plain entry has it.
    `hwcaps` are the glibc-hwcaps subdirectories the loader supports, most
    preferred first; `isa_levels` is the CPU's x86 ISA bitmask (bit n = level n
    supported; None = skip the check).

    Returns a tuple whose first element is the entry ld.so would use (empty
    tuple: not in the cache, the loader goes on to the system dirs); any
    further elements are the other acceptable entries under that key, in
    cache order, for explanations.  Legacy (pre-2.33 hwcap bitmask) entries
    are skipped, as glibc >= 2.37 does, unless `legacy_ok` (a loader before
    2.37: `loadercpu.legacy_cache_ok`) accepts their hwcap word.
    """
    ok = (flags_ok,) if isinstance(flags_ok, int) else tuple(flags_ok)
    default = max(ok) if default_id is None else default_id
    prio = hwcaps_priorities(hwcaps)
    entries = cache.entries
    left, right = 0, len(entries) - 1
    while left <= right:
        middle = (left + right) // 2
        cmp = libcmp(name, entries[middle].key)
        if cmp == 0:
            first = middle
            while first > 0 and libcmp(name, entries[first - 1].key) == 0:
                first -= 1
            last = middle
            while last + 1 < len(entries) and libcmp(name, entries[last + 1].key) == 0:
                last += 1
            return _pick(entries[first:last + 1], ok, default, prio, isa_levels, legacy_ok)
        if cmp < 0:
            left = middle + 1
        else:
            right = middle - 1
    return ()


def _pick(candidates, ok, default, prio, isa_levels, legacy_ok=None) -> tuple[CacheEntry, ...]:
    best: CacheEntry | None = None
    best_prio = 0
    usable = []
    stopped = False
    for e in candidates:
        if e.flags not in ok:
            continue
        named = e.is_hwcaps
        if named and isa_levels is not None and not (isa_levels >> e.isa_level) & 1:
            continue
        if not named and e.hwcap and (legacy_ok is None or not legacy_ok(e.hwcap)):
            continue  # legacy hwcap entry this loader does not take
        if named and prio.get(e.loader_hwcap_name or "", 0) == 0:
            continue
        usable.append(e)
        if stopped:
            continue
        if not named and best is not None:
            stopped = True
            continue
        if named:
            p = prio[e.loader_hwcap_name or ""]
            if best is not None and p >= best_prio:
                continue
            best_prio = p
        best = e
        if not named and e.flags == default:
            stopped = True
    if best is None:
        return ()
    return (best,) + tuple(e for e in usable if e is not best)


def search_cache(cache: LdCache, name: str, flags_ok: int | Iterable[int] = FLAG_X8664_LIB64_LIBC6,
                 **kwargs) -> CacheEntry | None:
    """Only the entry ld.so would pick for `name`, or None (see `lookup`)."""
    found = lookup(cache, name, flags_ok, **kwargs)
    return found[0] if found else None


def entries_for_arch(cache: LdCache, abi: int, *, hwcaps_too: bool = False) -> tuple[CacheEntry, ...]:
    """Entries of one ABI (`flags & 0xff00 == abi`, ELF type bit set), as libnvidia-container selects.

    i386 is abi 0x0000.  glibc-hwcaps entries are left out unless asked for.
    """
    return tuple(e for e in cache.entries
                 if (e.flags & FLAG_ELF) and (e.flags & FLAG_REQUIRED_MASK) == abi
                 and (hwcaps_too or not e.is_hwcaps))
