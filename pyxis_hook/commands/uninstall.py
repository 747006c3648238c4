"""`pyxis-hook uninstall ENGINE|all [--root DIR] [--dry-run]`: undo `install ENGINE` (`all`: every engine installed).

Every file `install` wrote for ENGINE and no other installed engine needs is
put back as it was (removed, or its original restored: NVIDIA's enroot
hook); a file changed since (an admin's pyxis.conf) is left as it is.
`all` is what removing the .deb or .rpm runs: a registration left behind
would name a launcher that is gone, and the engine would fail every start.
"""

from __future__ import annotations

OWN_CONFIG = True


def add_arguments(parser) -> None:
    from pyxis_hook.engines.enginefiles import ENGINES

    parser.add_argument("engine", choices=(*ENGINES, "all"), help="the engine to unregister from (all: every one installed)")
    parser.add_argument("--root", default="/", metavar="DIR", help="do it all under DIR as if DIR were /")
    parser.add_argument("--dry-run", action="store_true", help="print what would change and change nothing")


def run(args, config) -> int:
    from pyxis_hook.engines.installer import uninstall
    from pyxis_hook.engines.installstate import NodeTree, installed_engines, load_record

    tree = NodeTree(args.root)
    engines = sorted(installed_engines(load_record(tree))) if args.engine == "all" else [args.engine]
    if not [e for e in engines if uninstall(e, tree, print, dry_run=args.dry_run)]:
        print(f"pyxis-hook uninstall {args.engine}: not installed, nothing to change")
    return 0
