"""The new-format table's offsets, read and moved in bulk, are what a row-by-row unpack and pack give."""

from __future__ import annotations

import struct
import sys

from hypothesis import assume, given, strategies as st

from pyxis_hook.loader import ldmerge

words = st.integers(min_value=0, max_value=(1 << 31) - 1)
rows = st.lists(st.tuples(words, words, words, words, words, words), max_size=40)


def _table(rs) -> bytes:
    return b"".join(struct.pack("<6I", *r) for r in rs)


@given(rows)
def test_string_offsets_are_the_key_and_value_words(rs):
    table = _table(rs)
    want = [r[1] for r in rs] + [r[2] for r in rs]
    assert ldmerge._string_offsets(table) == want


@given(rows)
def test_string_offsets_on_a_big_endian_machine(rs):
    """The struct path a big-endian host takes reads the same (little-endian) words."""
    table = _table(rs)
    saved = sys.byteorder
    try:
        sys.byteorder = "big"  # type: ignore[misc]
        got = ldmerge._string_offsets(table)
    finally:
        sys.byteorder = saved  # type: ignore[misc]
    assert got == [r[1] for r in rs] + [r[2] for r in rs]


@given(rows, st.integers(min_value=0, max_value=1 << 20))
def test_shifted_adds_delta_to_keys_and_values_only(rs, delta):
    """No carry crosses a word: every other word, and every row's order, stays as it was."""
    shifted = ldmerge._shifted(_table(rs), delta)
    want = _table([(a, b + delta, c + delta, d, e, f) for a, b, c, d, e, f in rs])
    assert shifted == want


full_words = st.integers(min_value=0, max_value=(1 << 32) - 1)
bounds = st.integers(min_value=0, max_value=(1 << 31) - 1)


@given(st.lists(st.tuples(full_words, full_words, full_words, full_words, full_words, full_words), max_size=40),
       bounds, bounds, st.integers(min_value=0, max_value=1 << 20))
def test_moved_checks_bounds_and_adds_like_min_max_and_shifted(rs, start, end, delta):
    """None exactly when some key or value word is outside [start, end); else what `_shifted` writes."""
    if sys.byteorder != "little":
        return  # `_moved` is the little-endian machine's path
    table = _table(rs)
    offsets = [r[1] for r in rs] + [r[2] for r in rs]
    inside = all(start <= o < end for o in offsets)
    moved = ldmerge._moved(table, delta, start, end)
    assert (moved is not None) == inside
    if inside:
        assert bytes(moved) == ldmerge._shifted(table, delta)
        assert bytes(moved) == _table([(a, b + delta, c + delta, d, e, f) for a, b, c, d, e, f in rs])


def _cache(*entries) -> bytes:
    from pyxis_hook.loader import cachewrite as W
    from pyxis_hook.loader import ldcache as L

    return W.serialize_cache([L.CacheEntry(*e) for e in entries], "test")


def test_same_directory_other_flags_is_refused_naming_the_injected_file():
    data = _cache(("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", 0x0003),
                  ("libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1", 0x0303))
    lib = ldmerge.InjectedLib("/usr/lib/x86_64-linux-gnu", "libcuda.so.535.1", "libcuda.so.1", 0x0303)
    try:
        ldmerge.merge_cache(data, ("/usr/lib/x86_64-linux-gnu",), (lib,))
    except ldmerge.CannotMerge as e:
        assert str(e) == ("<bytes>: /usr/lib/x86_64-linux-gnu/libcuda.so.1 is listed with flags 0x3, "
                          "the injected libcuda.so.535.1 has 0x303")
    else:
        raise AssertionError("merged")


@given(st.lists(st.sampled_from(["liba.so.1", "libb.so.2", "libcuda.so.1", "libcuda.so.10", "libz.so.1",
                                 "libnvidia-ml.so.1", "lib01.so", "lib1.so"]), max_size=12),
       st.sampled_from(["libcuda.so.1", "libnvidia-ml.so.1", "lib1.so", "libzz.so.3", "liba.so.1"]),
       st.integers(min_value=0, max_value=2))
def test_one_search_places_as_a_full_sort_would(keys, soname, where):
    """The key search plus the run's scan puts the entry where ldconfig's sort (stable: scan order) puts it."""
    from pyxis_hook.loader import cachewrite as W
    from pyxis_hook.loader import ldcache as L

    dirs = ("/a", "/b", "/c")
    entries = [L.CacheEntry(k, f"{dirs[i % 3]}/{k}", 0x0303) for i, k in enumerate(keys)]
    entries = list(W.sort_entries(sorted(entries, key=lambda e: dirs.index(e.value.rpartition("/")[0]))))
    data = W.serialize_cache(entries, "test")
    lib = ldmerge.InjectedLib(dirs[where], soname, soname, 0x0303)
    try:
        got = L.parse_cache(ldmerge.merge_cache(data, dirs, (lib,)).data).entries
    except ldmerge.CannotMerge:
        return  # an equal run out of scan order (lib01.so, lib1.so): refused, not guessed
    new = L.CacheEntry(soname, f"{dirs[where]}/{soname}", 0x0303)
    # two names libcmp cannot tell apart in one directory: ldconfig's order is its readdir order there
    assume(not any(L.libcmp(e.key, soname) == 0 and e.value != new.value and e.value.startswith(dirs[where] + "/")
                   for e in entries))
    want = entries if new in entries else list(W.sort_entries(
        sorted([*entries, new], key=lambda e: dirs.index(e.value.rpartition("/")[0]))))
    assert list(got) == want
