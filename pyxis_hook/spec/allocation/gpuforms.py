"""What every scheduler's reader shares: the `Allocation` it returns and the GPU forms it reads.

Each form is read against the host's GPUs (`HostGpus`): a global index
(PCI order), a full UUID or HTCondor's `GPU-<8 hex>` prefix, a
`/dev/nvidiaN` minor.  `label` is the variable and value the token came
from (`CUDA_VISIBLE_DEVICES=0,1`); a token that names no usable GPU of
this host raises RequestError naming it.  Pure: nothing is read.
"""

from __future__ import annotations

from pyxis_hook.nogpu import split_tokens
from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import Gpu, HostGpus
from pyxis_hook.record import record
from pyxis_hook.spec.allocation import CVD, is_index

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Callable, Mapping

_HEX = frozenset("0123456789abcdefABCDEF")


@record
class Allocation:
    """The GPUs the job may use on this node; `gpus == ()` is a job without GPUs (not "every GPU")."""

    #: "Slurm", "LSF", "OpenPBS", "Torque", "HTCondor" or "Flux"
    scheduler: str
    #: the variable and value the GPUs were read from, e.g. "SLURM_STEP_GPUS=0,1"
    source: str
    #: allocated host GPUs in host-index (PCI) order
    gpus: tuple[Gpu, ...]
    #: one sentence for `plan` and `doctor`
    reason: str


def usable(host: HostGpus) -> list[Gpu]:
    """The host's GPUs a job may be given, in index (PCI) order."""
    return sorted((g for g in host.gpus if g.index is not None and not g.excluded), key=lambda g: g.index or 0)


def by_index(host: HostGpus, label: str, tok: str) -> Gpu:
    """The GPU of global index `tok`."""
    g = host.gpu_by_index(int(tok))
    if g is None or g.excluded:
        raise RequestError(f"{label}: GPU {tok} does not exist on this host, which has {len(usable(host))} "
                           f"usable GPU(s) in PCI order")
    return g


def by_uuid(host: HostGpus, label: str, tok: str) -> Gpu:
    """A full UUID, or HTCondor's `GPU-<first 8 hex>` prefix (unique among the host's GPUs)."""
    g = host.gpu_by_uuid(tok)
    if g is None and len(tok) == 12 and _HEX.issuperset(tok[4:]):
        want = tok.lower()
        found = [x for x in host.gpus if x.uuid and x.uuid.lower().startswith(want)]
        if len(found) > 1:
            raise RequestError(f"{label}: {tok} matches {len(found)} GPUs of this host")
        g = found[0] if found else None
    if g is None or g.index is None or g.excluded:
        raise RequestError(f"{label}: GPU {tok} does not exist on this host")
    return g


def by_minor(host: HostGpus, label: str, tok: str) -> Gpu:
    """The GPU of `/dev/nvidia<tok>`."""
    g = host.gpu_by_minor(int(tok))
    if g is None or g.index is None or g.excluded:
        raise RequestError(f"{label}: /dev/nvidia{tok} is not a GPU of this host")
    return g


def parse(host: HostGpus, label: str, value: str, token: Callable[[str], Gpu | None]) -> tuple[Gpu, ...]:
    """Each token of `value` through `token` (None: not a form this scheduler writes)."""
    gpus: dict[int, Gpu] = {}
    for tok in split_tokens(value):
        g = token(tok)
        if g is None:
            raise RequestError(f"{label}: {tok!r} is not a GPU this scheduler names")
        gpus[g.minor] = g
    return tuple(sorted(gpus.values(), key=lambda g: g.index or 0))


def indices(gpus: tuple[Gpu, ...]) -> str:
    """The GPUs' host indices for a reason: "0, 2", or "none"."""
    return ", ".join(str(g.index) for g in gpus) or "none"


def global_indices(host: HostGpus, label: str, value: str) -> tuple[Gpu, ...]:
    """Every token of `value` a global index (Slurm's, Torque's and Flux's form)."""
    return parse(host, label, value, lambda t: by_index(host, label, t) if is_index(t) else None)


def visible_devices(env: Mapping[str, str]) -> tuple[str, str] | None:
    """(value, "CUDA_VISIBLE_DEVICES=<value>") as OpenPBS, Torque and Flux write it; None when it is not set."""
    value = env.get(CVD)
    return None if value is None else (value, f"{CVD}={value}")
