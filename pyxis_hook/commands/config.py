"""`pyxis-hook config default | check`: the built-in defaults as a pyxis.conf, and checking the one in effect.

`default`: a complete, commented pyxis.conf.  Every key the schema knows,
each under its description, set to the value the hook uses when the file
does not name it; a key whose default is "unset" (an empty `log-file`) is
written commented out.  The output validates as pyxis.conf:
`pyxis-hook config default > /etc/pyxis-hook/pyxis.conf`.

`check`: the pyxis.conf in effect (`--config`, `$PYXIS_HOOK_CONFIG`, else
/etc/pyxis-hook/pyxis.conf) read again and checked against
schemas/pyxis-conf.schema.json with jsonschema, whatever verdict a start
kept for it; prints `PATH: valid`, or fails with the one line naming the
key (exit status 2).
"""

from __future__ import annotations

import sys
import textwrap


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=("default", "check"), help="default: print pyxis.conf with every key at "
                        "its default; check: check the pyxis.conf in effect against its schema")


def toml_value(value) -> str:
    """`value` (str, bool or a tuple of str) as TOML writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def default_text() -> str:
    """The commented default pyxis.conf (module doc)."""
    from pyxis_hook import __version__
    from pyxis_hook.spec.config import Config
    from pyxis_hook.spec.schemafiles import load_schema

    config = Config()
    lines = [f"# pyxis.conf: pyxis-hook {__version__}'s built-in defaults (`pyxis-hook config default`).",
             "# Every key is optional; docs/configuration.md says what each one does.", ""]
    for key, prop in load_schema("pyxis-conf.schema.json").get("properties", {}).items():
        value = getattr(config, key.replace("-", "_"))
        description = prop.get("description", "")
        if description:
            lines += textwrap.wrap(description, 99, initial_indent="# ", subsequent_indent="# ")
        setting = f"{key} = {toml_value(value)}"
        lines += [f"# {setting}" if value == "" else setting, ""]
    return "\n".join(lines)


def run(args, config) -> int:
    if args.action == "check":
        if config.source == "<defaults>":
            print("no pyxis.conf: built-in defaults")
            return 0
        from pyxis_hook.spec.config import load_config

        load_config(config.source, verdicts=False)  # ConfigError: the one line, exit status 2
        print(f"{config.source}: valid")
        return 0
    sys.stdout.write(default_text())
    return 0
