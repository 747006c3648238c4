"""The oci-hooks(5) 1.0.0 file that registers pyxis-hook with podman and CRI-O.

The hook path is the absolute, real interpreter (never a pyenv shim, a shell
script run before every start: docs/decisions/2026-12-07-start-costs.md), run
with `-I`, so the image's and the caller's PYTHONPATH, PYTHONHOME and user site
are ignored; `env` is set explicitly
because runtimes pass hooks an environment we must not rely on.
"""

from __future__ import annotations

import os
import sys

HOOK_FILE_NAME = "pyxis-hook.json"
HOOK_ENV_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONFIG_ENV = "PYXIS_HOOK_CONFIG"


def hook_file_name(stage: str = "prestart") -> str:
    """`pyxis-hook.json`, or `pyxis-hook-precreate.json` so both files can sit in one hooks.d."""
    return HOOK_FILE_NAME if stage != "precreate" else "pyxis-hook-precreate.json"


def interpreter() -> str:
    """This interpreter as the hook must name it.

    sys.executable as is, not its realpath: a venv's `bin/python` link is
    what makes the venv's site-packages (pyelftools) the prefix.  A pyenv
    shim never shows up here (it execs the real binary).
    """
    return os.path.abspath(sys.executable)


def hook_argv(stage: str, python: str | None = None) -> list[str]:
    """`python -I -S <package>/__main__.py STAGE`: no site scan, no environment (bench/README.md).

    `-S` skips the site scan (reading and running .pth files) at every
    container start (docs/decisions/2026-12-07-start-costs.md);
    __main__.py run as a file puts its own package and this installation's
    site-packages on sys.path itself.
    """
    return [*base_argv(python), stage]


def base_argv(python: str | None = None) -> list[str]:
    """The argv prefix every hook of ours starts with (hooks.d, CDI hooks, enroot shim)."""
    python = python or interpreter()
    pkg = os.path.abspath(__file__)
    for _ in range(__name__.count(".")):  # up to the package's own dir, wherever this module sits in it
        pkg = os.path.dirname(pkg)
    main = os.path.join(pkg, "__main__.py")
    return [python, "-I", "-S", main]


def config_path(config) -> str | None:
    """The absolute pyxis.conf path a registered hook must be told, or None for built-in defaults.

    Absolute because the runtime runs hooks from its own cwd, not the one
    `pyxis-hook --config pyxis.conf ...` was typed in.
    """
    if not config.source or config.source == "<defaults>":
        return None
    return os.path.abspath(config.source)


def hook_env(config) -> list[str]:
    """The environment of every hook we register (hooks.d, CDI hooks, enroot shim).

    One place, so the three never disagree: a fixed PATH (runtimes hand hooks
    an environment we must not rely on) and the absolute PYXIS_HOOK_CONFIG
    unless the configuration is the built-in defaults.
    """
    conf = config_path(config)
    return [HOOK_ENV_PATH] + ([f"{CONFIG_ENV}={conf}"] if conf else [])


def hook_document(stage: str = "prestart", env: list[str] | None = None,
                  python: str | None = None, timeout: int | None = None) -> dict:
    """The hooks.d document for this install: run `python -I -S .../pyxis_hook/__main__.py <stage>`.

    argv[0] is the interpreter's absolute path, not its basename: CPython
    derives sys.prefix from argv[0], and a bare `python3` would be looked up
    on the hook's PATH and could pick another installation.  `env` comes from
    `hook_env(config)` (default: PATH only).
    """
    python = python or interpreter()
    hook: dict = {"path": python, "args": hook_argv(stage, python), "env": list(env or [HOOK_ENV_PATH])}
    if timeout:
        hook["timeout"] = timeout
    return {"version": "1.0.0", "hook": hook, "when": {"always": True}, "stages": [stage]}

