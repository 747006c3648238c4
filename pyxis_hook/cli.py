"""Command line: global options, subcommand dispatch, the one error line.

Each subcommand lives in `pyxis_hook/commands/<name>.py` with
`add_arguments(parser)` and `run(args, config) -> int`; heavy imports happen
inside `run`, so `pyxis-hook prestart` for a container without a GPU request
pays for nothing it does not use.
"""

from __future__ import annotations

import sys

from pyxis_hook import __version__

#: subcommand -> (module under pyxis_hook.commands, one-line help, aliases)
COMMANDS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "prestart": ("prestart", "run as an OCI prestart/createRuntime hook (state JSON on stdin)", ("createRuntime",)),
    "plan": ("plan", "dry run: show what the hook would do for a bundle", ()),
    "info": ("info", "show the host driver: version, GPUs, device majors", ()),
    "list": ("list", "list the driver files and devices a request would get", ()),
    "ldcache": ("ldcache", "print an ld.so.cache exactly as `ldconfig -p` does", ()),
    "ldd": ("ldd", "resolve ELF dependencies inside a root the way glibc's ld.so does", ()),
    "ldcheck": ("ldcheck", "explain how a container's loader will resolve the driver libraries", ()),
    "doctor": ("doctor", "check this host for the usual causes of GPU container failures", ()),
    "hookd": ("hookd", "print or install the oci-hooks(5) file for podman/CRI-O", ()),
    "cdi": ("cdi", "generate a CDI spec for the host GPUs", ()),
    "precreate": ("precreate", "podman precreate hook: add GPU devices to a proposed config.json", ()),
    "enroot": ("enroot", "run as an enroot hook (ENROOT_PID, ENROOT_ROOTFS, ENROOT_ENVIRON)", ()),
}


def _fast_path(argv: list[str]) -> int | None:
    """`prestart`/`createRuntime` without options skips argparse entirely."""
    if len(argv) == 1 and argv[0] in ("prestart", "createRuntime"):
        from pyxis_hook.commands import prestart

        return prestart.main_fast()
    return None


def build_parser():
    import argparse

    parser = argparse.ArgumentParser(
        prog="pyxis-hook",
        description="OCI runtime hook that gives containers the host's NVIDIA GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"pyxis-hook {__version__}")
    parser.add_argument("--config", metavar="PATH", help="pyxis.conf to use (default: $PYXIS_HOOK_CONFIG, "
                        "else /etc/pyxis-hook/pyxis.conf, else built-in defaults)")
    parser.add_argument("--debug", action="store_true", help="also print debug messages on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import importlib

    for name, (module, help_text, aliases) in COMMANDS.items():
        mod = importlib.import_module(f"pyxis_hook.commands.{module}")
        p = sub.add_parser(name, help=help_text, aliases=list(aliases), description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    fast = _fast_path(argv)
    if fast is not None:
        return fast
    from pyxis_hook import log
    from pyxis_hook.errors import PyxisHookError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        from pyxis_hook.config import load_config

        config = load_config(args.config)
        log.configure(config.log_file, config.log_level, "debug" if args.debug else "warning")
        return int(args._module.run(args, config) or 0)
    except PyxisHookError as e:
        log.error(str(e))
        sys.stderr.write(f"pyxis-hook: error: {e}\n")
        return e.exit_code
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # a bug: one line for the user, the traceback in the log
        log.exception(f"internal error in {args.command}")
        where = f"traceback in {log.log_path()}" if log.log_path() else "set log-file in pyxis.conf for the traceback"
        sys.stderr.write(f"pyxis-hook: error: internal error: {type(e).__name__}: {e} ({where})\n")
        return 1
