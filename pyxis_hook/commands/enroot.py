"""`pyxis-hook enroot`: run as an enroot hook; `--install DIR` writes the hooks.d shim.

The shim (`98-pyxis-hook.sh`) replaces enroot's `98-nvidia.sh`: same place in
the hook order, no nvidia-container-cli.  See docs/enroot-pyxis.md.
"""

from __future__ import annotations

SHIM_NAME = "98-pyxis-hook.sh"


def shim_text(python: str, config=None) -> str:
    """The shim for this install: the absolute interpreter with -I -S (argv[0] absolute too: sys.prefix).

    Only PYXIS_HOOK_CONFIG of `hookd.hook_env` is set: enroot runs its hooks
    with the container's PATH on purpose, and the shim leaves that alone.
    """
    from pyxis_hook.engines.hookd import CONFIG_ENV, base_argv, hook_env

    env = hook_env(config) if config is not None else []
    conf = next((e.split("=", 1)[1] for e in env if e.startswith(CONFIG_ENV + "=")), None)
    from pyxis_hook.engines.filetexts import shim_for

    return shim_for(base_argv(python), conf, "`pyxis-hook enroot --install`")


def add_arguments(parser) -> None:
    parser.add_argument("--install", metavar="DIR", help=f"write {SHIM_NAME} into DIR (/etc/enroot/hooks.d) "
                        "instead of running as a hook")


def run(args, config) -> int:
    if args.install:
        from pyxis_hook import pathnames
        from pyxis_hook.engines.hookd import interpreter
        from pyxis_hook.engines.install import install_text

        dest = install_text(pathnames.join(args.install, SHIM_NAME), shim_text(interpreter(), config), 0o755)
        print(f"installed {dest}")
        return 0
    return _hook(config)


def _hook(config) -> int:
    from pyxis_hook import pipeline, start

    return pipeline.enroot(config, start.environ())
