"""Slurm's allocation: SLURM_STEP_GPUS, else SLURM_JOB_GPUS, global indices or full UUIDs.

`read(env, host, allowed, node)` (`spec.allocation.job_allocation`'s
reader interface; Slurm's values need neither the device cgroup nor the
node name): the `Allocation`, or None when neither variable is set.
Raises RequestError naming the variable for a GPU this host lacks.
"""

from __future__ import annotations

from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import Gpu, HostGpus
from pyxis_hook.spec.allocation import is_index
from pyxis_hook.spec.allocation.gpuforms import Allocation, indices, parse
from pyxis_hook.spec.slurmvars import SLURM_VARS

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping


def read(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None, node: str | None) -> Allocation | None:
    var = next((v for v in SLURM_VARS if env.get(v, "").strip()), None)
    if var is None:
        return None
    value = env[var]
    label = f"{var}={value}"

    def token(tok: str) -> Gpu | None:
        if is_index(tok):
            g = host.gpu_by_index(int(tok))
            if g is None:
                count = sum(1 for x in host.gpus if x.index is not None)
                raise RequestError(f"{label}: GPU {tok} does not exist on this host, which has {count} usable "
                                   f"GPU(s) in PCI order (does gres.conf match the hardware?)")
            return g
        if tok[:4].upper() == "GPU-":
            g = host.gpu_by_uuid(tok)
            if g is None or g.index is None:
                raise RequestError(f"{label}: GPU {tok} does not exist on this host")
            return g
        raise RequestError(f"{label}: {tok!r} is not a GPU index or UUID")

    gpus = parse(host, label, value, token)
    return Allocation("Slurm", label, gpus, f"Slurm allocation from {label}: host GPUs {indices(gpus)} "
                                            f"(global indices = PCI order)")
