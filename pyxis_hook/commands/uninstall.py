"""`pyxis-hook uninstall ENGINE [--root DIR] [--dry-run]`: undo `install ENGINE`.

Every file `install` wrote for ENGINE and no other installed engine needs is
put back as it was (removed, or its original restored: NVIDIA's enroot
hook); a file changed since (an admin's pyxis.conf) is left as it is.
"""

from __future__ import annotations

OWN_CONFIG = True


def add_arguments(parser) -> None:
    from pyxis_hook.commands.install import add_arguments as install_arguments

    install_arguments(parser)


def run(args, config) -> int:
    from pyxis_hook.engines.installer import uninstall
    from pyxis_hook.engines.installstate import NodeTree

    if not uninstall(args.engine, NodeTree(args.root), print, dry_run=args.dry_run):
        print(f"pyxis-hook uninstall {args.engine}: not installed, nothing to change")
    return 0
