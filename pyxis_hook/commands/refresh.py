"""`pyxis-hook refresh`: build the node artifact now (after a driver install or upgrade, at boot).

Run as root (the package's owner): every start then reads the artifact,
an ordinary user's too.  Without `--force` a trusted, fresh artifact is left
as it is (pyxis.conf's verdict is recorded in it as by every command:
`cli.main`).  `--check` only says whether it is fresh (exit 1 when not).
"""

from __future__ import annotations

from pyxis_hook.errors import FINDINGS, OK


def add_arguments(parser) -> None:
    parser.add_argument("--force", action="store_true", help="rebuild even when the artifact is fresh")
    parser.add_argument("--check", action="store_true", help="only say whether the artifact is trusted and fresh "
                        f"(exit {FINDINGS} when not)")


def run(args, config) -> int:
    from pyxis_hook.errors import ArtifactError, DriverError
    from pyxis_hook.host import artifact

    path = artifact.artifact_path(config)
    stored = args.stored
    if not args.force:
        try:
            artifact.load(config, stored=stored)
            print(f"node artifact {path}: fresh")
            return OK
        except ArtifactError as e:
            if args.check:
                print(f"node artifact: {e}")
                return FINDINGS
            print(f"node artifact: {e}: rebuilding")
    try:
        inv = artifact.build(config, verdict=stored[3] if stored is not None else None)
    except ArtifactError as e:
        raise DriverError(str(e)) from None
    print(f"node artifact {path}: built for driver {inv.driver_version}, {len(inv.files)} files, "
          f"{len(inv.host.gpus)} GPUs now")
    return OK
