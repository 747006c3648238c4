"""flattoml against its oracle, tomllib: what it returns, tomllib returns; what it refuses, tomllib decides.

Two generators: documents built from the flat subset (which flattoml must
read, and read as tomllib does) and near-misses assembled from TOML's
tricky pieces (escapes, tables, dotted and quoted keys, numbers, repeated
keys, control characters, unbalanced quotes), where flattoml may refuse
but must never return something tomllib would not.
"""

from __future__ import annotations

import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pyxis_hook.spec import flattoml
from pyxis_hook.spec.config import parse_config, toml_reader

tomllib = toml_reader()  # the stdlib's, or on Python < 3.11 tomli, what the hook itself falls back to

_key = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
_basic = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\\n\r\x7f'
                               + "".join(map(chr, range(0x20))).replace("\t", "")), max_size=12)
_literal = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="'\n\r\x7f"
                                 + "".join(map(chr, range(0x20))).replace("\t", "")), max_size=12)
_ws = st.sampled_from(["", " ", "  ", "\t", " \t "])
_comment = st.one_of(st.just(""), st.builds(lambda w, t: f"{w}#{t}", _ws, _literal))


def _str_token(draw):
    if draw(st.booleans()):
        s = draw(_basic)
        return s, f'"{s}"'
    s = draw(_literal)
    return s, f"'{s}'"


@st.composite
def _flat_docs(draw):
    keys = draw(st.lists(_key, unique=True, max_size=8))
    expected, lines = {}, []
    for k in keys:
        kind = draw(st.sampled_from(["str", "bool", "array"]))
        if kind == "str":
            value, token = _str_token(draw)
        elif kind == "bool":
            value = draw(st.booleans())
            token = "true" if value else "false"
        else:
            items = [_str_token(draw) for _ in range(draw(st.integers(0, 4)))]
            value = [v for v, _ in items]
            sep = draw(st.sampled_from([",", ", ", " , "]))
            trail = draw(st.sampled_from(["", ","])) if items else ""
            token = "[" + draw(_ws) + sep.join(t for _, t in items) + trail + draw(_ws) + "]"
        expected[k] = value
        lines.append(f"{draw(_ws)}{k}{draw(_ws)}={draw(_ws)}{token}{draw(_ws)}{draw(_comment)}")
        if draw(st.booleans()):
            lines.append(draw(st.sampled_from(["", "   ", "# a comment", "\t# x = 'y'"])))
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    return eol.join(lines) + draw(st.sampled_from(["", eol])), expected


@settings(max_examples=400, deadline=None)
@given(_flat_docs())
def test_flat_documents_are_read_as_tomllib_reads_them(doc):
    text, expected = doc
    assert tomllib.loads(text) == expected  # the generator writes valid TOML
    assert flattoml.loads(text) == expected


_pieces = st.sampled_from([
    'a = "x"', "a = 'x'", "b = true", "c = false", 'd = ["x", \'y\']', "e = []",
    '[table]', 'x.y = "z"', '"quoted" = 1', "n = 1", "f = 1.5", "t = 1979-05-27", 'a = "x"',
    's = "esc\\"aped"', 's = "tab\\t"', "m = '''multi'''", 'm = """multi"""', "bad = trueish", "bad = true,",
    'u = "unterminated', "v = 'it''s'", 'w = ["a" "b"]', "x = [,]", "y = [true]", "z = [[\"a\"]]",
    "k = { a = 1 }", 'dup = "1"', 'dup = "2"', "= 'nokey'", "novalue =", "  # comment", "", "\x01", "a\x7f = 'x'",
    'c = "x" # ok', 'c2 = "x" junk', "\ufeffbom = 'x'", "tab\t= 'x'", "key with space = 'x'", "é = 'x'",
    "r = 'x'\r", "lone\rcr = 'x'",
])
#: the pieces above that are flat pyxis.conf lines: flattoml must read a valid document made of them
_IN_SUBSET = frozenset({
    'a = "x"', "a = 'x'", "b = true", "c = false", 'd = ["x", \'y\']', "e = []", 'dup = "1"', 'dup = "2"',
    "  # comment", "", 'c = "x" # ok', "tab\t= 'x'",
})


@settings(max_examples=600, deadline=None)
@given(st.lists(_pieces, max_size=6), st.sampled_from(["\n", "\r\n"]))
@example(['dup = "1"', 'dup = "2"'], "\n")
@example(["b = trueish"], "\n")
@example(['s = "esc\\"aped"'], "\n")
@example(['a = "x"', "  # comment", "e = []", "b = true"], "\n")
def test_anything_else_is_refused_or_read_exactly_as_tomllib(lines, eol):
    text = eol.join(lines)
    mine = flattoml.loads(text)
    try:
        theirs = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        assert mine is None  # invalid TOML is never read: tomllib words the error
        return
    if _IN_SUBSET.issuperset(lines):
        assert mine == theirs  # a document made only of flat lines is read, never refused
    else:
        assert mine is None or mine == theirs


@pytest.mark.skipif(sys.version_info < (3, 11), reason="no tomllib to compare tomli with before Python 3.11")
@settings(max_examples=300, deadline=None)
@given(st.one_of(_flat_docs().map(lambda doc: doc[0]), st.lists(_pieces, max_size=6).map("\n".join)))
def test_tomli_reads_and_refuses_as_tomllib(text):
    """tomli, which reads pyxis.conf on Python < 3.11, against the tomllib it stands in for."""
    tomli = pytest.importorskip("tomli")
    try:
        theirs = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        with pytest.raises(tomli.TOMLDecodeError):
            tomli.loads(text)
        return
    assert tomli.loads(text) == theirs


def test_the_subset_is_what_a_pyxis_conf_looks_like():
    text = (
        "# pyxis.conf\n"
        'driver-root = "/run/nvidia/driver"\n'
        "no-cgroups = true   # Slurm owns the device cgroup\n"
        "default-capabilities = [\"utility\", \"compute\"]\n"
        "log-file = ''\n"
    )
    assert flattoml.loads(text) == {"driver-root": "/run/nvidia/driver", "no-cgroups": True,
                                    "default-capabilities": ["utility", "compute"], "log-file": ""}


def test_parse_config_falls_back_to_tomllib_for_full_toml():
    """A file using TOML beyond the subset (an escape, a multi-line array) is still a valid pyxis.conf."""
    cfg = parse_config(b'driver-root = "/opt/nv\\u0069dia"\npath = [\n  "/usr/bin",\n]\n', "x.conf")
    assert cfg.driver_root == "/opt/nvidia"
    assert cfg.path == ("/usr/bin",)
