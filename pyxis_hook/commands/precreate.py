"""`pyxis-hook precreate`: podman's precreate hook stage (hooks.d `"stages": ["precreate"]`).

podman runs it before creating the container, with the proposed config.json
on stdin, and uses what it prints on stdout instead.  We add the selected
GPUs to `linux.devices` (the runtime makes the nodes) and allow them in
`linux.resources.devices` (the runtime programs the device cgroup, v1 or v2
alike: the one thing a prestart hook cannot do on cgroup v2), and, under a
Slurm allocation, set `CUDA_VISIBLE_DEVICES` to what the container will
really see.  Driver files still come from the prestart hook (or CDI): a
precreate hook cannot mount anything, there is no container yet.

A container that asks for no GPU gets its config back byte for byte.
"""

from __future__ import annotations

import json
import os
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--bundle-dir", metavar="DIR", default=None,
                        help="directory a relative root.path is joined to (default: the current directory)")


def _devices_edit(doc: dict, plan) -> None:
    linux = doc.setdefault("linux", {})
    devices = linux.setdefault("devices", [])
    have = {d.get("path") for d in devices if isinstance(d, dict)}
    for d in plan.devices:
        if d.path not in have:
            devices.append({"path": d.path, "type": "c", "major": d.major, "minor": d.minor,
                            "fileMode": d.file_mode, "uid": 0, "gid": 0})
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    for d in plan.devices:
        rule = {"allow": True, "type": "c", "major": d.major, "minor": d.minor, "access": "rwm"}
        if rule not in rules:
            rules.append(rule)


def _env_edit(doc: dict, name: str, value: str) -> None:
    process = doc.setdefault("process", {})
    env = [e for e in process.get("env") or [] if not (isinstance(e, str) and e.split("=", 1)[0] == name)]
    env.append(f"{name}={value}")
    process["env"] = env


def transform(config, data: bytes, bundle_dir: str | None = None) -> bytes:
    """The config.json podman should use instead of `data`; `data` itself for a void request."""
    from pyxis_hook import log
    from pyxis_hook.spec import oci
    from pyxis_hook.errors import OciError

    bundle_dir = bundle_dir or os.getcwd()
    bundle = oci.parse_config(data, bundle_dir, "<precreate config.json on stdin>")
    from pyxis_hook.plan.prepare import prepare

    # confined by our own device cgroup: the allocation's (podman runs us inside the srun step)
    prepared = prepare(config, bundle, check=True)
    if prepared.request.void:
        log.debug(f"precreate: {prepared.request.reasons[0]}")
        return data
    plan, request = prepared.plan, prepared.request
    try:
        doc = json.loads(data)
    except ValueError as e:  # parse_config already accepted it; keep the message anyway
        raise OciError(f"precreate config.json: {e}") from None
    _devices_edit(doc, plan)
    if request.allocation is not None and request.cuda_visible_devices is not None:
        _env_edit(doc, "CUDA_VISIBLE_DEVICES", request.cuda_visible_devices)
    log.info(f"precreate: {len(plan.devices)} devices added"
             + (f", CUDA_VISIBLE_DEVICES={request.cuda_visible_devices} ({request.allocation_source})"
                if request.allocation is not None else ""))
    return (json.dumps(doc, indent=2) + "\n").encode()


def run(args, config) -> int:
    out = transform(config, sys.stdin.buffer.read(), args.bundle_dir)
    sys.stdout.buffer.write(out)
    sys.stdout.flush()
    return 0
