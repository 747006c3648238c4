"""`pyxis-hook install ENGINE [--root DIR] [--dry-run]`: register the hook so ENGINE's stock configuration runs it.

Writes the launcher, pyxis.conf when there is none (`config default`), and
the engine's files (engines/enginefiles.py); a second run changes nothing.
`--root DIR` does it all under DIR as if it were /.  See docs/design.md,
"Installing", and each engine's page under docs/.
"""

from __future__ import annotations

import os
import sys

#: cli.py: this command reads --config itself (pyxis.conf may not exist yet)
OWN_CONFIG = True


def add_arguments(parser) -> None:
    from pyxis_hook.engines.enginefiles import ENGINES

    parser.add_argument("engine", choices=ENGINES, help="the engine to register with")
    parser.add_argument("--root", default="/", metavar="DIR", help="do it all under DIR as if DIR were /")
    parser.add_argument("--dry-run", action="store_true", help="print what would change and change nothing")


def conf_path(args) -> str:
    """The node's pyxis.conf that registrations name: --config (absolute) or /etc/pyxis-hook/pyxis.conf."""
    from pyxis_hook.engines.enginefiles import CONF

    return os.path.abspath(args.config) if args.config else CONF


def context(args, tree, conf: str):
    """This install's `InstallContext`; the configuration a CDI spec is generated from, when there is one."""
    from pyxis_hook.engines import enginefiles as ef
    from pyxis_hook.engines.filetexts import InstallContext
    from pyxis_hook.engines.hookd import base_argv, interpreter
    from pyxis_hook.errors import PyxisHookError
    from pyxis_hook.spec.config import Config, load_config

    argv = base_argv(interpreter())
    config = None
    if any(r.startswith("cdi-spec") for r in ef.ENGINE_ROLES[args.engine]):
        config = load_config(tree.host(conf)) if tree.get(conf) else Config()
        from pyxis_hook.engines import cdi

        try:
            cdi.generate_spec(config)
        except PyxisHookError as e:
            print(f"no CDI spec now ({e}); {ef.CDI_SERVICE} writes it at boot", file=sys.stderr)
            config = None
    from pyxis_hook.commands.config import default_text

    return InstallContext(argv[0], argv[3], conf, default_text(), config, "cdi-spec" in ef.ENGINE_ROLES[args.engine])


def run(args, config) -> int:
    from pyxis_hook.engines.installer import apply_install, plan_install
    from pyxis_hook.engines.installstate import NodeTree

    tree = NodeTree(args.root)
    changes, doc = plan_install(args.engine, tree, context(args, tree, conf_path(args)))
    if not changes:
        print(f"pyxis-hook install {args.engine}: nothing to change")
        if not args.dry_run:
            from pyxis_hook.engines.installstate import load_record, save_record

            if doc != load_record(tree):
                save_record(tree, doc)
        return 0
    if args.dry_run:
        for c in changes:
            print(f"would {'replace' if c.existed else 'write'} {c.path}")
        return 0
    apply_install(args.engine, tree, changes, doc, print)
    for line in next_steps(args.engine):
        print(line)
    return 0


def next_steps(engine: str) -> list[str]:
    """What the admin still runs: systemd and containerd read their files when told to."""
    from pyxis_hook.engines import enginefiles as ef

    out = []
    if "cdi-service" in ef.ENGINE_ROLES[engine]:
        out.append(f"then: systemctl daemon-reload && systemctl start {ef.CDI_PATH_UNIT}")
    if engine == "containerd":
        out.append("then: systemctl restart containerd")
    return out
