"""The oci-hooks(5) 1.0.0 file that registers pyxis-hook with podman and CRI-O.

The hook path is the absolute, real interpreter (never a pyenv shim: ~110 ms
per start against ~8 ms) run with `-I`, so the image's and the caller's
PYTHONPATH, PYTHONHOME and user site are ignored; `env` is set explicitly
because runtimes pass hooks an environment we must not rely on.
"""

from __future__ import annotations

import os
import sys

HOOK_FILE_NAME = "pyxis-hook.json"
HOOK_ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def hook_file_name(stage: str = "prestart") -> str:
    """`pyxis-hook.json`, or `pyxis-hook-precreate.json` so both files can sit in one hooks.d."""
    return HOOK_FILE_NAME if stage != "precreate" else "pyxis-hook-precreate.json"


def interpreter() -> str:
    """The real interpreter binary behind sys.executable (resolving venv/pyenv links)."""
    return os.path.realpath(sys.executable)


def hook_document(stage: str = "prestart", config_path: str | None = None,
                  python: str | None = None, timeout: int | None = None) -> dict:
    """The hooks.d document for this install: run `python -I -m pyxis_hook <stage>`.

    argv[0] is the interpreter's absolute path, not its basename: CPython
    derives sys.prefix from argv[0], and a bare `python3` would be looked up
    on the hook's PATH and could pick another installation.
    """
    python = python or interpreter()
    env = [HOOK_ENV_PATH]
    if config_path:
        env.append(f"PYXIS_HOOK_CONFIG={config_path}")
    hook: dict = {"path": python, "args": [python, "-I", "-m", "pyxis_hook", stage], "env": env}
    if timeout:
        hook["timeout"] = timeout
    return {"version": "1.0.0", "hook": hook, "when": {"always": True}, "stages": [stage]}

