"""CDI spec generation: the host's GPUs as Container Device Interface devices.

Every device's edits come from `plan.build_plan` for a request naming that
device, so `cdi generate`, `plan` and the hook can never disagree about which
nodes and files a GPU needs.  What the planner puts in every plan (control
nodes, driver files, their SONAME links, the ld.so.cache refresh) goes into
the spec-wide `containerEdits`; each device keeps only what differs.

A static spec cannot create symlinks, refresh the image's ld.so.cache or
build the /proc/driver/nvidia view, so those become `createContainer` hooks
running `pyxis-hook cdi hook ...` (`engines.cdihook`: the same
`apply.apply_plan` code as the prestart hook, on a Plan holding just that
step, on the rootfs pinned as prestart pins it).
"""

from __future__ import annotations

import os
import re

from pyxis_hook.errors import ConfigError
from pyxis_hook.plan.build import ContainerFacts, DeviceEdit, MountEdit, Plan

#: lowest CDI version covering what we emit (deviceNodes.hostPath is 0.5.0; mount `type` 0.4.0)
CDI_VERSION = "0.5.0"
HOOK_STAGE = "createContainer"
#: CDI containers must not be injected a second time by a hooks.d prestart hook
VOID_ENV = "NVIDIA_VISIBLE_DEVICES=void"
#: the update-ldcache hook's argument carrying the host driver version (CUDA forward compat), NVIDIA's name
HOST_DRIVER_VERSION_FLAG = "--host-driver-version"
#: what a driver version looks like (bounded: int() of the parts never meets Python's digit limit)
DRIVER_VERSION_PATTERN = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,9}){0,3}")
#: the capabilities a CDI container's forward-compat decision is made for: the spec records a host
#: driver version only when its libraries were planned with `compute` (`compat_driver_version`)
CDI_COMPAT_CAPABILITIES = ("compute",)


def cdi_facts(machine: str | None = None) -> ContainerFacts:
    """Where a spec puts libraries: the Debian multiarch dirs (the ldcache hook names them explicitly).

    A spec is written before any image is known, so it cannot pick /usr/lib64
    for a RHEL image the way the prestart hook does; the update-ldcache hook
    passes these dirs on ldconfig's command line, so the loader finds the
    libraries in any image.
    """
    import platform  # not at the top: each hook step of a spec imports this module for three constants

    from pyxis_hook.loader.machines import triplets

    machine = machine or platform.machine()
    triplet, triplet32 = triplets(machine)
    return ContainerFacts(rootfs="/", lib_dir=f"/usr/lib/{triplet}",
                          lib32_dir=f"/usr/lib/{triplet32}" if triplet32 else "", has_ld_so_conf=True)


def check_kind(kind: str) -> str:
    """`vendor.com/class` as the CDI spec requires (SPEC.md "kind")."""
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]/[A-Za-z0-9][A-Za-z0-9_.-]*[A-Za-z0-9]", kind or ""):
        raise ConfigError(f"cdi-kind {kind!r}: expected vendor.com/class")
    return kind


def hook_command(config, python: str | None = None, launcher: str = "",
                 env: list[str] | None = None) -> tuple[str, list[str], list[str]]:
    """(path, argv prefix, env) of `pyxis-hook cdi hook`, run by the absolute interpreter with -I -S.

    argv[0] is the absolute interpreter: Python derives sys.prefix from a bare
    argv[0] by a PATH search, which finds the system python, not this install.
    With `launcher` (engines/launcher.py) the hooks run it instead; `env`
    replaces `hook_env(config)`.
    """
    from pyxis_hook.engines.hookd import base_argv, hook_env, interpreter

    env = hook_env(config) if env is None else env
    if launcher:
        return launcher, [launcher, "cdi", "hook"], env
    python = python or interpreter()
    return python, [*base_argv(python), "cdi", "hook"], env


def _node(d: DeviceEdit) -> dict:
    out = {"path": d.path, "type": "c", "major": d.major, "minor": d.minor, "fileMode": d.file_mode}
    if d.host_path != d.path:
        out["hostPath"] = d.host_path
    return out


def _mount(m: MountEdit) -> dict:
    return {"hostPath": m.host_path, "containerPath": m.container_path, "type": "bind", "options": list(m.options)}


def _hook(cmd, step: str, args: list[str]) -> dict:
    path, argv, env = cmd
    return {"hookName": HOOK_STAGE, "path": path, "args": argv + [step, *args], "env": list(env)}


def _link_mounts(plan: Plan, have: set[str]) -> list[dict]:
    """SONAME/.so links as binds of the file they name, for consumers that ignore CDI hooks.

    Apptainer's native `--device` applies env, mounts and nodes only; binding
    the library file itself at `libcuda.so.1` gives the loader the same file
    under the name it asks for (a mount follows the link on the host side).
    """
    by_path = {m.container_path: m for m in plan.mounts}
    links = {s.container_path: os.path.normpath(os.path.join(os.path.dirname(s.container_path), s.target))
             for s in plan.symlinks}
    out = []
    for s in plan.symlinks:
        path = links[s.container_path]
        for _ in range(8):  # libcuda.so -> libcuda.so.1 -> libcuda.so.535.x
            if path not in links:
                break
            path = links[path]
        target = by_path.get(path)
        if target is not None and s.container_path not in have and s.container_path not in by_path:
            out.append(_mount(MountEdit(target.host_path, s.container_path, "file", target.options)))
    return out


def plan_edits(plan: Plan, cmd, *, common: Plan | None = None, proc_hook: bool = False,
               hooks: bool = True, host_driver_version: str = "") -> dict:
    """CDI containerEdits for `plan`, minus what `common` already gives (None: nothing).

    The /proc/driver/nvidia hook belongs in the spec-wide edits only: it reads
    the GPUs from config.json's linux.devices, so one run covers every device
    requested, and a second run would stack a second tmpfs.
    `host_driver_version` (see `compat_driver_version`) goes to the
    update-ldcache hook, which then applies CUDA forward compat.
    """
    have_nodes = {d.path for d in common.devices} if common else set()
    have_mounts = {m.container_path for m in common.mounts} if common else set()
    have_links = {s.container_path for s in common.symlinks} if common else set()
    edits: dict = {}
    if common is None:
        edits["env"] = [VOID_ENV]
    nodes = [_node(d) for d in plan.devices if d.path not in have_nodes]
    if nodes:
        edits["deviceNodes"] = nodes
    mounts = [_mount(m) for m in plan.mounts if m.container_path not in have_mounts]
    if not hooks:
        mounts += _link_mounts(plan, have_links)
    if mounts:
        edits["mounts"] = mounts
    hook_list = []
    links = [f"{s.container_path}::{s.target}" for s in plan.symlinks if s.container_path not in have_links]
    if links:
        hook_list.append(_hook(cmd, "create-symlinks", [a for x in links for a in ("--link", x)]))
    if common is None and plan.ldcache.mode != "none":
        args = [f"{HOST_DRIVER_VERSION_FLAG}={host_driver_version}"] if host_driver_version else []
        args += [a for d in plan.ldcache.lib_dirs for a in ("--folder", d)]
        # merge mode needs each library's SONAME and cache flags: the planner's rows, carried in the spec
        args += [a for (d, name, soname, flags) in plan.ldcache.libs
                 for a in ("--lib", f"{d}/{name}::{soname}::{flags:#06x}")]
        hook_list.append(_hook(cmd, "update-ldcache", args))
    if proc_hook:
        hook_list.append(_hook(cmd, "proc-driver", []))
    if hook_list and hooks:
        edits["hooks"] = hook_list
    return edits


def compat_driver_version(config, driver_version: str | None) -> str:
    """The host driver version the spec hands its update-ldcache hook, or "" for no CUDA forward compat.

    The hook runs when no driver can be asked (inside the container's mount
    namespace, maybe long after `cdi generate`), so the version is recorded
    in the spec, as NVIDIA's `enable-cuda-compat --host-driver-version=` is.
    Recorded only when compat can apply: `cuda-compat = "ldconfig"` and the
    spec's libraries are planned for `compute` (a CDI device carries no
    capabilities: the spec's `default-capabilities` are the container's).
    A version that is not dotted numbers is left out (compat then never applies).
    """
    if config.cuda_compat != "ldconfig" or "compute" not in config.default_capabilities:
        return ""
    if not driver_version or not DRIVER_VERSION_PATTERN.fullmatch(driver_version):
        return ""
    return driver_version


def device_names(host) -> list[tuple[str, str]]:
    """(CDI device name, NVIDIA_VISIBLE_DEVICES token) for every index, UUID, MIG device, and `all`."""
    out: list[tuple[str, str]] = []
    gpus = [g for g in host.gpus if not g.excluded and g.index is not None]
    for g in gpus:
        out.append((str(g.index), str(g.index)))
    for g in gpus:
        if g.uuid:
            out.append((g.uuid, g.uuid))
    for m in host.mig_devices:
        parent = next((g for g in gpus if g.minor == m.gpu_minor), None)
        if parent is None:
            continue
        tok = f"{parent.index}:{m.mig_index}"
        out.append((tok, tok))
        if m.uuid:
            out.append((m.uuid, m.uuid))
    if gpus:
        out.append(("all", "all"))
    return out


def generate_spec(config, *, python: str | None = None, machine: str | None = None, hooks: bool = True,
                  launcher: str = "", env: list[str] | None = None) -> dict:
    """The CDI spec (a dict, JSON-able) for this host; raises DriverError when the driver is unusable.

    `hooks=False` is for consumers that ignore CDI hooks (Apptainer's native
    `--device`): links become binds of their target file, and there is no
    ld.so.cache refresh (the loader then finds the libraries by searching its
    default directories, which holds for the Debian multiarch dirs in
    Debian/Ubuntu images) and no /proc/driver/nvidia view.  `launcher`, `env`:
    as `hook_command` takes them.
    """
    from pyxis_hook.host import artifact
    from pyxis_hook.errors import DriverError
    from pyxis_hook.host.gpuscan import read_proc_driver_files
    from pyxis_hook.plan.build import build_plan
    from pyxis_hook.spec.request import resolve_request

    kind = check_kind(config.cdi_kind)
    inventory = artifact.load_or_build(config, strict=False)
    host = inventory.host
    if host.mig_devices:
        # MIG UUIDs (procfs has none) name devices in the spec: ask the driver's NVML, here only
        from pyxis_hook.plan.prepare import with_mig_uuids

        inventory = with_mig_uuids(inventory)
        host = inventory.host
    facts = cdi_facts(machine)
    proc_files = read_proc_driver_files(config.proc_root)
    caps = ",".join(config.default_capabilities)

    def plan_for(token: str) -> Plan:
        env = {"NVIDIA_VISIBLE_DEVICES": token, "NVIDIA_DRIVER_CAPABILITIES": caps}
        request = resolve_request(env, {}, host, config)
        plan = build_plan(request, inventory, facts, config, proc_files=proc_files)
        if plan.problems:
            raise DriverError(plan.problems[0])
        return plan

    cmd = hook_command(config, python, launcher, env)
    common = plan_for("none")
    devices = []
    for name, token in device_names(host):
        plan = plan_for(token)
        edits = plan_edits(plan, cmd, common=common, hooks=hooks)
        devices.append({"name": name, "containerEdits": edits})
    if not devices:
        raise DriverError(f"no GPU under {config.proc_root}/driver/nvidia/gpus: a CDI spec needs at least one device")
    return {"cdiVersion": CDI_VERSION, "kind": kind, "devices": devices,
            "containerEdits": plan_edits(common, cmd, proc_hook=common.proc_driver is not None, hooks=hooks,
                                         host_driver_version=compat_driver_version(config,
                                                                                   inventory.driver_version))}


# ---------------------------------------------------------------- output


def to_json(doc: dict) -> str:
    import json  # `cdi generate` only: not for each hook step of a spec

    return json.dumps(doc, indent=2) + "\n"


#: keys written unquoted: CDI's camelCase names, minus the words YAML 1.1 reads as bool/null
_PLAIN_KEY = re.compile(r"[a-z][A-Za-z0-9]*")
_YAML_WORDS = frozenset({"y", "n", "yes", "no", "on", "off", "true", "false", "null"})


def _scalar(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if v is None:
        return "null"
    import json

    return json.dumps(str(v))  # a JSON string is a YAML double-quoted scalar


def _yaml(v, indent: int, out: list[str], prefix: str) -> None:
    """Block-style YAML of the JSON data model (dicts, lists, str, int, bool, None)."""
    pad = " " * indent
    if isinstance(v, dict) and v:
        first = True
        for k, item in v.items():
            lead = prefix if first else pad
            first = False
            plain = _PLAIN_KEY.fullmatch(str(k)) and str(k).lower() not in _YAML_WORDS
            key = str(k) if plain else _scalar(str(k))
            if isinstance(item, (dict, list)) and item:
                out.append(f"{lead}{key}:")
                _yaml(item, indent + 2, out, " " * (indent + 2))
            else:
                out.append(f"{lead}{key}: {_empty(item)}")
    elif isinstance(v, list) and v:
        first = True
        for item in v:
            lead = prefix if first else pad
            first = False
            if isinstance(item, (dict, list)) and item:
                _yaml(item, indent + 2, out, f"{lead}- ")
            else:
                out.append(f"{lead}- {_empty(item)}")
    else:
        out.append(f"{prefix}{_empty(v)}")


def _empty(v) -> str:
    if isinstance(v, dict):
        return "{}"
    if isinstance(v, list):
        return "[]"
    return _scalar(v)


def to_yaml(doc: dict) -> str:
    """YAML without a YAML library: every string double-quoted, so no implicit typing can bite."""
    out: list[str] = ["---"]
    _yaml(doc, 0, out, "")
    return "\n".join(out) + "\n"

