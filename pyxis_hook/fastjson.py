"""`json.loads` through the C scanner alone, without importing `json`.

Why: the hook reads three small JSON documents per container start (the
OCI state, config.json, the node artifact).  `json`'s decoder compiles
regular expressions at import, which brings in `re`, `enum` and
`functools`: imports the start path avoids (docs/decisions/2026-12-07-start-costs.md).
`_json.make_scanner` is the C scanner `json` itself uses; given the attributes a default JSONDecoder has,
it parses exactly what `json.loads` parses.

Errors take the slow path on purpose: a document the scanner refuses is
handed to `json.loads`, so the message (and the exception, a ValueError
subclass) is json's own, word for word.
"""

_WHITESPACE = " \t\n\r"


class _Decoder:
    """The attributes `_json.make_scanner` reads from a JSONDecoder: json.loads's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = float  # 'NaN', 'Infinity', '-Infinity' -> the same floats json's table gives

    def __init__(self) -> None:
        self.memo: dict = {}  # key interning, per document (json clears its own after each call)


def loads(text: "str | bytes"):
    """Parse one JSON document; raises ValueError as json.loads would.

    Bytes must be UTF-8 without a byte-order mark (json.loads would also
    detect UTF-16/32 and skip a BOM): what the OCI runtime, our schemas and
    our node artifacts hold.
    """
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8")  # UnicodeDecodeError is a ValueError too
    try:
        import _json
    except ImportError:  # another implementation: the real thing
        return _slow(text)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _json.make_scanner(_Decoder())(text, start)  # type: ignore[arg-type]  # a decoder's attributes, no json
    except (StopIteration, ValueError, SystemError):
        # SystemError: for an error inside an object the C scanner looks up json.decoder's
        # JSONDecodeError, which is not imported here, and returns no exception at all
        return _slow(text)
    if text[end:].strip(_WHITESPACE):
        return _slow(text)  # "Extra data", in json's words
    return value


def _slow(text: str):
    import json

    return json.loads(text)
