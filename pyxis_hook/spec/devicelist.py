"""NVIDIA_VISIBLE_DEVICES's device tokens (libnvidia-container's `select_devices` grammar) against the host's GPUs.

`resolve_token` reads one token, in LNC's order: GPU UUID, PCI id, host
index, MIG UUID, `<gpu>:<mig>`; a token that names no usable device of
this host raises RequestError listing the host's (`unknown`).  Pure:
nothing is read.  `spec.request` imports it only for a request that names
devices (`all`, `none` and `void` need none of it).
"""

from __future__ import annotations

from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import Gpu, HostGpus, MigDevice, is_full_bus_id
from pyxis_hook.spec.allocation import is_index
from pyxis_hook.spec.envreads import is_mig_uuid

#: the old MIG token form, MIG-GPU-<uuid>/<gi>/<ci> (refused with a hint; `re` is imported only for it)
_LEGACY_MIG = r"(?i)^MIG-(GPU-[0-9a-fA-F-]+)/([0-9]{1,9})/([0-9]{1,9})$"


# Token shapes in plain string code, not `re`, which the start path avoids;
# tests/unit/spec/test_parsers_vs_regex.py checks each against the regular expression it replaces.
def gpu_mig(tok: str) -> tuple[int, int] | None:
    """(gpu, mig) of the `<gpu index>:<mig index>` form."""
    gpu, sep, mig = tok.partition(":")
    return (int(gpu), int(mig)) if sep and is_index(gpu) and is_index(mig) else None


def gpu_label(g: Gpu) -> str:
    """A GPU for a message: `<index> (<uuid>, <bus id>)`."""
    return f"{g.index} ({g.uuid or 'no UUID'}, {g.bus_id})"


def mig_label(host: HostGpus, m: MigDevice) -> str:
    """A MIG device for a message: `<gpu index>:<mig index> (<uuid or gpu/gi/ci>)`."""
    parent = host.gpu_by_minor(m.gpu_minor)
    idx = parent.index if parent is not None else "?"
    return f"{idx}:{m.mig_index} ({m.uuid or f'gpu{m.gpu_minor}/gi{m.gi}/ci{m.ci}'})"


def describe_host(host: HostGpus) -> str:
    """The host's usable GPUs and MIG devices, for an unknown-device error."""
    usable = [g for g in host.gpus if g.index is not None]
    if not usable:
        text = "this host has no usable GPU"
    else:
        text = "this host has GPUs " + ", ".join(gpu_label(g) for g in usable)
    if host.mig_devices:
        text += "; MIG devices " + ", ".join(mig_label(host, m) for m in host.mig_devices)
    return text


def unknown(tok: str, host: HostGpus, hint: str = "") -> RequestError:
    """The error for a token that names no device of this host, listing the host's."""
    extra = f"; {hint}" if hint else ""
    return RequestError(f"device error: {tok}: unknown device ({describe_host(host)}{extra})")


# ----------------------------------------------------------------- token grammar (LNC select_devices)


def _gpu_by_uuid(host: HostGpus, tok: str) -> Gpu:
    found = host.gpu_by_uuid(tok)
    if found is not None:
        return found
    want = tok.lower()
    prefixed = [g for g in host.gpus if g.uuid and g.uuid.lower().startswith(want)]
    hint = ""
    if len(prefixed) == 1:
        hint = f"only full UUIDs match: did you mean {prefixed[0].uuid}?"
    raise unknown(tok, host, hint)


def _mig_by_uuid(host: HostGpus, tok: str) -> MigDevice:
    import re

    legacy = re.match(_LEGACY_MIG, tok)
    if legacy:
        parent_uuid, gi, ci = legacy.group(1).lower(), int(legacy.group(2)), int(legacy.group(3))
        for m in host.mig_devices:
            if (m.parent_uuid or "").lower() == parent_uuid and (m.gi, m.ci) == (gi, ci):
                raise unknown(tok, host, f"the MIG-GPU-<uuid>/<gi>/<ci> form is not supported, use "
                                          f"{m.uuid or mig_label(host, m).split(' ')[0]}")
        raise unknown(tok, host, "the MIG-GPU-<uuid>/<gi>/<ci> form is not supported, use MIG-<uuid> or <gpu>:<mig>")
    want = tok.lower()
    for m in host.mig_devices:
        if m.uuid and m.uuid.lower() == want:
            return m
    hint = ""
    if host.mig_devices and not any(m.uuid for m in host.mig_devices):
        hint = "MIG UUIDs are unknown without NVML, use <gpu>:<mig>"
    raise unknown(tok, host, hint)


def _mig_by_pair(host: HostGpus, tok: str, gpu_index: int, mig_index: int) -> MigDevice:
    parent = host.gpu_by_index(gpu_index)
    if parent is not None:
        for m in host.mig_devices:
            if m.gpu_minor == parent.minor and m.mig_index == mig_index:
                return m
    raise unknown(tok, host)


def resolve_token(host: HostGpus, tok: str) -> Gpu | MigDevice:
    """One device token, tried in LNC's order: GPU UUID, PCI id, index, MIG UUID, <gpu>:<mig>."""
    if tok[:4].upper() == "GPU-":
        gpu = _gpu_by_uuid(host, tok)
    elif is_full_bus_id(tok):
        gpu = host.gpu_by_bus_id(tok)
        if gpu is None:
            raise unknown(tok, host)
    elif is_index(tok):
        gpu = host.gpu_by_index(int(tok))
        if gpu is None:
            raise unknown(tok, host, "indices count GPUs in PCI bus order, not /dev/nvidiaN minors")
    elif is_mig_uuid(tok):
        return _mig_by_uuid(host, tok)
    elif (pair := gpu_mig(tok)) is not None:
        return _mig_by_pair(host, tok, *pair)
    else:
        raise unknown(tok, host)
    if gpu.excluded or gpu.index is None:
        raise RequestError(f"device error: {tok}: GPU {gpu.bus_id} is excluded on this host "
                           f"(GPU Excluded: Yes in its /proc/driver/nvidia information)")
    return gpu


def selection(host: HostGpus, gpus: tuple[Gpu, ...], migs: tuple[MigDevice, ...]) -> str:
    """The devices a list selected, for the request's reasons."""
    return (f"GPU(s) {', '.join(gpu_label(g) for g in gpus) or '(none)'}"
            + (f"; MIG device(s) {', '.join(mig_label(host, m) for m in migs)}" if migs else ""))
