"""`pyxis-hook plan --bundle DIR [--json]`: the dry run of `prestart`.

The same `hook.prepare` the hook runs, printed instead of applied: the
request with the reason for each decision, then every device, mount,
symlink, cgroup rule and the ld.so.cache update.
"""

from __future__ import annotations

import json
import sys

from pyxis_hook.record import asdict


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", metavar="DIR", required=True, help="OCI bundle (holds config.json)")
    parser.add_argument("--env", metavar="NAME=VALUE", action="append", default=[],
                        help="add to the container's environment (as if in process.env, after it)")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/plan.schema.json)")


def _opts(options) -> str:
    return ",".join(options)


def render(prepared) -> str:
    """Human-readable plan."""
    r, p = prepared.request, prepared.plan
    out = [f"container rootfs: {p.rootfs}", f"request: {r.mode}"]
    if not r.void:
        gpus = ", ".join(f"{g.index} (minor {g.minor}, {g.uuid}, {g.bus_id})" for g in r.gpus) or "none"
        out.append(f"  GPUs: {gpus}")
        if r.mig_devices:
            out.append("  MIG devices: " + ", ".join(f"{m.uuid or f'gpu{m.gpu_minor}/gi{m.gi}/ci{m.ci}'}"
                                                    for m in r.mig_devices))
        out.append(f"  capabilities: {','.join(r.capabilities)}")
        if r.cuda_visible_devices is not None:
            out.append(f"  CUDA_VISIBLE_DEVICES the container needs: {r.cuda_visible_devices or '(empty)'}")
    out.append("reasons:")
    out += [f"  - {x}" for x in r.reasons]
    if p.problems:
        out.append("problems (the hook would fail):")
        out += [f"  ✗ {x}" for x in p.problems]
    if r.void:
        return "\n".join(out) + "\n"
    out.append(f"devices ({len(p.devices)}):")
    out += [f"  {d.path}  c {d.major}:{d.minor}  <- {d.host_path}" for d in p.devices]
    out.append(f"mounts ({len(p.mounts)}):")
    out += [f"  {m.container_path}  <- {m.host_path}  [{_opts(m.options)}]" for m in p.mounts]
    out.append(f"symlinks ({len(p.symlinks)}):")
    out += [f"  {s.container_path} -> {s.target}" for s in p.symlinks]
    if p.proc_driver is not None:
        out.append(f"/proc/driver/nvidia: tmpfs with {', '.join(n for n, _ in p.proc_driver.files)} "
                   f"(ModifyDeviceFiles: 0); gpus/{{{', '.join(p.proc_driver.gpu_dirs)}}}")
    if p.cgroup_mode == "none" and p.cgroup_rules:  # no-cgroups: listed for the runtime, never written
        out.append(f"device cgroup: none (no-cgroups), {len(p.cgroup_rules)} rules not written")
    else:
        from pyxis_hook.userns import in_user_namespace

        skipped = p.cgroup_rules and p.cgroup_mode == "auto" and in_user_namespace()
        out.append(f"device cgroup: {p.cgroup_mode}" + (f", {len(p.cgroup_rules)} rules" if p.cgroup_rules else "")
                   + (" (not written: this process runs in a user namespace; the runtime's cgroup decides)"
                      if skipped else ""))
    ld = p.ldcache
    out.append(f"ld.so.cache: {ld.mode}" + (f" ({ld.ldconfig} {' '.join(ld.lib_dirs)})" if ld.mode == "ldconfig"
                                            else "") + (f" — {ld.why}" if ld.why else ""))
    refused = loader_refusal(prepared)
    if refused:
        out.append(f"  ✗ the image's loader configuration is refused ({refused}): the hook would fail, "
                   "no ldconfig runs on it")
    elif ld.mode == "merge":
        fallback = merge_fallback(prepared)
        out.append(f"  ✗ merge cannot model this image ({fallback}): ldconfig ({ld.ldconfig}) will run instead"
                   if fallback else f"  merge applies: {len(ld.libs)} libraries added to the image's cache, no rescan")
    if p.env:
        out.append("environment: " + " ".join(f"{k}={v}" for k, v in p.env))
    notes = [n for n in p.notes if n not in r.reasons]
    if notes:
        out.append("notes:")
        out += [f"  - {n}" for n in notes]
    return "\n".join(out) + "\n"


def loader_refusal(prepared) -> str | None:
    """Why the hook would refuse the image's ld.so.conf (`ldconf.require_safe`, both modes), else None."""
    if prepared.plan.ldcache.mode not in ("merge", "ldconfig"):
        return None
    from pyxis_hook.loader.ldconf import read_ld_so_conf

    conf = read_ld_so_conf(prepared.plan.rootfs)
    return conf.problems[0] if conf.unsafe else None


def merge_fallback(prepared) -> str | None:
    """Why the hook would fall back from merge to ldconfig for this image (read-only look), else None."""
    from pyxis_hook.apply import cacheupdate

    return cacheupdate.preview(prepared.plan.rootfs, prepared.plan.ldcache)


def request_json(req) -> dict:
    """The request (`spec.request.Request`) in plain JSON types, valid against schemas/request.schema.json."""
    return {
        "void": req.void,
        "mode": req.mode,
        "gpus": [
            {"index": g.index, "minor": g.minor, "uuid": g.uuid, "bus_id": g.bus_id, "model": g.model}
            for g in req.gpus
        ],
        "mig_devices": [
            {"uuid": m.uuid, "parent_uuid": m.parent_uuid, "gpu_minor": m.gpu_minor, "gi": m.gi, "ci": m.ci,
             "mig_index": m.mig_index}
            for m in req.mig_devices
        ],
        "gpu_minors": list(req.gpu_minors),
        "capabilities": list(req.capabilities),
        "requirements": [{"variable": r.variable, "expression": r.expression} for r in req.requirements],
        "requirements_disabled": req.requirements_disabled,
        "mig_config": req.mig_config,
        "mig_monitor": req.mig_monitor,
        "imex_channels": list(req.imex_channels),
        "cuda_visible_devices": req.cuda_visible_devices,
        "allocation": None if req.allocation is None else list(req.allocation),
        "allocation_source": req.allocation_source,
        "scheduler": req.scheduler,
        "legacy": req.legacy,
        "warnings": list(req.warnings),
        "reasons": list(req.reasons),
    }


def plan_json(plan) -> dict:
    """The plan (`plan.build.Plan`) in plain JSON types (lists, not tuples), valid against plan.schema.json's `plan`."""
    return _jsonable(asdict(plan))


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def to_json(prepared) -> dict:
    out = {"request": request_json(prepared.request), "plan": plan_json(prepared.plan)}
    refused = loader_refusal(prepared)
    if prepared.plan.ldcache.mode in ("merge", "ldconfig"):
        # null: the image's ld.so.conf may be read; else why the hook would refuse the start
        out["plan"]["ldcache"]["refused"] = refused
    if prepared.plan.ldcache.mode == "merge":
        # null: the merge applies; else why the hook would run ldconfig instead
        out["plan"]["ldcache"]["merge_fallback"] = None if refused else merge_fallback(prepared)
    return out


def run(args, config) -> int:
    from pyxis_hook.record import replace

    from pyxis_hook.spec import oci
    from pyxis_hook.errors import FINDINGS, OK, UsageError
    from pyxis_hook.plan.prepare import prepare

    bundle = oci.load_bundle(args.bundle)
    if args.env:
        extra = []
        for item in args.env:
            if "=" not in item:
                raise UsageError(f"--env {item!r}: expected NAME=VALUE")
            extra.append(tuple(item.split("=", 1)))
        bundle = replace(bundle, env=bundle.env + tuple(extra))
    prepared = prepare(config, bundle, stored=args.stored)
    if args.json:
        sys.stdout.write(json.dumps(to_json(prepared), indent=2) + "\n")
    else:
        sys.stdout.write(render(prepared))
    return FINDINGS if prepared.plan.problems else OK
