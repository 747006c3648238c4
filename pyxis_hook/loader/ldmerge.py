"""Add the injected driver libraries to a container's ld.so.cache without rescanning the image.

Why: glibc's `ldconfig` rebuilds the whole cache, reading every library of
every configured directory, so its time grows with the image's libraries
and, on a large image, is most of what nvidia-container-cli's start costs
(docs/decisions/2026-12-07-start-costs.md).  The image's cache already
describes the image, so the same result is reached by inserting the new
entries where ldconfig would have put them:

* key = SONAME, value = `<dir>/<SONAME>` (the link ldconfig makes; the hook's
  plan makes it too), flags from the ELF class (`ldcache.written_flags`);
* position: ldconfig keeps its list sorted with `compare` (elf/cache.c) and
  inserts a new entry *after* the equal ones already there, so entries that
  compare equal (same key and flags, plain) are in directory scan order —
  ld.so.conf order, then the built-in dirs, a directory listed twice (same
  inode, e.g. /lib -> usr/lib) counting once under its first name.  That
  order is what makes the first directory win in ld.so's `search_cache`;
* an entry with the same key, flags and directory is the same entry (the
  value is dir/SONAME whatever file the link points at): it is kept;
* CUDA forward compat (`InjectedLib.first`): the image's compat dir is
  scanned before ld.so.conf's dirs, as a dir on ldconfig's command line or
  in `/etc/ld.so.conf.d/00-compat-*.conf` is, so its `libcuda.so.1` comes
  before the injected one.  Its SONAME links must already be the ones
  ldconfig would make (the merge writes only the cache).

Anything that cannot be modelled exactly raises `CannotMerge` (the caller
falls back to the confined ldconfig run and says so): no cache, an empty,
old-format, big-endian or otherwise unknown cache, a header glibc refuses
(`ldcache.header_endian`: the merged file keeps the image's header, so it
must be one glibc reads), unknown extension sections, a string outside the
string table, a compat cache whose entries are not in ldconfig's order (its
rewrite would sort them), an injected directory ldconfig would not scan, a
same-directory entry with other flags, equal entries from a directory
outside the scan list or out of scan order, a compat SONAME link missing or
pointing elsewhere.  tests/oracles/test_ldmerge_property_oracle.py checks
the result against `ldconfig -p` for any cache the merge accepts.

The assumption made (and documented in bench/README.md): the image's cache
is what ldconfig built for the image as it is, as after every package
install.  A stale cache stays exactly as stale as it was.

`merge_cache` is pure (bytes in, bytes out).  A "new"-format cache is
spliced at the byte level (entries shifted, strings appended, extension
sections moved) so a 5,000-entry cache costs O(k log n) comparisons rather
than a parse and re-sort; a compat cache is parsed, merged and re-written by
`cachewrite.serialize_cache`.  The side that reads the image and writes its
new cache (`update_container_cache`) is `apply/cacheupdate.py`.
"""

from __future__ import annotations

import sys

# functools.cmp_to_key is this C function (functools stays off the start path, and nothing may be imported after setns)
from _functools import cmp_to_key

from pyxis_hook import pathnames
from pyxis_hook.loader import ldcache as L
from pyxis_hook.loader.cachewrite import entry_sort_key_cmp, serialize_cache
from pyxis_hook.errors import InternalSignal, LdCacheError
from pyxis_hook.record import record

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterable, Sequence


class CannotMerge(InternalSignal):
    """The image's loader setup is one the merge cannot reproduce exactly: use ldconfig."""


@record
class InjectedLib:
    """One library the hook puts in the container, as ldconfig would index it.

    `dir` is the container directory it is mounted in, `name` its file name,
    `soname` its DT_SONAME, `flags` the cache flags (`ldcache.written_flags`).
    `first`: `dir` is scanned before the image's configured directories, as
    a directory on ldconfig's command line is (CUDA forward compat: the
    image's own /usr/local/cuda/compat, whose SONAME links must already be
    what ldconfig would make — checked by `apply.cacheupdate.model_image`).
    """

    dir: str
    name: str
    soname: str
    flags: int
    first: bool = False


def indexed_by_ldconfig(name: str) -> bool:
    """ldconfig's search_dir only looks at `lib*` / `ld-*` names containing `.so`."""
    return name.startswith(("lib", "ld-")) and ".so" in name


# ------------------------------------------------------------------ the merge


@record
class MergeResult:
    data: bytes
    added: tuple[L.CacheEntry, ...]  # entries inserted
    present: tuple[L.CacheEntry, ...]  # injected libraries the cache already listed
    fmt: str


class _View:
    """Lazy, bounds-checked access to the entries of a parsed or raw cache: `key(i)` (bytes) and `get(i)`."""

    def __init__(self, n: int, key, get) -> None:
        self.n = n
        self.key = key
        self.get = get


def _place(view: _View, new: L.CacheEntry, lib_name: str, dir_rank: dict[str, int], rank: int,
           where: str) -> int | None:
    """Index at which ldconfig would have inserted `new`; None when the same entry is there.

    One binary search by key (keys descend in `libcmp` order) finds the run
    of entries with `new`'s key; the rest of ldconfig's order (flags,
    glibc-hwcaps, hwcap) and the scan order are read in that run (a few
    entries in a real cache; the image decides, and a long run costs what a
    walk of it costs).  CannotMerge for an entry of `new`'s directory with
    other flags (ldconfig would keep only one), or a run not in scan order.
    """
    want = pathnames.fsencode(new.key)
    lo, hi = 0, view.n
    while lo < hi:
        mid = (lo + hi) // 2
        if L.libcmp(view.key(mid), want) > 0:
            lo = mid + 1
        else:
            hi = mid
    end = lo
    while end < view.n and L.libcmp(view.key(end), want) == 0:
        end += 1
    run = [view.get(i) for i in range(lo, end)]
    for e in run:
        if e.value == new.value and e.flags != new.flags and not e.is_hwcaps:
            raise CannotMerge(f"{where}: {e.value} is listed with flags {e.flags:#x}, "
                              f"the injected {lib_name} has {new.flags:#x}")
    pos = lo
    last_rank = -1
    present = False
    for i, e in enumerate(run, lo):
        c = entry_sort_key_cmp(e, new)
        if c < 0:  # before `new` in ldconfig's order
            pos = i + 1
            continue
        if c > 0:
            break
        # the same entry already listed: kept, once the run it sits in is checked to be in scan
        # order (an image that lists a first dir, e.g. compat, later in its ld.so.conf is not)
        present = present or e.value == new.value
        r = dir_rank.get(pathnames.dirname(e.value))
        if r is None:
            raise CannotMerge(f"{where}: {e.key} => {e.value} comes from a directory ldconfig would not scan; "
                              f"cannot tell where {new.value} goes")
        if r < last_rank:
            raise CannotMerge(f"{where}: entries for {e.key} are not in directory scan order")
        last_rank = r
        if r < rank:
            pos = i + 1
    return None if present else pos


def _plan_inserts(view: _View, scan_dirs: Sequence[str], libs: Iterable[InjectedLib], where: str):
    dir_rank = {d: i for i, d in enumerate(scan_dirs)}
    inserts: list[tuple[int, int, L.CacheEntry]] = []
    present: list[L.CacheEntry] = []
    seen: set[tuple[str, int, str]] = set()
    for lib in libs:
        if not indexed_by_ldconfig(lib.name):
            continue  # ldconfig ignores it too
        rank = dir_rank.get(lib.dir)
        if rank is None:
            raise CannotMerge(f"{where}: {lib.dir} is not among the directories ldconfig scans in this image")
        new = L.CacheEntry(lib.soname, f"{lib.dir}/{lib.soname}", lib.flags)
        if (new.key, new.flags, new.value) in seen:
            continue
        seen.add((new.key, new.flags, new.value))
        pos = _place(view, new, lib.name, dir_rank, rank, where)
        if pos is None:
            present.append(new)
        else:
            inserts.append((pos, rank, new))
    # several new entries at one index: ldconfig's order among themselves
    inserts.sort(key=lambda t: t[1])  # scan order first (stable sort keeps it among equals)
    inserts.sort(key=cmp_to_key(lambda a, b: (a[0] > b[0]) - (a[0] < b[0])
                                          or entry_sort_key_cmp(a[2], b[2])))
    return inserts, present


def merge_cache(data: bytes, scan_dirs: Sequence[str], libs: Iterable[InjectedLib],
                name: str = "<bytes>") -> MergeResult:
    """The image's cache bytes with `libs` added, as glibc's ldconfig would write them.

    `scan_dirs` are the directories ldconfig scans in this image, in order,
    each under the name ldconfig uses for it (first listing of an inode);
    every `lib.dir` must be one of them.  Raises CannotMerge (see module doc).
    """
    data = bytes(data)
    if not data:
        raise CannotMerge(f"{name}: empty cache file")
    if data.startswith(L.CACHEMAGIC_VERSION_NEW):
        try:
            return _merge_new(data, scan_dirs, libs, name)
        except CannotMerge:
            raise
        except LdCacheError as e:  # a corrupt table or string: ldconfig rebuilds it, we cannot
            raise CannotMerge(f"corrupt cache: {e}") from None
        except OverflowError as e:  # a word that does not fit in 32 bits
            raise CannotMerge(f"{name}: corrupt cache: {e}") from None
    try:
        cache = L.parse_cache(data, name)
    except LdCacheError as e:
        raise CannotMerge(f"unknown cache format: {e}") from None
    if cache.fmt != "compat":
        raise CannotMerge(f"{name}: {cache.fmt}-format cache (merge writes the new and compat formats)")
    if cache.endian != "little":
        raise CannotMerge(f"{name}: big-endian cache")
    if any(e.is_hwcaps and e.hwcap_name != e.loader_hwcap_name for e in cache.entries):
        raise CannotMerge(f"{name}: compat cache with glibc-hwcaps entries (glibc misreads their names)")
    entries = cache.entries
    if any(entry_sort_key_cmp(a, b) > 0 for a, b in zip(entries, entries[1:])):
        raise CannotMerge(f"{name}: entries are not in ldconfig's order (the rewrite would reorder them)")
    view = _View(len(entries), lambda i: pathnames.fsencode(entries[i].key), entries.__getitem__)
    inserts, present = _plan_inserts(view, scan_dirs, libs, name)
    if not inserts:
        return MergeResult(data, (), tuple(present), "compat")
    out: list[L.CacheEntry] = []
    prev = 0
    for pos, _rank, entry in inserts:
        out.extend(entries[prev:pos])
        out.append(entry)
        prev = pos
    out.extend(entries[prev:])
    new = serialize_cache(out, cache.generator, "compat")
    return MergeResult(new, tuple(e for _, _, e in inserts), tuple(present), "compat")


def _string_offsets(table: bytes | memoryview) -> list[int]:
    """Every entry's key and value offset (words 1 and 2 of each six-word row of `table`).

    A strided view of the words when this machine is little-endian, as the
    cache is (checked before): no Python int is made for the other four
    words of each row, which in a 5,000-library image is most of the table.
    """
    if sys.byteorder == "little":
        words = memoryview(table).cast("I")
        return words[1::6].tolist() + words[2::6].tolist()
    rows = L.u32_words(table, 0, len(table) // 4)
    return rows[1::6] + rows[2::6]


def _shifted(table: bytes | memoryview, delta: int) -> bytes:
    """`table` with `delta` added to every row's key and value offset, as one big-integer addition.

    The rows are little-endian words; adding `delta` to words 1 and 2 of every
    row is adding the integer whose bytes repeat (0, delta, delta, 0, 0, 0).
    No word overflows (`_check_strings` put every offset inside the file,
    far below 2**32 - delta), so no carry crosses into its neighbour.  It
    replaces unpacking, adding to and packing again ~6 ints per entry.
    """
    step = L.le_words(0, delta, delta, 0, 0, 0) * (len(table) // L.NEW_ENTRY_SIZE)
    total = int.from_bytes(table, "little") + int.from_bytes(step, "little")
    return total.to_bytes(len(table), "little")


def _merge_new(data: bytes, scan_dirs, libs, name: str) -> MergeResult:
    r = L._Reader(data, name)  # the bounds-checked reader ldcache uses
    if len(data) < L.NEW_HEADER_SIZE:
        raise CannotMerge(f"{name}: truncated new-format header")
    if L.header_endian(data[28], name) != "little":  # glibc's header rule; a refused header is a CannotMerge
        raise CannotMerge(f"{name}: not a little-endian cache")
    n, _len_strings = r.u32s(20, 2, "new-format header")
    (ext_off,) = r.u32s(32, 1, "new-format header")
    table_end = L.NEW_HEADER_SIZE + n * L.NEW_ENTRY_SIZE
    if table_end > len(data):
        raise CannotMerge(f"{name}: entry table ({n} entries) runs past the end of the file")
    tail_start = len(data)
    sections: list[list[int]] = []
    hwcaps: tuple[int, ...] | None = None
    if ext_off:
        if ext_off % 4 or ext_off < table_end:
            raise CannotMerge(f"{name}: unexpected extension directory offset {ext_off}")
        magic, count = r.u32s(ext_off, 2, "extension directory")
        if magic != L.EXTENSION_MAGIC:
            raise CannotMerge(f"{name}: bad extension magic {magic:#x}")
        raw = r.u32s(ext_off + 8, 4 * count, "extension directory")
        body_min = ext_off + 8 + 16 * count
        for i in range(count):
            tag, flags, off, size = raw[4 * i:4 * i + 4]
            if tag not in (L.EXT_TAG_GENERATOR, L.EXT_TAG_GLIBC_HWCAPS):
                raise CannotMerge(f"{name}: unknown extension section (tag {tag})")
            if off < body_min or off + size > len(data) or (tag == L.EXT_TAG_GLIBC_HWCAPS and (off % 4 or size % 4)):
                raise CannotMerge(f"{name}: extension section {i} (tag {tag}) is not where ldconfig puts it")
            if tag == L.EXT_TAG_GLIBC_HWCAPS:
                hwcaps = r.u32s(off, size // 4, "glibc-hwcaps section")
            sections.append([tag, flags, off, size])
        tail_start = ext_off

    names: dict[int, str] = {}

    def hwcap_name(hwcap: int) -> str | None:
        if not L.is_hwcap_extension(hwcap) or hwcaps is None:
            return None
        idx = hwcap & 0xFFFFFFFF
        if idx >= len(hwcaps):
            return None
        if idx not in names:
            names[idx] = r.cstring(0, hwcaps[idx], len(data), "glibc-hwcaps name")
        return names[idx]

    cache: dict[int, L.CacheEntry] = {}

    def get(i: int) -> L.CacheEntry:
        e = cache.get(i)
        if e is None:
            flags, key, value, _osv, lo, hi = L.u32_words(data, L.NEW_HEADER_SIZE + i * L.NEW_ENTRY_SIZE, 6)
            flags, hwcap = flags - (1 << 32) if flags >= 1 << 31 else flags, lo | hi << 32
            e = L.CacheEntry(r.cstring(0, key, len(data), f"entry {i} key"),
                             r.cstring(0, value, len(data), f"entry {i} value"), flags, hwcap, hwcap_name(hwcap))
            cache[i] = e
        return e

    def key(i: int) -> bytes:
        e = cache.get(i)
        if e is not None:
            return pathnames.fsencode(e.key)
        at = L.NEW_HEADER_SIZE + i * L.NEW_ENTRY_SIZE + 4
        return r.cbytes(0, int.from_bytes(data[at:at + 4], "little"), len(data), f"entry {i} key")

    inserts, present = _plan_inserts(_View(n, key, get), scan_dirs, libs, name)
    if not inserts:
        return MergeResult(data, (), tuple(present), "new")

    k = len(inserts)
    delta = k * L.NEW_ENTRY_SIZE
    if len(data) + delta >= 1 << 32:  # `_shifted` needs every moved offset to stay a 32-bit word
        raise CannotMerge(f"{name}: too large to grow ({len(data)} bytes)")
    blob = memoryview(data)[table_end:tail_start]  # strings (and any padding) up to the extension directory
    new_table_end = table_end + delta
    new_strings = bytearray()
    offsets: dict[str, int] = {}

    def intern(s: str) -> int:
        off = offsets.get(s)
        if off is None:
            off = offsets[s] = new_table_end + len(blob) + len(new_strings)
            new_strings.extend(pathnames.fsencode(s) + b"\0")
        return off

    table = memoryview(data)[L.NEW_HEADER_SIZE:table_end]
    moved = _moved(table, delta, table_end, tail_start) if sys.byteorder == "little" else None
    if moved is None or data[tail_start - 1] != 0:  # an offset out of place, or strings that may run on
        _check_strings(data, _string_offsets(table) + list(hwcaps or ()), table_end, tail_start, name)
    else:  # every row's strings start in the table, which ends with a NUL: only the section's names are left
        _check_strings(data, list(hwcaps or ()), table_end, tail_start, name)
    # slices of it are joined below without a copy each
    table = memoryview(_shifted(table, delta) if moved is None else moved)
    out_table: list[bytes | memoryview] = []
    prev = 0
    for pos, _rank, e in inserts:
        out_table.append(table[L.NEW_ENTRY_SIZE * prev:L.NEW_ENTRY_SIZE * pos])
        out_table.append(L.le_words(e.flags & 0xFFFFFFFF, intern(e.key), intern(e.value), 0, 0, 0))
        prev = pos
    out_table.append(table[L.NEW_ENTRY_SIZE * prev:])
    strings_end = new_table_end + len(blob) + len(new_strings)
    new_ext = 0
    tail: bytes | bytearray = b""
    if ext_off:
        new_ext = strings_end + (-strings_end) % 4
        move = new_ext - ext_off
        tail = bytearray(data[ext_off:])
        tail[0:8] = L.le_words(L.EXTENSION_MAGIC, len(sections))
        for i, (tag, flags, off, size) in enumerate(sections):
            tail[8 + 16 * i:24 + 16 * i] = L.le_words(tag, flags, off + move, size)
            if tag == L.EXT_TAG_GLIBC_HWCAPS and hwcaps is not None:
                at = off - ext_off
                tail[at:at + 4 * len(hwcaps)] = L.le_words(*(h + delta for h in hwcaps))
    header = bytearray(data[:L.NEW_HEADER_SIZE])
    header[20:28] = L.le_words(n + k, strings_end - new_table_end)
    header[32:36] = L.le_words(new_ext)
    out = b"".join((bytes(header), *out_table, blob, bytes(new_strings),
                    b"\0" * ((new_ext - strings_end) if ext_off else 0), bytes(tail)))
    return MergeResult(out, tuple(e for _, _, e in inserts), tuple(present), "new")


def _moved(table: bytes | memoryview, delta: int, start: int, end: int) -> bytearray | None:
    """`table` with `delta` added to every row's key and value offset; None when one lies outside [start, end).

    On a little-endian machine (the cache's order): each of the two words
    is copied into a 64-bit lane of one integer (a strided memoryview
    copy), so both the bounds check and the addition are a few big-integer
    operations over a third of the table, not a Python int per word: lane
    + (2**32 - start) has bit 32 set exactly when the word is >= start, and
    likewise for `end`; no lane carries into the next.  `end` + `delta`
    < 2**32 (the caller's check), so a word in range moves within its lane.
    """
    n = len(table) // L.NEW_ENTRY_SIZE
    out = bytearray(table)
    words = memoryview(out).cast("I")
    ones = int.from_bytes(b"\1\0\0\0\0\0\0\0" * n, "little")  # 1 in every 64-bit lane
    high = ones << 32  # bit 32 of every lane
    above_start, above_end, step = ((1 << 32) - start) * ones, ((1 << 32) - end) * ones, delta * ones
    lanes = bytearray(8 * n)
    lane_words = memoryview(lanes).cast("I")
    for col in (1, 2):
        lane_words[0::2] = words[col::6]
        w = int.from_bytes(lanes, "little")
        if (w + above_start) & high != high or (w + above_end) & high:
            return None
        words[col::6] = memoryview((w + step).to_bytes(8 * n, "little")).cast("I")[0::2]
    return out


def _check_strings(data: bytes, offsets: list[int], start: int, end: int, name: str) -> None:
    """Every string (keys, values, glibc-hwcaps names) lies in the string table [start, end), NUL-ended.

    ldconfig writes them nowhere else, and only strings there move by the
    same amount when entries are inserted.  One search from the largest
    offset proves every string ends before `end`.
    """
    last = max(offsets, default=0)
    if offsets and (min(offsets) < start or last >= end or data.find(b"\0", last, end) < 0):
        raise CannotMerge(f"{name}: a string lies outside the string table (ldconfig puts none there)")
