"""`pyxis-hook uninstall ENGINE [--root DIR] [--dry-run]`: undo `install ENGINE`.

Every file `install` wrote for ENGINE and no other installed engine needs is
put back as it was (removed, or its original restored: NVIDIA's enroot
hook); a file changed since (an admin's pyxis.conf) is left as it is.
"""

from __future__ import annotations

OWN_CONFIG = True


def add_arguments(parser) -> None:
    from pyxis_hook.engines.enginefiles import ENGINES

    parser.add_argument("engine", choices=ENGINES, help="the engine to unregister from")
    parser.add_argument("--root", default="/", metavar="DIR", help="do it all under DIR as if DIR were /")
    parser.add_argument("--dry-run", action="store_true", help="print what would change and change nothing")


def run(args, config) -> int:
    from pyxis_hook.engines.installer import uninstall
    from pyxis_hook.engines.installstate import NodeTree

    if not uninstall(args.engine, NodeTree(args.root), print, dry_run=args.dry_run):
        print(f"pyxis-hook uninstall {args.engine}: not installed, nothing to change")
    return 0
