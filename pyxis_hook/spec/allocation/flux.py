"""Flux's allocation: CUDA_VISIBLE_DEVICES, global indices; `-1` is a job without GPUs.

`read(env, host, allowed, node)` (`spec.allocation.job_allocation`'s
reader interface): the `Allocation`, or None when CUDA_VISIBLE_DEVICES is
not set; RequestError naming it for a GPU this host lacks.
"""

from __future__ import annotations

from pyxis_hook.host.gpus import HostGpus
from pyxis_hook.spec.allocation.gpuforms import Allocation, global_indices, indices, visible_devices

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping


def read(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None, node: str | None) -> Allocation | None:
    found = visible_devices(env)
    if found is None:
        return None
    value, label = found
    job = f"Flux job {env.get('FLUX_JOB_ID')}"
    if value.strip() == "-1":
        return Allocation("Flux", label, (), f"{job} without GPUs ({label})")
    gpus = global_indices(host, label, value)
    return Allocation("Flux", label, gpus, f"{job}: {label}: host GPUs {indices(gpus)} (global indices = PCI order)")
