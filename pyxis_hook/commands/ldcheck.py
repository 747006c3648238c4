"""`pyxis-hook ldcheck (ROOTFS | --bundle DIR | --pid PID) [--capabilities CAPS] [--json]`.

Explains how the container's own loader will resolve each driver library
(pyxis_hook/diag/ldcheck.py): shadowing copies, fatal candidates, missing
dependencies, CUDA version gaps and a broken loader setup, each as a finding
with what, why and fix.  Exits 1 when any finding is an error.
"""

from __future__ import annotations

import json
import os
import sys

from pyxis_hook.errors import UsageError


def add_arguments(parser) -> None:
    parser.add_argument("rootfs", nargs="?", metavar="ROOTFS", help="an image's root directory")
    parser.add_argument("--bundle", metavar="DIR", help="an OCI bundle: its rootfs and config.json's environment")
    parser.add_argument("--pid", type=int, metavar="PID", help="a running container's process (after injection)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="container environment for ROOTFS (repeatable; e.g. LD_LIBRARY_PATH=...)")
    parser.add_argument("--capabilities", metavar="CAPS",
                        help="as NVIDIA_DRIVER_CAPABILITIES (default: the container's, else pyxis.conf's default)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (schemas/ldcheck.schema.json)")


def _pid_environ(proc_root: str, pid: int) -> dict[str, str]:
    path = os.path.join(proc_root, str(pid), "environ")
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise UsageError(f"{path}: cannot read: {e.strerror}") from None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[os.fsdecode(k)] = os.fsdecode(v)
    return env


def _target(args, config) -> tuple[str, dict[str, str], str]:
    chosen = [x for x in (args.rootfs, args.bundle, args.pid) if x is not None]
    if len(chosen) != 1:
        raise UsageError("ldcheck: give exactly one of ROOTFS, --bundle DIR, --pid PID")
    env: dict[str, str] = {}
    if args.bundle:
        from pyxis_hook.spec.oci import load_bundle

        bundle = load_bundle(args.bundle)
        return bundle.rootfs, bundle.env_map(), "bundle"
    if args.pid is not None:
        root = os.path.join(config.proc_root, str(args.pid), "root")
        if not os.path.isdir(root):
            raise UsageError(f"{root}: no such process or not allowed to see its root")
        return root, _pid_environ(config.proc_root, args.pid), "pid"
    if not os.path.isdir(args.rootfs):
        raise UsageError(f"{args.rootfs}: not a directory")
    for item in args.env:
        if "=" not in item:
            raise UsageError(f"--env {item!r}: expected NAME=VALUE")
        k, v = item.split("=", 1)
        env[k] = v
    return args.rootfs, env, "rootfs"


def run(args, config) -> int:
    from pyxis_hook.diag import ldcheck
    from pyxis_hook.errors import FINDINGS, OK
    from pyxis_hook.diag.findings import has_errors
    from pyxis_hook.host.discovery import discover

    rootfs, env, source = _target(args, config)
    inv = discover(config, strict=False)
    report = ldcheck.check_image(rootfs, env, inv, config, capabilities=args.capabilities, source=source)
    if args.json:
        sys.stdout.write(json.dumps(report.to_dict(), indent=2) + "\n")
    else:
        sys.stdout.write(ldcheck.format_text(report))
    return FINDINGS if has_errors(report.findings) else OK
