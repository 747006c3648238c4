"""`pyxis-hook cdi generate [--output FILE] [--format json|yaml]`, and the hidden `cdi hook STEP`.

`generate` writes a CDI spec for this host (see `pyxis_hook.engines.cdi`).  `hook`
is what the spec's createContainer hooks run: `create-symlinks --link
PATH::TARGET...`, `update-ldcache [--host-driver-version=V] --folder DIR... --lib /DIR/NAME::SONAME::FLAGS...`
(with the version: CUDA forward compat, as the prestart hook applies it),
`proc-driver`; each reads
the state JSON on stdin like any OCI hook.  It is hidden from --help because
nobody types it: the spec names it.
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="cdi_command", metavar="ACTION")
    g = sub.add_parser("generate", help="write a CDI spec for the host GPUs",
                       description="Write a CDI spec (kind = cdi-kind in pyxis.conf) with a device per GPU "
                                   "index, UUID, MIG device and 'all'.")
    g.add_argument("--output", "-o", metavar="FILE", help="write here (atomically) instead of stdout; "
                   "engines read /etc/cdi and /var/run/cdi")
    g.add_argument("--format", choices=["json", "yaml"], default=None,
                   help="default: from the --output suffix (.yaml/.yml), else json")
    g.add_argument("--no-hooks", action="store_true",
                   help="no createContainer hooks, for engines that ignore them (Apptainer --device): "
                        "library links become binds of their file; no ld.so.cache refresh, no /proc view")
    g.add_argument("--hook-path", default="", metavar="PATH",
                   help="the program the spec's hooks run (the launcher `pyxis-hook install` writes); "
                        "default: this interpreter and package")
    h = sub.add_parser("hook", help=argparse.SUPPRESS)
    h.add_argument("step", choices=["create-symlinks", "update-ldcache", "proc-driver"])
    h.add_argument("--link", action="append", default=[], metavar="PATH::TARGET")
    h.add_argument("--folder", action="append", default=[], metavar="DIR")
    h.add_argument("--lib", action="append", default=[], metavar="/DIR/NAME::SONAME::FLAGS")
    h.add_argument("--host-driver-version", default="", metavar="VERSION",
                   help="update-ldcache: apply CUDA forward compat against this host driver version")
    # hide `hook` from the ACTION list in --help
    sub._choices_actions = [a for a in sub._choices_actions if a.dest != "hook"]


def run(args, config) -> int:
    if args.cdi_command == "hook":
        return _hook(args, config)
    from pyxis_hook.engines import cdi
    from pyxis_hook.errors import UsageError

    if args.cdi_command != "generate":
        raise UsageError("cdi: expected an action: generate")
    fmt = args.format or ("yaml" if (args.output or "").endswith((".yaml", ".yml")) else "json")
    doc = cdi.generate_spec(config, hooks=not args.no_hooks, launcher=args.hook_path)
    text = cdi.to_yaml(doc) if fmt == "yaml" else cdi.to_json(doc)
    if args.output:
        from pyxis_hook.engines.install import install_text

        install_text(args.output, text)
    else:
        sys.stdout.write(text)
    return 0


def _hook(args, config) -> int:
    """One createContainer step (`pipeline.cdi_step`), its modules run from the start image."""
    from pyxis_hook import log, startimage

    startimage.load(section="cdi-hook")
    for line in startimage.statuses():
        log.debug(line)
    from pyxis_hook import pipeline

    rc = pipeline.cdi_step(config, args.step, sys.stdin.buffer.read(), links=args.link, folders=args.folder,
                           libs=args.lib, host_driver_version=args.host_driver_version)
    line = startimage.save()
    if line:
        log.debug(line)
    return rc
