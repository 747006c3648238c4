"""pyxis.conf's values checked against `schemas/pyxis-conf.schema.json` with jsonschema, in one line.

`problem(data)` returns None when the parsed TOML document `data` is valid,
else one line naming the first bad key in the file's order: an unknown key
(with the known ones), or the key (`key 'path[1]'` for a list's item), the
value and what the schema allows.  `schema_file()` is the file checked
against, with its stat signature when it was read (the node artifact
records it with pyxis.conf's verdict, `spec.config`).  ConfigError when the
schema file cannot be read (an incomplete installation).

Imports jsonschema and reads the schema file: a start reaches this module
only when the node artifact records no verdict for its pyxis.conf (a
changed file, or a new node); `doctor` and `config check` always do.
"""

from __future__ import annotations

import posix

from pyxis_hook.errors import ConfigError
from pyxis_hook.host.freshness import signature

SCHEMA_FILE = "pyxis-conf.schema.json"

#: the words for a pattern the schema uses; any other is shown as the pattern itself
_PATTERN_WORDS = {"^/": "an absolute path", "^@?/": "an absolute path, '@' first for a host binary",
                  "^(/.*)?$": 'an absolute path or ""'}
_ARTICLE = {"array": "a list", "object": "a table", "integer": "an integer"}

_loaded: list[tuple[str, tuple, dict]] = []


def schema_file() -> tuple[str, tuple, dict]:
    """(the schema file's path, its stat signature when read, the schema), read once a process."""
    if not _loaded:
        from pyxis_hook import fastjson
        from pyxis_hook.rootfs import read_to_end
        from pyxis_hook.spec.schemafiles import schema_path

        path = schema_path(SCHEMA_FILE)
        try:
            fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC)
            sig = signature(path, posix.fstat(fd))
            schema = fastjson.loads(read_to_end(fd, 1 << 20))
        except OSError as e:
            raise ConfigError(f"{path}: cannot read the configuration's schema: {e.strerror}") from None
        except ValueError as e:
            raise ConfigError(f"{path}: the configuration's schema is not JSON: {e}") from None
        _loaded.append((path, sig, schema))
    return _loaded[0]


def problem(data: dict) -> str | None:
    """None when `data` is valid against the schema, else the one line for its first bad key (module doc).

    Also a line, not an exception, when jsonschema cannot be imported: the
    file is then unchecked, and a start must not go on with it.
    """
    try:
        import jsonschema
    except ImportError:
        import sys

        return (f"cannot be checked: {sys.executable} cannot import jsonschema "
                "(Debian/Ubuntu/EL: the python3-jsonschema package; pip: jsonschema)")

    schema = schema_file()[2]
    errors = list(jsonschema.Draft7Validator(schema).iter_errors(data))
    if not errors:
        return None
    order = {key: i for i, key in enumerate(data)}
    return _words(min(errors, key=lambda e: (order.get(_key(e), len(order)), len(e.absolute_path))), schema)


def _unknown(error) -> list[str]:
    """The keys of the table an additionalProperties error is about that the schema does not know."""
    return [k for k in error.instance if k not in error.schema.get("properties", {})]


def _key(error) -> str | None:
    if error.absolute_path:
        return str(error.absolute_path[0])
    if error.validator == "additionalProperties":
        return _unknown(error)[0]
    return None


def describe(sub: dict) -> str:
    """What the schema node `sub` allows, in words: "one of a, b", "a list of ...", "a string (an absolute path)"."""
    if "enum" in sub:
        return "one of " + ", ".join(map(str, sub["enum"]))
    typ = sub.get("type", "value")
    if typ == "array":
        items = sub.get("items")
        return "a list of " + (describe(items) if items else "values")
    if "pattern" in sub:
        words = _PATTERN_WORDS.get(sub["pattern"], "matching " + sub["pattern"])
        return f"a {typ} ({words})"
    return _ARTICLE.get(typ, f"a {typ}")


def _words(error, schema: dict) -> str:
    path = list(error.absolute_path)
    if not path and error.validator == "additionalProperties":
        known = ", ".join(sorted(schema.get("properties", {})))
        return f"unknown key '{_unknown(error)[0]}' (known keys: {known})"
    label = "top level"
    if path:
        label = f"key '{path[0]}" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[1:]) + "'"
    if error.validator in ("type", "enum", "pattern"):
        return f"{label}: {error.instance!r} is not {describe(error.schema)}"
    if error.validator == "uniqueItems":
        return f"{label}: {error.instance!r} repeats an item"
    return f"{label}: {error.message}"
