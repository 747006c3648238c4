"""`pyxis-hook info [--json]`: the host driver as discovery sees it.

Driver version (and where it came from), CUDA driver version, GPUs (index,
minor, UUID, PCI bus id, model), device majors, device-node problems and
every warning.  It prints what it could find even on a broken host and exits
non-zero only when there is no usable driver at all.
"""

from __future__ import annotations

import json
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def info_dict(inv) -> dict:
    """The JSON document `info --json` prints (schemas/info.schema.json)."""
    return {
        "driver_version": inv.driver_version,
        "version_source": inv.version_source,
        "cuda_version": inv.cuda_version,
        "cuda": _cuda_text(inv.cuda_version),
        "driver_root": inv.driver_root,
        "host": inv.host.to_dict(),
        "other_versions": list(inv.other_versions),
        "usable": inv.usable,
        "warnings": list(inv.warnings),
        "errors": list(inv.errors),
    }


def _cuda_text(v: int | None) -> str | None:
    from pyxis_hook.host.cudaversion import format_cuda_version

    return format_cuda_version(v) if v is not None else None


def format_text(inv) -> str:
    h = inv.host
    src = {"procfs": "kernel module", "files": "library file names; no kernel module"}.get(inv.version_source, "")
    lines = [
        f"driver version: {inv.driver_version or 'unknown'}" + (f" (from {src})" if src else ""),
        f"CUDA driver version: {_cuda_text(inv.cuda_version) or 'unknown'}",
        f"driver root: {inv.driver_root}",
    ]
    if inv.other_versions:
        lines.append(f"other driver versions present: {', '.join(inv.other_versions)}")
    m = h.majors
    majors = ", ".join(f"{n} {v}" for n, v in (("nvidia", m.nvidia), ("nvidia-uvm", m.uvm), ("nvidia-caps", m.caps),
                                                ("nvidia-caps-imex-channels", m.imex)) if v is not None)
    lines.append(f"device majors: {majors or 'none'}")
    lines.append(f"GPUs: {len(h.gpus)}")
    for g in h.gpus:
        idx = "-" if g.index is None else str(g.index)
        extra = " (excluded)" if g.excluded else ""
        lines.append(f"  {idx:>3}  minor {g.minor:<3} {g.uuid or '?'}  {g.bus_id}  {g.model or '?'}{extra}")
    if h.mig_devices:
        lines.append(f"MIG devices: {len(h.mig_devices)}")
        for d in h.mig_devices:
            lines.append(f"  gpu minor {d.gpu_minor} gi {d.gi} ci {d.ci}  {d.uuid or '?'}")
    problems = [n for n in h.nodes if n.problem]
    if problems:
        lines.append("device node problems:")
        lines += [f"  {n.path}: {n.problem}" for n in problems]
    if inv.warnings:
        lines.append("warnings:")
        lines += [f"  {w}" for w in inv.warnings]
    if inv.errors:
        lines.append("errors:")
        lines += [f"  {e}" for e in inv.errors]
    return "\n".join(lines) + "\n"


def run(args, config) -> int:
    from pyxis_hook.errors import FINDINGS, OK, error_line
    from pyxis_hook.host.discovery import discover

    inv = discover(config, strict=False)
    if args.json:
        sys.stdout.write(json.dumps(info_dict(inv), indent=2) + "\n")
    else:
        sys.stdout.write(format_text(inv))
    for e in inv.errors:
        error_line(str(e))
    return OK if inv.driver_version is not None and not inv.errors else FINDINGS
