"""`pyxis-hook list [--json] [--devices SPEC] [--capabilities CAPS]`: what a request would get.

Without options: every driver file the host offers, per capability, and all
GPUs.  `--devices` takes an NVIDIA_VISIBLE_DEVICES value (all, none, void,
indices, UUIDs, MIG ids) and `--capabilities` an NVIDIA_DRIVER_CAPABILITIES
value; both are resolved by `request.resolve_request` exactly as for a
container, so `list` shows the files and device nodes it would inject.
Exits non-zero only when the inventory is unusable or the request invalid.
"""

from __future__ import annotations

import json
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--devices", metavar="SPEC", help="as NVIDIA_VISIBLE_DEVICES (default: all)")
    parser.add_argument("--capabilities", metavar="CAPS",
                        help="as NVIDIA_DRIVER_CAPABILITIES, e.g. compute,utility or all (default: all)")


def _selection(args, config, inv):
    """(capabilities, gpus, mig devices, device nodes, request warnings) for the command line."""
    from pyxis_hook.host import gpus as gpus_mod
    from pyxis_hook.spec.request import resolve_request

    env = {"NVIDIA_VISIBLE_DEVICES": args.devices if args.devices is not None else "all",
           "NVIDIA_DRIVER_CAPABILITIES": args.capabilities if args.capabilities is not None else "all"}
    req = resolve_request(env, {}, inv.host, config, privileged=True)
    caps = tuple(req.capabilities)
    if req.void:
        return caps, (), (), (), tuple(req.warnings)
    want = set(caps)
    nodes = gpus_mod.device_nodes_for(
        inv.host, [g.minor for g in req.gpus], req.mig_devices, uvm=bool(want & {"compute", "video"}),
        modeset="display" in want, mig_config=req.mig_config, mig_monitor=req.mig_monitor,
        imex_channels=req.imex_channels)
    return caps, tuple(req.gpus), tuple(req.mig_devices), tuple(nodes), tuple(req.warnings)


def list_dict(inv, caps, gpus, migs, nodes, warnings) -> dict:
    """The JSON document `list --json` prints (schemas/list.schema.json)."""
    files = inv.select(caps, include_uninjected=True)
    return {
        "driver_version": inv.driver_version,
        "driver_root": inv.driver_root,
        "capabilities": list(caps),
        "files": [f.to_dict() for f in files],
        "non_driver_deps": [d.to_dict() for d in inv.deps_for(caps)],
        "missing": [m for m in inv.missing if m.split(":")[0] in caps],
        "gpus": [{"index": g.index, "minor": g.minor, "uuid": g.uuid, "bus_id": g.bus_id, "model": g.model}
                 for g in gpus],
        "mig_devices": [{"uuid": m.uuid, "gpu_minor": m.gpu_minor, "gi": m.gi, "ci": m.ci} for m in migs],
        "devices": [{"path": n.path, "major": n.major, "minor": n.minor, "exists": bool(n.exists),
                     "problem": n.problem} for n in nodes],
        "usable": inv.usable,
        "warnings": list(inv.warnings) + list(warnings),
        "errors": list(inv.errors),
    }


def format_text(doc: dict) -> str:
    lines = [f"driver {doc['driver_version'] or 'unknown'} in {doc['driver_root']}; "
             f"capabilities: {', '.join(doc['capabilities']) or 'none'}"]
    for cap in dict.fromkeys(list(doc["capabilities"]) + [f["capability"] for f in doc["files"]]):
        files = [f for f in doc["files"] if f["capability"] == cap]
        if not files:
            continue
        lines.append(f"{cap}:")
        for f in files:
            label = f["soname"] or f["name"]
            note = "" if f["inject"] else "  (not injected: graphics-config-files = false)"
            lines.append(f"  {f['kind']:<8} {label:<36} {f['path']}{note}")
    if doc["non_driver_deps"]:
        lines.append("needed from the image (not injected):")
        for d in doc["non_driver_deps"]:
            lines.append(f"  {d['name']:<20} needed by {', '.join(d['needed_by'])}")
    if doc["missing"]:
        lines.append("not on this host: " + ", ".join(m.split(": ", 1)[-1] for m in doc["missing"]))
    if doc["gpus"] or doc["devices"]:
        lines.append("devices:")
        for g in doc["gpus"]:
            lines.append(f"  GPU {g['index']}  minor {g['minor']}  {g['uuid'] or '?'}  {g['bus_id']}  {g['model'] or '?'}")
        for n in doc["devices"]:
            prob = f"  ({n['problem']})" if n["problem"] else ""
            lines.append(f"  {n['path']}  {n['major']}:{n['minor']}{prob}")
    for w in doc["warnings"]:
        lines.append(f"warning: {w}")
    return "\n".join(lines) + "\n"


def run(args, config) -> int:
    from pyxis_hook.errors import FINDINGS, OK, PyxisHookError, error_line
    from pyxis_hook.host.discovery import discover

    inv = discover(config, strict=False)
    rc = OK if inv.usable else FINDINGS
    try:
        caps, gpus, migs, nodes, warnings = _selection(args, config, inv)
    except PyxisHookError as e:
        error_line(str(e))
        return e.exit_code
    doc = list_dict(inv, caps, gpus, migs, nodes, warnings)
    sys.stdout.write(json.dumps(doc, indent=2) + "\n" if args.json else format_text(doc))
    for err in inv.errors:
        error_line(str(err))
    return rc
