"""The new-format table's offsets, read and moved in bulk, are what a row-by-row unpack and pack give."""

from __future__ import annotations

import struct
import sys

from hypothesis import given, strategies as st

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
