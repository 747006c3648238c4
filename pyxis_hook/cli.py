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
    "config": ("config", "print pyxis.conf with every key at its built-in default (`config default`), "
               "or check the one in effect against its schema (`config check`)", ()),
    "refresh": ("refresh", "build the node artifact (the driver's inventory every start reads) now", ()),
    "cdi": ("cdi", "generate a CDI spec for the host GPUs", ()),
    "precreate": ("precreate", "podman precreate hook: add GPU devices to a proposed config.json", ()),
    "enroot": ("enroot", "run as an enroot hook (ENROOT_PID, ENROOT_ROOTFS, ENROOT_ENVIRON)", ()),
    "install": ("install", "register the hook with an engine so its stock configuration runs it", ()),
    "uninstall": ("uninstall", "undo `install ENGINE`: the node's files as they were before", ()),
}


def named_command(argv: list[str]) -> str | None:
    """The command `argv` runs (a name or alias of COMMANDS), or None when it asks for help or names none.

    The first word that is neither an option nor --config's value, as the
    parser will read it; None when -h/--help precedes it (the help lists
    every command).
    """
    words = iter(argv)
    for word in words:
        if word in ("-h", "--help"):
            return None
        if word == "--config":
            next(words, None)
        elif not word.startswith("-"):
            known = word in COMMANDS or any(word in aliases for _m, _h, aliases in COMMANDS.values())
            return word if known else None
    return None


def build_parser(only: str | None = None):
    """The parser; with `only`, one command's subparser alone.

    A command a runtime or engine runs for each container (`cdi hook ...`)
    then imports its own module, not all twelve with their imports.
    """
    import argparse

    from pyxis_hook.errors import EXIT_CODES

    parser = argparse.ArgumentParser(
        prog="pyxis-hook",
        description="OCI runtime hook that gives containers the host's NVIDIA GPUs.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit status:\n" + "".join(f"  {code:<4}{meaning}\n" for code, meaning in EXIT_CODES),
    )
    parser.add_argument("--version", action="version", version=f"pyxis-hook {__version__}")
    parser.add_argument("--config", metavar="PATH", help="pyxis.conf to use (default: $PYXIS_HOOK_CONFIG, "
                        "else /etc/pyxis-hook/pyxis.conf, else built-in defaults)")
    parser.add_argument("--debug", action="store_true", help="also print debug messages on stderr")
    # the node artifact as reading pyxis.conf read it (`spec.config.read_config`): commands that read the
    # artifact take it from here, not read it again
    parser.set_defaults(stored=None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    import importlib

    for name, (module, help_text, aliases) in COMMANDS.items():
        if only is not None and only != name and only not in aliases:
            continue
        mod = importlib.import_module(f"pyxis_hook.commands.{module}")
        p = sub.add_parser(name, help=help_text, aliases=list(aliases), description=help_text)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    from pyxis_hook import start

    fast = start.dispatch(argv)
    if fast is not None:
        return fast
    from pyxis_hook import errors, log

    parser = build_parser(named_command(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "_module", None):
        parser.print_help(sys.stderr)
        return errors.USAGE
    try:
        from pyxis_hook.spec.config import read_config

        # install may run before pyxis.conf exists (it writes it): the command reads --config itself
        config, stored = (None, None) if getattr(args._module, "OWN_CONFIG", False) else read_config(args.config)
        if config is not None:
            log.configure(config.log_file, config.log_level, "debug" if args.debug else "warning")
        if stored is not None:  # a file checked just now: recorded as a start would (a CDI hook step is one)
            from pyxis_hook.host import artifact

            artifact.record_verdict(stored)
            args.stored = stored
        return int(args._module.run(args, config) or 0)
    except BaseException as e:  # noqa: BLE001 — the one ladder words it; SystemExit passes through
        if isinstance(e, SystemExit):
            raise
        return errors.report(e, args.command)
