"""Whatever the image's cache holds, a cache the merge writes is one glibc reads as intended.

Property (glibc's `ldconfig -p -C` as the oracle): for every input
`ldmerge.merge_cache` accepts, glibc prints the merged file without an
error, and its entries are exactly our reader's entries of the input with
the injected ones inserted.  Inputs are caches in ldconfig's layout (new and
compat formats, glibc-hwcaps entries, 32-bit entries) with bytes patched
anywhere, header bytes (magic, counts, the flags byte's endianness bits, the
extension offset) most often, and cut or extended.  Whatever the merge
declines goes to the confined ldconfig, which rebuilds the cache: only what
the merge accepts must come out right.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pyxis_hook.loader import cachewrite as W
from pyxis_hook.loader import ldcache as L
from pyxis_hook.loader import cacheprint as LP
from pyxis_hook.loader import ldmerge

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
GEN = "ldconfig (Debian GLIBC 2.36-9+deb12u4) stable release version 2.36"

pytestmark = pytest.mark.skipif(not os.path.exists(LDCONFIG), reason="glibc ldconfig not installed")

#: ldconfig's scan order in the modelled image; every entry's directory is one of these
DIRS = ("/usr/local/lib", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib/i386-linux-gnu")
KEYS = ("libcuda.so.1", "libnvidia-ml.so.1", "libz.so.1", "libfoo.so.1", "libc.so.6", "libm.so.6", "libfoo.so.10")
HWCAPS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")


def _entry(key: str, rank: int, flags: int, hwcaps: str | None, isa: int) -> L.CacheEntry:
    d = DIRS[rank]
    if hwcaps is None:
        return L.CacheEntry(key, f"{d}/{key}", flags)
    return L.CacheEntry(key, f"{d}/glibc-hwcaps/{hwcaps}/{key}", flags, L.HWCAP_EXTENSION | (isa << 32),
                        hwcaps, hwcaps)


@st.composite
def image_caches(draw) -> bytes:
    """A cache as ldconfig writes it (entries in directory scan order), then patched."""
    fmt = draw(st.sampled_from(["new", "compat"]))
    rows = draw(st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, len(DIRS) - 1),
                                   st.sampled_from([0x0303, 0x0303, 0x0003, 0x0001]),
                                   st.sampled_from([None, None, None] + ([] if fmt == "compat" else list(HWCAPS))),
                                   st.integers(0, 4)), max_size=10))
    entries = [_entry(*row) for row in sorted(rows, key=lambda r: r[1])]  # scan order among equals
    data = bytearray(W.serialize_cache(entries, GEN, fmt))
    new_at = 0 if fmt == "new" else data.find(L.CACHEMAGIC_VERSION_NEW)
    table = new_at + L.NEW_HEADER_SIZE
    regions = {"flags": (new_at + 28, 1), "header": (new_at, L.NEW_HEADER_SIZE),  # counts, flags, extension offset
               "entries": (table, max(1, L.NEW_ENTRY_SIZE * len(entries))),  # flags, string offsets, hwcap
               "extension": (len(data) - 64, 64),  # directory, sections, glibc-hwcaps names' offsets
               "any": (0, len(data))}
    for region, offset, value in draw(st.lists(st.tuples(st.sampled_from(sorted(regions)), st.integers(0, 1 << 16),
                                                         st.integers(0, 255)), max_size=3)):
        start, size = regions[region]
        data[max(0, start + offset % size) % len(data)] = value
    end = draw(st.sampled_from(["keep", "keep", "cut", "grow"]))
    if end == "cut":
        data = data[:draw(st.integers(0, len(data)))]
    elif end == "grow":
        data += draw(st.binary(min_size=1, max_size=16))
    return bytes(data)


injected = st.lists(st.tuples(st.sampled_from(KEYS[:4]), st.integers(0, len(DIRS) - 1),
                              st.sampled_from([0x0303, 0x0003, 0x0001])), min_size=1, max_size=3)


def ldconfig_p(data: bytes) -> tuple[subprocess.CompletedProcess, str]:
    """glibc's `ldconfig -p -C FILE` of `data`, and the FILE it names."""
    with tempfile.NamedTemporaryFile(prefix="merged-", suffix=".cache") as f:
        f.write(data)
        f.flush()
        return subprocess.run([LDCONFIG, "-p", "-C", f.name], capture_output=True), f.name


def norm(entries) -> list[tuple]:
    """Entries as the loader sees them (a glibc-hwcaps entry by its subdirectory name, not its index)."""
    return [(e.key, e.value, e.flags, e.loader_hwcap_name, e.isa_level if e.is_hwcaps else e.hwcap) for e in entries]


def _patched(fmt: str, rows, at: str, value: int) -> bytes:
    """A small cache with one 32-bit field of its new block set: "flags" (the byte), "key0"/"key1"
    (entry 0's/1's key offset), "hwcaps0" (the first glibc-hwcaps name's offset)."""
    data = bytearray(W.serialize_cache([_entry(*row) for row in rows], GEN, fmt))
    new = data.find(L.CACHEMAGIC_VERSION_NEW)
    if at == "flags":
        data[new + 28] = value
        return bytes(data)
    if at == "hwcaps0":
        ext = new + struct.unpack_from("<I", data, new + 32)[0]
        pos = next(off for tag, _f, off, _size in struct.iter_unpack("<IIII", data[ext + 8:ext + 8 + 32])
                   if tag == L.EXT_TAG_GLIBC_HWCAPS)
    else:
        pos = new + L.NEW_HEADER_SIZE + L.NEW_ENTRY_SIZE * int(at[-1]) + 4
    struct.pack_into("<I", data, pos, value)
    return bytes(data)


ONE = [("libz.so.1", 1, 0x0303, None, 0)]
HW = [("libz.so.1", 1, 0x0303, None, 0), ("libz.so.1", 1, 0x0303, "x86-64-v3", 3)]
TWO = [("libz.so.1", 1, 0x0303, None, 0), ("libfoo.so.1", 1, 0x0303, None, 0)]
CUDA = [("libcuda.so.1", 2, 0x0303)]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=image_caches(), libs=injected)
@example(data=_patched("new", ONE, "flags", 4), libs=CUDA)  # endianness bits unset, flags not 0: refused
@example(data=_patched("new", ONE, "flags", 6), libs=CUDA)  # little endian plus another bit: read
@example(data=_patched("new", ONE, "key0", 0), libs=CUDA)  # a key in the header: does not move with the strings
@example(data=_patched("new", HW, "hwcaps0", 0), libs=CUDA)  # a glibc-hwcaps name in the header, likewise
@example(data=_patched("compat", TWO, "key0", 0), libs=CUDA)  # "glibc-ld.so.cache..." before "libfoo.so.1": unsorted
def test_every_merged_cache_reads_in_glibc_as_ours_plus_the_injected(data, libs):
    libs = [ldmerge.InjectedLib(DIRS[rank], key, key, flags) for key, rank, flags in libs]
    try:
        result = ldmerge.merge_cache(data, DIRS, libs, "/etc/ld.so.cache")
    except ldmerge.CannotMerge:
        return  # the confined ldconfig rebuilds this one
    before = L.parse_cache(data, "input")  # what the merge accepted, our reader reads
    out, shown = ldconfig_p(result.data)
    assert out.returncode == 0, out.stderr.decode()
    after = L.parse_cache(result.data, "output")  # our reader of the output is glibc's, line for line:
    assert out.stdout == os.fsencode(LP.format_ldconfig_p(after, shown))
    assert after.generator == before.generator
    listed, added = norm(after.entries), norm(result.added)
    assert sorted(listed, key=repr) == sorted(norm(before.entries) + added, key=repr)
    for e in added:
        listed.remove(e)
    assert listed == norm(before.entries)  # the image's entries keep their order
