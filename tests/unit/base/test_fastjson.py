"""fastjson against its oracle, json.loads: the same values, and json's own errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxis_hook import fastjson

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text())
_values = st.recursive(_scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                        st.dictionaries(st.text(max_size=5), kids, max_size=4)),
                       max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(_values, st.sampled_from([None, 0, 2]), st.booleans(), st.sampled_from(["", " ", "\n\t "]))
def test_same_values_as_json(value, indent, ascii_only, pad):
    text = pad + json.dumps(value, indent=indent, ensure_ascii=ascii_only) + pad
    assert fastjson.loads(text) == json.loads(text)
    assert fastjson.loads(text.encode()) == json.loads(text)


def test_constants_parse_as_json_parses_them():
    got = fastjson.loads('[NaN, Infinity, -Infinity, 1e400, 12345678901234567890]')
    assert math.isnan(got[0]) and got[1:4] == [math.inf, -math.inf, math.inf] and got[4] == 12345678901234567890


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='{}[]":,0123456789.eE+-tfnaulrsx \n\\', max_size=20))
def test_garbage_is_refused_with_jsons_own_error(text):
    try:
        expected = json.loads(text)
    except json.JSONDecodeError as e:
        with pytest.raises(json.JSONDecodeError) as mine:
            fastjson.loads(text)
        assert str(mine.value) == str(e)
        return
    assert fastjson.loads(text) == expected


def test_bad_utf8_is_a_value_error():
    with pytest.raises(ValueError):
        fastjson.loads(b'"\xff"')


def test_keys_are_not_shared_between_documents():
    a = fastjson.loads('{"k": 1}')
    b = fastjson.loads('{"k": 2}')
    assert a == {"k": 1} and b == {"k": 2}


def test_reading_imports_neither_json_nor_re():
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from pyxis_hook import fastjson\n"
            "v = fastjson.loads(b'{\"a\": [1, 2.5, null, true, \"x\"]}')\n"
            "print(v['a'][1], sorted(m for m in ('json', 're') if m in sys.modules))\n")
    import pyxis_hook
    import os

    root = os.path.dirname(os.path.dirname(pyxis_hook.__file__))
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code % root], capture_output=True, text=True, check=True)
    assert r.stdout.split(" ", 1) == ["2.5", "[]\n"]


def test_errors_inside_objects_are_jsons_own_in_a_process_without_json():
    """The C scanner reports an error inside an object through json.decoder: where json was never
    imported (the hook's path) that surfaced as SystemError, and a truncated snapshot was never rebuilt."""
    import os

    import pyxis_hook

    root = os.path.dirname(os.path.dirname(pyxis_hook.__file__))
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from pyxis_hook import fastjson\n"
            "assert 'json' not in sys.modules\n"
            "for doc in ('{\"id\":\"x\" \"pid\":1}', '{\"a\":1,}', '{\"a\":', '[1, {\"b\": [2,', '{\"k\": tru}'):\n"
            "    try:\n"
            "        fastjson.loads(doc)\n"
            "    except ValueError as e:\n"
            "        print(type(e).__name__)\n") % root
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["JSONDecodeError"] * 5
