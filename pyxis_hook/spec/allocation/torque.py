"""Torque's allocation: CUDA_VISIBLE_DEVICES (this node's global indices), else this node's PBS_GPUFILE lines.

Without CUDA_VISIBLE_DEVICES (the MoM's `$cuda_visible_devices false`)
the GPUs are this node's lines of PBS_GPUFILE (`host.torquegpus`, the one
file a reader reads); a GPU file Torque did not write is a job without
GPUs.  `read(env, host, allowed, node)` (`spec.allocation.job_allocation`'s
reader interface; `node`: the host name the file's lines are matched by,
None: this machine's): the `Allocation`, or None when neither is set;
RequestError naming the variable for a GPU this host lacks or a GPU file
that cannot be read.
"""

from __future__ import annotations

from pyxis_hook.host.gpus import HostGpus
from pyxis_hook.spec.allocation import CVD, GPUFILE
from pyxis_hook.spec.allocation.gpuforms import Allocation, by_index, global_indices, indices, visible_devices

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Mapping


def read(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None, node: str | None) -> Allocation | None:
    found = visible_devices(env)
    if found is None:
        return _gpufile(env, host, node)
    value, label = found
    gpus = global_indices(host, label, value)
    note = " (PBS_GPUFILE lists every node's GPUs; this node's are these)" if env.get(GPUFILE) else ""
    return Allocation("Torque", label, gpus, f"Torque job {env.get('PBS_JOBID')}: {label}: host GPUs "
                                             f"{indices(gpus)} (global indices){note}")


def _gpufile(env: Mapping[str, str], host: HostGpus, node: str | None) -> Allocation | None:
    """A Torque job without CUDA_VISIBLE_DEVICES: this node's lines of PBS_GPUFILE; None without the variable."""
    path = env.get(GPUFILE, "")
    if not path:
        return None
    from pyxis_hook.host import torquegpus

    node = torquegpus.node_name() if node is None else node
    label = f"{GPUFILE}={path}"
    job = f"Torque job {env.get('PBS_JOBID')}"
    text = torquegpus.read_gpufile(path)
    if text is None:
        return Allocation("Torque", label, (), f"{job} without GPUs: {label} does not exist (Torque writes it "
                                               f"only for a job with GPUs)")
    nums = torquegpus.node_indices(text, node)
    gpus = tuple(by_index(host, f"{label} ({node}-gpu{n})", str(n)) for n in nums)
    return Allocation("Torque", label, gpus, f"{job}: {label}, the lines of this node ({node}): host GPUs "
                                             f"{indices(gpus)} (global indices; {CVD} is not set)")
