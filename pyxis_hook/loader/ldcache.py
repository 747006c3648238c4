"""glibc's ld.so.cache: its layout, flags and key order, and the reader (writing it: `cachewrite`).

ld.so's lookup in it is `cachelookup`, `ldconfig -p`'s text `cacheprint`.
The per-container hook reads the driver root's cache to find the driver
libraries and (for `ldcache = "merge"`) a container's cache, so this
module is built-ins only (`posix`, `sys`; no `struct`, whose extension module is
a dlopen on every start) and cheap to import: words are read with
`memoryview.cast` or `int.from_bytes` and written with `int.to_bytes`.
Every offset in the file is bounds-checked: a corrupt or truncated cache
raises `LdCacheError` naming the file and what is wrong, never IndexError.

Layouts follow glibc's `sysdeps/generic/dl-cache.h` and `elf/cache.c`
(docs/loader.md, "The ld.so.cache file"):

* old format ``ld.so-1.7.0``: 16-byte header, 12-byte entries, string offsets
  relative to the end of the entry array;
* new format ``glibc-ld.so.cache1.1``: 48-byte header, 24-byte entries with a
  64-bit hwcap field, string offsets relative to the new header, and an
  extension directory (tag 0 generator string, tag 1 glibc-hwcaps names);
* compat: an old table (entry count rounded up to even) followed, 8-aligned,
  by a complete new block.  Loaders and `ldconfig -p` use the new block.

The keys' order, `libcmp` (`_dl_cache_libcmp`, elf/dl-cache.c), is part of
the format: the file is searched by it (`cachelookup`, `ldmerge`, the image's
compat dir in `plan.compat`) as well as sorted by it (`cachewrite`).

Known glibc quirk reproduced on purpose: the glibc-hwcaps name indices are
offsets from the *new header*, but ldconfig -p and ld.so add them to the
*file start*.  In a compat cache that yields garbage names (docs/loader.md), so
`CacheEntry` carries both the intended name (`hwcap_name`) and the name glibc
actually sees (`loader_hwcap_name`).
"""

from __future__ import annotations

import posix
import sys

from pyxis_hook import pathnames
from pyxis_hook.errors import LdCacheError
from pyxis_hook.record import record

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing is never imported at run time
    from typing import Iterable

# --- flags (sysdeps/generic/ldconfig.h) -------------------------------------

FLAG_TYPE_MASK = 0x00FF
FLAG_ELF = 0x0001
FLAG_ELF_LIBC5 = 0x0002
FLAG_ELF_LIBC6 = 0x0003
FLAG_REQUIRED_MASK = 0xFF00
FLAG_SPARC_LIB64 = 0x0100
FLAG_IA64_LIB64 = 0x0200
FLAG_X8664_LIB64 = 0x0300
FLAG_S390_LIB64 = 0x0400
FLAG_POWERPC_LIB64 = 0x0500
FLAG_MIPS64_LIBN32 = 0x0600
FLAG_MIPS64_LIBN64 = 0x0700
FLAG_X8664_LIBX32 = 0x0800
FLAG_ARM_LIBHF = 0x0900
FLAG_AARCH64_LIB64 = 0x0A00
FLAG_ARM_LIBSF = 0x0B00
FLAG_MIPS_LIB32_NAN2008 = 0x0C00
FLAG_MIPS64_LIBN32_NAN2008 = 0x0D00
FLAG_MIPS64_LIBN64_NAN2008 = 0x0E00
FLAG_RISCV_FLOAT_ABI_SOFT = 0x0F00
FLAG_RISCV_FLOAT_ABI_DOUBLE = 0x1000
FLAG_LARCH_FLOAT_ABI_SOFT = 0x1100
FLAG_LARCH_FLOAT_ABI_DOUBLE = 0x1200

#: The complete entry flags a 64-bit loader accepts (`_DL_CACHE_DEFAULT_ID`).
FLAG_X8664_LIB64_LIBC6 = FLAG_X8664_LIB64 | FLAG_ELF_LIBC6  # 0x0303


def written_flags(elfclass: int | None, needed: Iterable[str] = (), machine: str | None = None) -> int:
    """The flags glibc 2.36's ldconfig writes for an ELF library (readelflib.c process_elf_file).

    64-bit: always libc6 with the machine's ABI byte (0x0303 on x86-64).
    32-bit: libc6 (3) when it needs libc.so.6/libm.so.6, libc5 (2) for the .5
    ones, else plain ELF (1) — measured: a 32-bit library without DT_NEEDED
    prints as "(ELF)".  The i386 loader accepts 1 and 3 (`cachelookup.accepted_flags`).
    """
    from pyxis_hook.loader.machines import abi_byte

    if elfclass == 64:
        return abi_byte(machine or posix.uname().machine) | FLAG_ELF_LIBC6
    needed = set(needed)
    if needed & {"libc.so.6", "libm.so.6"}:
        return FLAG_ELF_LIBC6
    if needed & {"libc.so.5", "libm.so.5"}:
        return FLAG_ELF_LIBC5
    return FLAG_ELF


# --- file layout (sysdeps/generic/dl-cache.h) --------------------------------

CACHEMAGIC = b"ld.so-1.7.0"
CACHEMAGIC_NEW = b"glibc-ld.so.cache"
CACHE_VERSION = b"1.1"
CACHEMAGIC_VERSION_NEW = CACHEMAGIC_NEW + CACHE_VERSION
OLD_HEADER_SIZE = 16
OLD_ENTRY_SIZE = 12
NEW_HEADER_SIZE = 48
NEW_ENTRY_SIZE = 24
CACHE_ALIGN = 8  # __alignof__ (struct cache_file_new) on 64-bit hosts
EXTENSION_MAGIC = 0xEAA42174  # (uint32_t) -358342284
EXT_TAG_GENERATOR = 0
EXT_TAG_GLIBC_HWCAPS = 1
HWCAP_EXTENSION = 1 << 62
HWCAP_ISA_LEVEL_MASK = 0x3FF
ENDIAN_UNSET, ENDIAN_INVALID, ENDIAN_LITTLE, ENDIAN_BIG = 0, 1, 2, 3

FORMATS = ("new", "compat", "old")


@record
class CacheEntry:
    """One cache record.

    `key` is the SONAME the loader looks up, `value` the path it opens.
    `hwcap_name` is the glibc-hwcaps subdirectory the entry belongs to (None
    for plain entries); `loader_hwcap_name` is the string glibc's ld.so and
    `ldconfig -p` actually read for it (differs only in compat caches, see
    the module docstring; None when the index is out of range).
    """

    key: str
    value: str
    flags: int
    hwcap: int = 0
    hwcap_name: str | None = None
    loader_hwcap_name: str | None = None

    @property
    def is_hwcaps(self) -> bool:
        """True for a glibc-hwcaps extension entry (dl_cache_hwcap_extension)."""
        return is_hwcap_extension(self.hwcap)

    @property
    def isa_level(self) -> int:
        return (self.hwcap >> 32) & HWCAP_ISA_LEVEL_MASK


@record
class LdCache:
    """A parsed cache: entries in file order, the generator string, the format.

    `fmt` is "new", "compat", "old" or "empty" (a zero-length file, which
    `ldconfig -p` prints as nothing).  For "compat" the entries are the new
    block's; `old_entries` holds the old table (also the entries for "old").
    """

    entries: tuple[CacheEntry, ...]
    generator: str | None
    fmt: str
    name: str = "<bytes>"
    endian: str = "little"
    old_entries: tuple[CacheEntry, ...] = ()


def is_hwcap_extension(hwcap: int) -> bool:
    return ((hwcap >> 32) & ~HWCAP_ISA_LEVEL_MASK) == (HWCAP_EXTENSION >> 32)


# --- words -------------------------------------------------------------------


def u32_words(data: bytes | memoryview, offset: int, count: int, order: str = "little") -> list[int]:
    """`count` unsigned 32-bit words of `data` from `offset` in byte order `order` (the caller checked the bounds).

    One cast of the bytes when the order is this machine's; a big-endian
    cache on a little-endian machine (inspected, never merged) a word at a time.
    """
    view = memoryview(data)[offset:offset + 4 * count]
    if order == sys.byteorder:
        return view.cast("I").tolist()
    big = order == "big"
    return [int.from_bytes(view[i:i + 4], "big" if big else "little") for i in range(0, 4 * count, 4)]


def le_words(*words: int) -> bytes:
    """Unsigned 32-bit little-endian words, as `struct.pack("<nI")` (OverflowError outside 0..2**32-1)."""
    return b"".join(w.to_bytes(4, "little") for w in words)


# --- reading -----------------------------------------------------------------


class _Reader:
    """Bounds-checked access to the cache bytes; every failure names the file."""

    def __init__(self, data: bytes, name: str) -> None:
        self.data = data
        self.name = name
        self.bo = "<"

    def fail(self, what: str) -> LdCacheError:
        return LdCacheError(f"{self.name}: {what}")

    def u32s(self, offset: int, count: int, what: str) -> tuple[int, ...]:
        end = offset + 4 * count
        if offset < 0 or end > len(self.data):
            raise self.fail(f"truncated {what} at offset {offset} (file is {len(self.data)} bytes)")
        return tuple(u32_words(self.data, offset, count, "big" if self.bo == ">" else "little"))

    def cstring(self, base: int, offset: int, limit: int, what: str) -> str:
        return pathnames.fsdecode(self.cbytes(base, offset, limit, what))

    def cbytes(self, base: int, offset: int, limit: int, what: str) -> bytes:
        """`cstring`'s bytes, not decoded (what `libcmp` compares)."""
        start = base + offset
        if offset < 0 or start >= limit:
            raise self.fail(f"{what} string offset {offset} is outside the string table")
        end = self.data.find(b"\0", start, limit)
        if end < 0:
            raise self.fail(f"{what} string at offset {offset} is not NUL-terminated")
        return self.data[start:end]

    def cstring_loose(self, offset: int) -> str | None:
        """A string the way glibc reads hwcaps names: from the file start, up to NUL or EOF."""
        if offset >= len(self.data):
            return None
        end = self.data.find(b"\0", offset)
        return pathnames.fsdecode(self.data[offset:] if end < 0 else self.data[offset:end])


def _parse_old(r: _Reader, nlibs: int) -> tuple[CacheEntry, ...]:
    strings = OLD_HEADER_SIZE + nlibs * OLD_ENTRY_SIZE
    raw = r.u32s(OLD_HEADER_SIZE, 3 * nlibs, "old-format entry table")
    out = []
    for i in range(nlibs):
        flags, key, value = raw[3 * i:3 * i + 3]
        flags = flags - (1 << 32) if flags >= 1 << 31 else flags
        out.append(CacheEntry(r.cstring(strings, key, len(r.data), f"entry {i} key"),
                              r.cstring(strings, value, len(r.data), f"entry {i} value"), flags))
    return tuple(out)


def _parse_extensions(r: _Reader, ext_off: int) -> tuple[str | None, tuple[int, ...] | None]:
    """Return (generator, hwcaps string indices) following cache_extension_load."""
    if ext_off == 0:
        return None, None
    if ext_off % 4:
        raise r.fail(f"malformed extension data: directory offset {ext_off} is not 4-aligned")
    magic, count = r.u32s(ext_off, 2, "extension directory")
    if magic != EXTENSION_MAGIC:
        raise r.fail(f"malformed extension data: bad magic {magic:#x} at offset {ext_off}")
    if ext_off + 8 + 16 * count > len(r.data):
        raise r.fail(f"malformed extension data: {count} sections run past the end of the file")
    sections: dict[int, tuple[int, int]] = {}
    raw = r.u32s(ext_off + 8, 4 * count, "extension directory")
    for i in range(count):
        tag, _flags, off, size = raw[4 * i:4 * i + 4]
        if off + size > len(r.data):
            raise r.fail(f"malformed extension data: section {i} (tag {tag}) runs past the end of the file")
        if tag <= EXT_TAG_GLIBC_HWCAPS:
            sections[tag] = (off, size)
    generator = None
    if EXT_TAG_GENERATOR in sections:
        off, size = sections[EXT_TAG_GENERATOR]
        generator = pathnames.fsdecode(r.data[off:off + size])
    hwcaps = None
    if EXT_TAG_GLIBC_HWCAPS in sections:
        off, size = sections[EXT_TAG_GLIBC_HWCAPS]
        # cache_extension_verify: an empty or misaligned section counts as absent
        if size and off % 4 == 0 and size % 4 == 0:
            hwcaps = r.u32s(off, size // 4, "glibc-hwcaps section")
    return generator, hwcaps


def header_endian(flags: int, name: str = "<bytes>") -> str:
    """The byte order the new header's flags byte names: "little" or "big"; LdCacheError where glibc refuses.

    glibc (sysdeps/generic/dl-cache.h, cache_file_new_matches_endian) reads
    a cache whose flags byte is 0 (written before the byte existed) or whose
    endianness bits are its own; both ld.so and `ldconfig -p` refuse any
    other ("Cache file has wrong endianness").  A big-endian cache is read
    here all the same, for inspection; a non-zero byte with the bits unset,
    or the bits set to "invalid", is read by no glibc at all.
    """
    bits = flags & 3
    if bits == ENDIAN_BIG:
        return "big"
    if bits == ENDIAN_LITTLE or flags == 0:
        return "little"
    if bits == ENDIAN_INVALID:
        raise LdCacheError(f"{name}: cache is marked as having invalid endianness")
    raise LdCacheError(f"{name}: header flags {flags:#04x} name no byte order (glibc reads such a cache nowhere)")


def _parse_new(r: _Reader, base: int) -> tuple[tuple[CacheEntry, ...], str | None, str]:
    data = r.data
    if len(data) < base + NEW_HEADER_SIZE:
        raise r.fail("truncated new-format header")
    endian = header_endian(data[base + 28], r.name)
    if endian == "big":
        r.bo = ">"
    nlibs, _len_strings = r.u32s(base + 20, 2, "new-format header")
    (ext_off,) = r.u32s(base + 32, 1, "new-format header")
    if (len(data) - base - NEW_HEADER_SIZE) // NEW_ENTRY_SIZE < nlibs:
        raise r.fail(f"new-format entry table ({nlibs} entries) runs past the end of the file")
    generator, hwcaps = _parse_extensions(r, ext_off)
    # each entry: flags (int32), key, value, osversion, hwcap (uint64: two words, in the file's order)
    order = "big" if r.bo == ">" else "little"
    words = u32_words(data, base + NEW_HEADER_SIZE, 6 * nlibs, order)
    lo, hi = (4, 5) if order == "little" else (5, 4)
    out = []
    for i in range(nlibs):
        flags, key, value, _osv = words[6 * i:6 * i + 4]
        flags = flags - (1 << 32) if flags >= 1 << 31 else flags
        hwcap = words[6 * i + lo] | words[6 * i + hi] << 32
        name = loader_name = None
        if is_hwcap_extension(hwcap) and hwcaps is not None:
            index = hwcap & 0xFFFFFFFF
            if index < len(hwcaps):
                if hwcaps[index] < len(data) - base:
                    name = r.cstring(base, hwcaps[index], len(data), f"entry {i} glibc-hwcaps name")
                loader_name = r.cstring_loose(hwcaps[index])
        out.append(CacheEntry(r.cstring(base, key, len(data), f"entry {i} key"),
                              r.cstring(base, value, len(data), f"entry {i} value"),
                              flags, hwcap, name, loader_name))
    return tuple(out), generator, endian


def parse_cache(data: bytes, name: str = "<bytes>") -> LdCache:
    """Parse ld.so.cache bytes (any of glibc's three formats).

    Raises LdCacheError naming `name` for anything that is not a well-formed
    cache.  Following `ldconfig -p`, an empty file is an empty cache.
    """
    data = bytes(data)
    if not data:
        return LdCache((), None, "empty", name)
    r = _Reader(data, name)
    if data.startswith(CACHEMAGIC_VERSION_NEW):
        entries, generator, endian = _parse_new(r, 0)
        return LdCache(entries, generator, "new", name, endian)
    if not data.startswith(CACHEMAGIC):
        raise r.fail("not an ld.so.cache file (bad magic)")
    if len(data) < OLD_HEADER_SIZE:
        raise r.fail("truncated old-format header")
    (nlibs,) = r.u32s(12, 1, "old-format header")
    offset = -(-(OLD_HEADER_SIZE + nlibs * OLD_ENTRY_SIZE) // CACHE_ALIGN) * CACHE_ALIGN
    if (len(data) - OLD_HEADER_SIZE) // OLD_ENTRY_SIZE < nlibs:
        # maybe a big-endian compat cache: the count is in the new block's order
        nlibs_be = int.from_bytes(data[12:16], "big")
        if (len(data) - OLD_HEADER_SIZE) // OLD_ENTRY_SIZE < nlibs_be:
            raise r.fail(f"old-format entry table ({nlibs} entries) runs past the end of the file")
        nlibs, r.bo = nlibs_be, ">"
        offset = -(-(OLD_HEADER_SIZE + nlibs * OLD_ENTRY_SIZE) // CACHE_ALIGN) * CACHE_ALIGN
    if len(data) > offset + NEW_HEADER_SIZE and data.startswith(CACHEMAGIC_VERSION_NEW, offset):
        old_bo = r.bo
        entries, generator, endian = _parse_new(r, offset)
        r.bo = old_bo
        try:  # glibc never reads this table of a compat cache; a bogus one is not fatal
            old = _parse_old(r, nlibs)
        except LdCacheError:
            old = ()
        return LdCache(entries, generator, "compat", name, endian, old)
    old = _parse_old(r, nlibs)
    return LdCache(old, None, "old", name, "big" if r.bo == ">" else "little", old)


#: larger than any real ld.so.cache (10,000 libraries: ~1 MB): a cap on what a hostile path can cost
CACHE_LIMIT = 64 << 20


def read_cache(path: str) -> LdCache:
    """Read and parse the cache file at host path `path` (a regular file only, at most CACHE_LIMIT)."""
    from pyxis_hook.rootfs import read_regular_path

    try:
        data = read_regular_path(path, CACHE_LIMIT)
    except OSError as e:
        raise LdCacheError(f"{path}: {e.strerror}") from None
    return parse_cache(data, path)


# --- _dl_cache_libcmp: the cache's order -------------------------------------------


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def libcmp(a: str | bytes, b: str | bytes) -> int:
    """glibc's `_dl_cache_libcmp`: digit runs compare numerically and rank above non-digits.

    The cache is sorted (descending) and binary-searched with this order, so
    anything that writes or searches a cache must use it, not strcmp.  C
    details kept: `char` is signed (bytes >= 0x80 are negative) and the
    digit accumulator is a wrapping 32-bit int.

    Most comparisons are settled by the first byte the names differ in,
    found with one XOR of the two as integers: when that byte is not inside
    a digit run (the byte before it is no digit) the walk up to it would
    have met only equal bytes and equal runs.  Anything else is walked as
    glibc walks it (`_libcmp_walk`).
    """
    p1 = pathnames.fsencode(a)
    p2 = pathnames.fsencode(b)
    if p1 == p2:
        return 0
    n = min(len(p1), len(p2))
    x = int.from_bytes(p1[:n], "big") ^ int.from_bytes(p2[:n], "big")
    i = n - 1 - (x.bit_length() - 1) // 8 if x else n  # the first byte that differs, or the shorter's end
    if (i and 48 <= p1[i - 1] <= 57) or b"\0" in p1 or b"\0" in p2:
        return _libcmp_walk(p1, p2)
    c1 = p1[i] if i < len(p1) else 0
    c2 = p2[i] if i < len(p2) else 0
    if c1 == 0:
        return -_schar(c2)  # `a` ended: glibc's loop stops there, whatever `b` holds
    d1, d2 = 48 <= c1 <= 57, 48 <= c2 <= 57
    if d1 and d2:
        return _libcmp_walk(p1, p2)  # two runs starting here: their values (leading zeros: equal ones) decide
    if d1:
        return 1
    if d2:
        return -1
    return _schar(c1) - _schar(c2)


def _libcmp_walk(a: bytes, b: bytes) -> int:
    """`_dl_cache_libcmp` byte by byte, as glibc's loop runs."""
    p1 = a + b"\0"
    p2 = b + b"\0"
    i = j = 0
    while p1[i] != 0:
        c1, c2 = p1[i], p2[j]
        if 48 <= c1 <= 57:
            if 48 <= c2 <= 57:
                v1 = v2 = 0
                while 48 <= p1[i] <= 57:
                    v1 = _int32(v1 * 10 + p1[i] - 48)
                    i += 1
                while 48 <= p2[j] <= 57:
                    v2 = _int32(v2 * 10 + p2[j] - 48)
                    j += 1
                if v1 != v2:
                    return _int32(v1 - v2)
            else:
                return 1
        elif 48 <= c2 <= 57:
            return -1
        elif c1 != c2:
            return _schar(c1) - _schar(c2)
        else:
            i += 1
            j += 1
    return _schar(p1[i]) - _schar(p2[j])


def _schar(c: int) -> int:
    return c - 256 if c >= 128 else c
