"""glibc's ld.so.cache as ldconfig writes it: its entries' order and its layout (glibc's `elf/cache.c`).

Why its own module: `ldcache` reads a cache (the layout, flags and the key
order ld.so searches by, `sysdeps/generic/dl-cache.h`); this writes one, as
ldconfig's `save_cache` does, for the compat-format merge (`ldmerge`), the
driver root scanned without a cache (`host.libscan`, `host.discovery`) and
the tests' fixtures.  Rules kept from glibc 2.36:

* entries are sorted by ldconfig's `compare`: key descending by
  `_dl_cache_libcmp` (`ldcache.libcmp`), flags descending, glibc-hwcaps
  entries first by subdirectory name, then legacy hwcap descending; the
  sort is stable, as ldconfig's insertion into its sorted list keeps
  equal entries in scan order;
* the string table is `stringtable_finalize`'s (elf/stringtable.c):
  strings in reversed-string order, a string that is the tail of the
  previous one shares its bytes;
* the layout is `save_cache`'s: the old table (compat and old formats,
  legacy-hwcap entries left out, compat's count rounded up to even), the
  new header and entries, the strings, then the 4-aligned extension
  directory (glibc-hwcaps names, generator string), little-endian.

Built-ins only, like `ldcache`: a compat-format merge runs it in the
container's namespace, where nothing may be imported.
"""

from __future__ import annotations

# functools.cmp_to_key is this C function; functools stays off the start path
# (docs/decisions/2026-12-07-start-costs.md), and this also runs after setns,
# where nothing may be imported (apply._NoImports)
from _functools import cmp_to_key

from pyxis_hook import pathnames
from pyxis_hook.errors import LdCacheError
from pyxis_hook.loader.ldcache import (CACHE_ALIGN, CACHEMAGIC, CACHEMAGIC_VERSION_NEW, ENDIAN_LITTLE,
                                       EXT_TAG_GENERATOR, EXT_TAG_GLIBC_HWCAPS, EXTENSION_MAGIC, FORMATS,
                                       HWCAP_EXTENSION, NEW_ENTRY_SIZE, NEW_HEADER_SIZE, CacheEntry, le_words,
                                       libcmp)

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing is never imported at run time
    from typing import Iterable


def entry_sort_key_cmp(e1: CacheEntry, e2: CacheEntry) -> int:
    """ldconfig's `compare` (elf/cache.c): key descending by libcmp, flags descending,
    glibc-hwcaps entries first sorted by subdir name, then legacy hwcap descending."""
    res = libcmp(e2.key, e1.key)
    if res:
        return res
    if e1.flags != e2.flags:
        return 1 if e1.flags < e2.flags else -1
    h1, h2 = e1.is_hwcaps, e2.is_hwcaps
    if h1 and not h2:
        return -1
    if h2 and not h1:
        return 1
    if h1 and h2:
        n1, n2 = pathnames.fsencode(e1.hwcap_name or ""), pathnames.fsencode(e2.hwcap_name or "")
        if n1 != n2:
            return -1 if n1 < n2 else 1
        return 0
    b1, b2 = bin(e1.hwcap).count("1"), bin(e2.hwcap).count("1")
    if b1 != b2:
        return 1 if b2 > b1 else -1
    if e1.hwcap != e2.hwcap:
        return 1 if e2.hwcap > e1.hwcap else -1
    return 0


def sort_entries(entries: Iterable[CacheEntry]) -> tuple[CacheEntry, ...]:
    """Entries in the order ldconfig writes them (stable: ties keep input order)."""
    return tuple(sorted(entries, key=cmp_to_key(entry_sort_key_cmp)))


def merge_entries(existing: Iterable[CacheEntry], added: Iterable[CacheEntry]) -> tuple[CacheEntry, ...]:
    """`existing` plus `added`, an added entry replacing any with the same key, flags and
    glibc-hwcaps subdir (the same slot in the loader's search); result sorted like ldconfig."""
    added = tuple(added)
    slots = {(e.key, e.flags, e.hwcap_name if e.is_hwcaps else None) for e in added}
    kept = [e for e in existing if (e.key, e.flags, e.hwcap_name if e.is_hwcaps else None) not in slots]
    return sort_entries(kept + list(added))


def _finalize_strings(strings: set[bytes]) -> tuple[bytes, dict[bytes, int]]:
    """glibc's stringtable_finalize: reversed-string order with tail merging."""
    if not strings:
        return b"", {}
    order = sorted(strings, key=lambda s: s[::-1], reverse=True)
    offsets = {order[0]: 0}
    for prev, cur in zip(order, order[1:]):
        if len(prev) >= len(cur) and prev.endswith(cur):
            offsets[cur] = offsets[prev] + len(prev) - len(cur)
        else:
            offsets[cur] = offsets[prev] + len(prev) + 1
    size = offsets[order[-1]] + len(order[-1]) + 1
    table = bytearray(size)
    for s, off in offsets.items():
        if table[off] == 0:
            table[off:off + len(s)] = s
    return bytes(table), offsets


def serialize_cache(entries: Iterable[CacheEntry], generator: str | None, fmt: str = "new",
                    *, extra_hwcaps_names: Iterable[str] = ()) -> bytes:
    """Bytes of an ld.so.cache in glibc's layout (elf/cache.c save_cache), little-endian.

    Entries are sorted as ldconfig sorts them.  glibc-hwcaps entries need
    `hwcap_name`; their ISA level bits are kept.  `extra_hwcaps_names` are
    subdirectory names ldconfig saw but that hold no library (it still puts
    them in the string table).  `generator` None writes no generator section
    (ldconfig always writes one).
    """
    if fmt not in FORMATS:
        raise LdCacheError(f"unknown cache format {fmt!r} (expected one of {', '.join(FORMATS)})")
    ents = sort_entries(entries)
    used = sorted({pathnames.fsencode(e.hwcap_name) for e in ents if e.is_hwcaps and e.hwcap_name is not None})
    for e in ents:
        if e.is_hwcaps and e.hwcap_name is None:
            raise LdCacheError(f"cache entry {e.key} => {e.value} is a glibc-hwcaps entry without a subdirectory name")
    index = {n: i for i, n in enumerate(used)}
    strings = {pathnames.fsencode(e.key) for e in ents} | {pathnames.fsencode(e.value) for e in ents}
    strings |= set(used) | {pathnames.fsencode(n) for n in extra_hwcaps_names}
    table, offs = _finalize_strings(strings)

    n = len(ents)
    new_size = NEW_HEADER_SIZE + n * NEW_ENTRY_SIZE if fmt != "old" else 0
    str_offset = new_size
    out = bytearray()
    if fmt != "new":
        # glibc 2.36 leaves legacy-hwcap entries out of the old table
        old = [e for e in ents if e.is_hwcaps or not e.hwcap]
        n_old = (len(old) + 1) & ~1 if fmt == "compat" else len(old)
        out += CACHEMAGIC + b"\0" + le_words(n_old)
        rows = [(e.flags, str_offset + offs[pathnames.fsencode(e.key)], str_offset + offs[pathnames.fsencode(e.value)]) for e in old]
        if n_old > len(rows):
            rows.append(rows[-1])
        for flags, key, value in rows:
            out += flags.to_bytes(4, "little", signed=True) + le_words(key, value)
    pad = (-len(out)) % CACHE_ALIGN if fmt == "compat" else 0
    out += b"\0" * pad
    ext_offset = 0
    if fmt != "old":
        ext_offset = len(out) + new_size + len(table)
        ext_offset += (-ext_offset) % 4
        out += CACHEMAGIC_VERSION_NEW + le_words(n, len(table), ENDIAN_LITTLE, ext_offset, 0, 0, 0)
        for e in ents:
            hwcap = e.hwcap
            if e.is_hwcaps:
                hwcap = HWCAP_EXTENSION | (e.isa_level << 32) | index[pathnames.fsencode(e.hwcap_name)]
            out += e.flags.to_bytes(4, "little", signed=True) + le_words(
                str_offset + offs[pathnames.fsencode(e.key)], str_offset + offs[pathnames.fsencode(e.value)], 0,
                hwcap & 0xFFFFFFFF, hwcap >> 32)
    out += table
    if fmt != "old":
        out += b"\0" * (ext_offset - len(out))
        gen = pathnames.fsencode(generator) if generator is not None else None
        sections = []
        body_off = ext_offset + 8 + 16 * ((gen is not None) + bool(used))
        hw_bytes = le_words(*(str_offset + offs[nm] for nm in used))
        if gen is not None:
            sections.append((EXT_TAG_GENERATOR, 0, body_off + len(hw_bytes), len(gen)))
        if used:
            sections.append((EXT_TAG_GLIBC_HWCAPS, 0, body_off, len(hw_bytes)))
        out += le_words(EXTENSION_MAGIC, len(sections))
        for s in sections:
            out += le_words(*s)
        out += hw_bytes + (gen or b"")
    return bytes(out)
