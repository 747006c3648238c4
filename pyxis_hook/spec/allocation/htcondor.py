"""HTCondor's allocation: `_CONDOR_AssignedGPUs`, CUDA_VISIBLE_DEVICES or GPU_DEVICE_ORDINAL, first set.

Tokens: `GPU-<8 hex>` UUID prefixes, full UUIDs, `CUDA<N>` or `<N>`
(global indices); `10000` (or empty) is a slot without GPUs.
`read(env, host, allowed, node)` (`spec.allocation.job_allocation`'s
reader interface): the `Allocation`, or None when no variable is set;
RequestError naming the variable for a GPU this host lacks.
"""

from __future__ import annotations

from pyxis_hook.host.gpus import Gpu, HostGpus
from pyxis_hook.spec.allocation import CONDOR_ASSIGNED, CVD, is_index
from pyxis_hook.spec.allocation.gpuforms import Allocation, by_index, by_uuid, indices, parse

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping

#: the variables a slot's GPUs are read from, first set wins
CONDOR_VARS = (CONDOR_ASSIGNED, CVD, "GPU_DEVICE_ORDINAL")
#: HTCondor's value for a slot without GPUs (condor_gpu_discovery's "no device" ordinal)
CONDOR_NO_GPU = "10000"


def read(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None, node: str | None) -> Allocation | None:
    var = next((v for v in CONDOR_VARS if v in env), None)
    if var is None:
        return None
    value = env[var]
    label = f"{var}={value}"
    if value.strip() in (CONDOR_NO_GPU, ""):
        return Allocation("HTCondor", label, (), f"HTCondor slot without GPUs ({label})")

    def token(tok: str) -> Gpu | None:
        if tok[:4].upper() == "GPU-":
            return by_uuid(host, label, tok)
        # `CUDA<N>`: the -by-index form; also in CUDA_VISIBLE_DEVICES, where 9.10-24.0.13 did not strip it
        num = tok[4:] if tok[:4].upper() == "CUDA" else tok
        return by_index(host, label, num) if is_index(num) else None

    gpus = parse(host, label, value, token)
    return Allocation("HTCondor", label, gpus, f"HTCondor slot GPUs from {label}: host GPUs {indices(gpus)}")
