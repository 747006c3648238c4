"""`pyxis-hook hookd [--install DIR] [--stage S]`: print or install the hooks.d file."""

from __future__ import annotations

import json
import os
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--install", metavar="DIR", help="write pyxis-hook.json into DIR "
                        "(podman/CRI-O read /usr/share/containers/oci/hooks.d and /etc/containers/oci/hooks.d)")
    parser.add_argument("--stage", default="prestart", choices=["prestart", "createRuntime", "precreate"],
                        help="hook stage (createRuntime for engines that never run prestart, e.g. `apptainer oci`; "
                        "precreate: podman's stage that rewrites config.json, written as pyxis-hook-precreate.json)")
    parser.add_argument("--timeout", type=int, default=None, help="hook timeout in seconds")


def run(args, config) -> int:
    from pyxis_hook.engines.hookd import hook_document, hook_env, hook_file_name

    doc = hook_document(args.stage, hook_env(config), timeout=args.timeout)
    text = json.dumps(doc, indent=2) + "\n"
    if not args.install:
        sys.stdout.write(text)
        return 0
    from pyxis_hook.engines.install import install_text

    dest = install_text(os.path.join(args.install, hook_file_name(args.stage)), text)
    print(f"installed {dest}")
    return 0
