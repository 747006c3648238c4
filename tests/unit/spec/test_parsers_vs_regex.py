"""The hook path's plain-string parsers against the regular expressions they replaced.

`re` and the `enum` it imports cost ~5 ms per container start, so the
parsers on the hook's path are string code.  Each is checked here, on
generated strings, against the pattern it replaced, matched with
`re.fullmatch` (the old `^...$` also let a trailing newline through; the
string code refuses it, which the tests state once explicitly).
"""

from __future__ import annotations

import fnmatch
import re

from hypothesis import example, given, settings
from hypothesis import strategies as st

from pyxis_hook.apply import procview
from pyxis_hook.host import cgroup, gpufiles, gpus
from pyxis_hook.loader import ldconf
from pyxis_hook.spec import allocation, devicelist, require

HEXISH = "0123456789abcdefABCDEFgG:.-x/ \n"
DIGITISH = "0123456789.:,-x \n\u0663"  # U+0663 ARABIC-INDIC DIGIT THREE: \d matches it, [0-9] does not


def _hexish(max_size=20):
    return st.text(alphabet=HEXISH, max_size=max_size)


def _digitish(max_size=14):
    return st.text(alphabet=DIGITISH, max_size=max_size)


@settings(max_examples=600, deadline=None)
@given(st.one_of(_hexish(), st.builds(lambda d, b, v, f: f"{d}:{b}:{v}.{f}", _hexish(9), _hexish(3), _hexish(3),
                                      st.sampled_from("0178a"))))
@example("0000:06:00.0")
@example("00000000:06:00.0")
@example("06:00.0")
@example(" 0000:06:1f.7 ")
def test_parse_bus_id(text):
    m = re.fullmatch(r"(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])", text.strip())
    want = None
    if m and int(m.group(3), 16) <= 0x1F:
        want = (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))
    assert gpus.parse_bus_id(text) == want


_VERSION_RE = r"Kernel Module(?:\s+for\s+\S+)?\s+(\d+\.\d+(?:\.\d+)*)\b"


@st.composite
def _nvrm_lines(draw):
    ws = st.sampled_from([" ", "  ", "\t", " \t "])
    version = draw(st.one_of(
        st.builds(lambda a, b, c: f"{a}.{b}" + (f".{c}" if c else ""), st.integers(0, 999), st.integers(0, 999),
                  st.one_of(st.none(), st.integers(0, 99).map(lambda n: f"{n:02d}"))),
        st.sampled_from(["535", "abc", "535.", "x.1", "\u0663.1"])))
    arch = draw(st.sampled_from(["x86_64", "aarch64", "ppc64le"]))
    module = draw(st.sampled_from([f"Kernel Module{draw(ws)}for{draw(ws)}{arch}", "Kernel Module",
                                   "Kernel Module for", "KernelModule"]))
    return (f"NVRM version: NVIDIA UNIX {draw(st.sampled_from(['', 'Open ', f'{arch} ']))}{module}{draw(ws)}"
            f"{version}{draw(st.sampled_from(['', '  Release Build  (dvs-builder@U16)  Sat Aug 19 2023', '  Wed']))}")


@settings(max_examples=500, deadline=None)
@given(_nvrm_lines())
@example("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023")
@example("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  535.104.05  Release Build  (dvs-builder@U16-T02)")
@example("NVRM version: NVIDIA UNIX Kernel Module for aarch64  550.54.15  Tue Mar  5 22:15:33 UTC 2024")
def test_parse_driver_version_on_nvrm_lines(line):
    m = re.search(_VERSION_RE, line)
    assert gpufiles.parse_driver_version(line + "\nGCC version: gcc 12\n") == (m.group(1) if m else None)


def test_parse_driver_version_takes_whole_words_only():
    """The regex would cut `535.104.05abc` to `535.104`; the word is no version, so nothing is read."""
    assert re.search(_VERSION_RE, "NVRM version: Kernel Module  535.104.05abc").group(1) == "535.104"
    assert gpufiles.parse_driver_version("NVRM version: Kernel Module  535.104.05abc") is None


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["gi", "ci", "channel"]), st.text(alphabet="gichanel0123456789\u0663x ", max_size=10))
def test_numbered_names(prefix, name):
    m = re.fullmatch(prefix + r"(\d+)", name)
    assert gpufiles.numbered(name, prefix) == (int(m.group(1)) if m else None)


@settings(max_examples=500, deadline=None)
@given(_digitish())
@example("123456789")
@example("1234567890")
@example("0")
def test_request_token_shapes(tok):
    assert allocation.is_index(tok) == bool(re.fullmatch(r"[0-9]{1,9}", tok))
    m = re.fullmatch(r"([0-9]{1,9}):([0-9]{1,9})", tok)
    assert devicelist.gpu_mig(tok) == ((int(m.group(1)), int(m.group(2))) if m else None)


@settings(max_examples=500, deadline=None)
@given(st.one_of(_hexish(), st.builds(lambda d, b, v, f: f"{d}:{b}:{v}.{f}", _hexish(9), _hexish(3), _hexish(3),
                                      st.sampled_from("0179"))))
@example("0000:06:00.0")
@example("00000000:06:1f.7")
def test_full_pci_ids(tok):
    """gpus.is_full_bus_id: a GPU token that is a PCI id (request), a /proc GPU dir name in a plan (apply)."""
    m = re.fullmatch(r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{1,2}:([0-9a-fA-F]{1,2})\.[0-7]", tok)
    # the regex let a device above 0x1f through to "unknown device"; the string code says "not a PCI id"
    # and the token ends as the same "unknown device" error (tests/test_request.py)
    assert gpus.is_full_bus_id(tok) == bool(m and int(m.group(1), 16) <= 0x1F)


@settings(max_examples=500, deadline=None)
@given(_digitish())
@example("12.2")
@example("535.104.05")
@example("1234567890")
@example("12..2")
def test_dotted_numbers(value):
    assert require.is_dotted_number(value) == bool(re.fullmatch(r"[0-9]{1,9}(\.[0-9]{1,9})*", value))


def test_a_trailing_newline_is_refused_now():
    assert re.match(r"^[0-9]{1,9}(\.[0-9]{1,9})*$", "12.2\n")  # the old check let it through
    assert not require.is_dotted_number("12.2\n")
    assert not allocation.is_index("0\n")


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="cudarv<>=!12. ", max_size=14))
def test_operator_span(text):
    m = re.search(r"[<>=!]+", text)
    assert require._operator_span(text) == (m.span() if m else None)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="abcXYZ019_.+-/ \n:\u00e9", max_size=10))
@example("params")
def test_apply_plan_file_names(name):
    ok = bool(name) and procview._NAME_CHARS.issuperset(name)
    assert ok == bool(re.fullmatch(r"[A-Za-z0-9_.+-]+", name))


@settings(max_examples=1500, deadline=None)
@given(st.text(alphabet="ab.c*?", max_size=8), st.text(alphabet="ab.c*?", max_size=10))
@example("*.conf", "x86_64-linux-gnu.conf")
@example("*.conf", ".hidden.conf")
@example("a*b*c", "aXbYbc")
@example("**", "")
def test_name_matches_is_fnmatchcase(pattern, name):
    assert ldconf.name_matches(name, pattern) == fnmatch.fnmatchcase(name, pattern)


def test_bracket_patterns_go_to_fnmatch():
    assert ldconf.name_matches("b.conf", "[a-c].conf") and not ldconf.name_matches("d.conf", "[a-c].conf")
    assert ldconf.name_matches("x.conf", "[!a-c].conf")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="/ab\\0124789", max_size=16))
@example("/mnt/with\\040space")
def test_mountinfo_unescape(field):
    assert cgroup._unescape(field) == re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)
