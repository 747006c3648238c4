"""The flat TOML a pyxis.conf is written in, read without importing tomllib.

Why: the hook reads pyxis.conf on every container start, and `tomllib`
imports `re`, `typing` and `datetime` and compiles its regular expressions,
all of which the start path otherwise avoids (docs/decisions/2026-12-07-start-costs.md).
A pyxis.conf is a list of `key = value` lines with strings, booleans and
one-line string arrays, which this module reads without any of them.

It is never a second opinion: `loads` returns None for anything outside
that subset (tables, dotted or quoted keys, escapes, multi-line values,
numbers, dates, repeated keys, stray control characters...) and the caller
then asks tomllib, which decides, and words any syntax error.  Whatever
`loads` does return equals what tomllib returns for the same text
(tests/unit/spec/test_flattoml.py checks that on generated documents).
"""

from __future__ import annotations

_BARE_KEY = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
#: control characters TOML allows nowhere outside multi-line strings except tab (and LF as the line end)
_CONTROL = frozenset(chr(c) for c in (*range(0x09), *range(0x0A, 0x20), 0x7F))
_WS = " \t"


def loads(text: str) -> dict | None:
    """The document as tomllib would return it, or None when it is not flat TOML of the kinds above."""
    lines = text.split("\n")
    out: dict = {}
    for i, line in enumerate(lines):
        if line.endswith("\r") and i < len(lines) - 1:  # CRLF; a CR anywhere else is refused below
            line = line[:-1]
        if _CONTROL.intersection(line):
            return None
        parsed = _line(line)
        if parsed is None:
            return None
        if parsed is _BLANK:
            continue
        key, value = parsed
        if key in out:
            return None
        out[key] = value
    return out


_BLANK = object()


def _line(line: str):
    rest = line.lstrip(_WS)
    if not rest or rest.startswith("#"):
        return _BLANK
    key, eq, rest = rest.partition("=")
    key = key.rstrip(_WS)
    if not eq or not key or not _BARE_KEY.issuperset(key):
        return None
    value, rest = _value(rest.lstrip(_WS))
    if value is None:
        return None
    rest = rest.lstrip(_WS)
    if rest and not rest.startswith("#"):
        return None
    return key, value


def _value(text: str):
    """(value, rest of the line) or (None, "")."""
    if text.startswith("true") and not _continues(text, 4):
        return True, text[4:]
    if text.startswith("false") and not _continues(text, 5):
        return False, text[5:]
    if text.startswith("["):
        return _array(text[1:])
    return _string(text)


def _continues(text: str, n: int) -> bool:
    """True when the word at the start runs on past `n` characters (`trueish` is not `true`)."""
    return len(text) > n and text[n] not in " \t#,]"


def _string(text: str):
    if not text or text[0] not in "\"'":
        return None, ""
    quote = text[0]
    if text.startswith(quote * 3):  # multi-line strings: tomllib's job
        return None, ""
    end = text.find(quote, 1)
    if end < 0:
        return None, ""
    body = text[1:end]
    if quote == '"' and "\\" in body:  # escapes: tomllib's job
        return None, ""
    return body, text[end + 1:]


def _array(text: str):
    items: list = []
    rest = text.lstrip(_WS)
    while True:
        if rest.startswith("]"):
            return items, rest[1:]
        item, rest = _string(rest)
        if item is None:
            return None, ""
        items.append(item)
        rest = rest.lstrip(_WS)
        if rest.startswith(","):
            rest = rest[1:].lstrip(_WS)
        elif not rest.startswith("]"):
            return None, ""
