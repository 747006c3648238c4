"""OpenPBS / PBS Pro's allocation: CUDA_VISIBLE_DEVICES from the pbs_cgroups hook.

Full UUIDs (>= 20), `/dev/nvidiaN` minors (<= 19); empty is a job
without GPUs.  `read(env, host, allowed, node)`
(`spec.allocation.job_allocation`'s reader interface): the `Allocation`,
or None when CUDA_VISIBLE_DEVICES is not set; RequestError naming it for
a GPU this host lacks.
"""

from __future__ import annotations

from pyxis_hook.host.gpus import Gpu, HostGpus
from pyxis_hook.spec.allocation import CVD, is_index
from pyxis_hook.spec.allocation.gpuforms import Allocation, by_minor, by_uuid, indices, parse, visible_devices

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping


def read(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None, node: str | None) -> Allocation | None:
    found = visible_devices(env)
    if found is None:
        return None
    value, label = found
    job = f"OpenPBS job {env.get('PBS_JOBID')}"
    if not value.strip():
        return Allocation("OpenPBS", label, (), f"{job} without GPUs ({CVD} is empty)")

    def token(tok: str) -> Gpu | None:
        if tok[:4].upper() == "GPU-":
            return by_uuid(host, label, tok)
        return by_minor(host, label, tok) if is_index(tok) else None  # PBS Pro <= 19: /dev/nvidiaN minors

    gpus = parse(host, label, value, token)
    return Allocation("OpenPBS", label, gpus, f"{job}: {label}: host GPUs {indices(gpus)}")
