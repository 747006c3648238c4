"""The launcher: the one fixed path every registration names (`/usr/libexec/pyxis-hook/pyxis-hook`).

A registration (hooks.d file, CDI spec, enroot shim, systemd unit) that named
the interpreter and the package directly would break at the next Python or
venv upgrade.  It names the launcher instead: a short Python file whose
`#!<python> -IS` line and `MAIN` are this install's, rewritten by every
`pyxis-hook install`.  It puts `MAIN`'s site directory first on sys.path and
imports `pyxis_hook.__main__`, which runs the command as `python -I -S
<main>` would (no site scan, no environment), from its cached bytecode:
a start costs no more than the direct form (bench/README.md).
"""

from __future__ import annotations

from pyxis_hook.errors import UsageError

LAUNCHER = "/usr/libexec/pyxis-hook/pyxis-hook"
_MARK = "# pyxis-hook launcher"


def launcher_text(python: str, main: str) -> str:
    """The launcher for interpreter `python` and package entry `main` (both absolute).

    UsageError for a path the `#!` line or the Python string cannot hold
    (whitespace, quotes, a newline).
    """
    for what, p in (("interpreter", python), ("package", main)):
        if not p.startswith("/") or any(c in p for c in " \t\n\"'\\"):
            raise UsageError(f"{p}: the {what} path must be absolute, without blanks or quotes, for the launcher")
    return (f"#!{python} -IS\n"
            f"{_MARK}: written by `pyxis-hook install`, which rewrites it after an upgrade.\n"
            f"MAIN = \"{main}\"\n"
            "import sys\n"
            "sys.argv[0] = MAIN\n"
            "sys.path.insert(0, MAIN.rpartition('/')[0].rpartition('/')[0] or '/')  # never '', the working dir\n"
            "try:\n"
            "    import pyxis_hook.__main__  # runs the command and exits, from its cached bytecode\n"
            "except ModuleNotFoundError as e:  # the package moved (an upgrade): one line, not a traceback\n"
            "    if e.name not in ('pyxis_hook', 'pyxis_hook.__main__'):\n"
            "        raise\n"
            "    sys.exit(f'pyxis-hook: error: {MAIN} is gone: run `pyxis-hook install ENGINE` from the upgraded install')\n")


def parse_launcher(text: str) -> tuple[str, str] | None:
    """(interpreter, main) a launcher names; None when `text` is not one of ours."""
    lines = text.split("\n")
    if len(lines) < 3 or not lines[0].startswith("#!") or not lines[1].startswith(_MARK):
        return None
    python = lines[0][2:].split(" ", 1)[0]
    if not lines[2].startswith('MAIN = "') or not lines[2].endswith('"'):
        return None
    return python, lines[2][len('MAIN = "'):-1]
