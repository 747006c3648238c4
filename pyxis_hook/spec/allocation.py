"""The job's GPU allocation, whatever batch scheduler made it (docs/schedulers.md).

`job_allocation` recognises the scheduler from the job's variables and
reads the GPUs it gave this node, each value in its scheduler's own form.
`CUDA_VISIBLE_DEVICES` alone is ambiguous (a global index, an index
renumbered inside a device cgroup, a full UUID, a UUID prefix, a
`/dev/nvidiaN` minor, HTCondor's `CUDA<N>` or `10000`, Flux's `-1`, PBS's
empty value), so the scheduler is identified first and only then is the
value parsed.  Pure like `spec.request`: the environment, the host's GPUs
and the device cgroup's allowed minors in, an `Allocation` out; the one file
read is Torque's GPU file, for a Torque job without CUDA_VISIBLE_DEVICES.

The scheduler's variables are the scheduler's, never the image's:
`SCHEDULER_VARS` (and LSF's `CUDA_VISIBLE_DEVICES<N>`) is the one table of
them, and `request_env` builds the env a request reads from the container's
env and the scheduler's, each name from its owner (docs/schedulers.md, "The
allocation rule").

Sources, first match wins:

* Slurm: SLURM_STEP_GPUS, else SLURM_JOB_GPUS (global indices or UUIDs).
* HTCondor (`_CONDOR_AssignedGPUs` or `BATCH_SYSTEM=HTCondor`):
  `_CONDOR_AssignedGPUs`, CUDA_VISIBLE_DEVICES, GPU_DEVICE_ORDINAL;
  `GPU-<8 hex>` UUID prefixes, full UUIDs, `CUDA<N>` / `<N>`; `10000` = none.
* LSF (`LSB_JOBID`): CUDA_VISIBLE_DEVICES and the tasks'
  `CUDA_VISIBLE_DEVICES<N>`, together; indices renumbered from 0 when
  the job is in a device cgroup (`LSB_RESOURCE_ENFORCE="gpu"`), global
  otherwise: counted inside `allowed_minors` when that bound is known.
* Torque (`PBS_JOBID` with PBS_GPUFILE or `PBS_VERSION=TORQUE-...`):
  CUDA_VISIBLE_DEVICES, this node's global indices; without it (the MoM's
  `$cuda_visible_devices false`), this node's lines of PBS_GPUFILE
  (`host.torquegpus`); a GPU file Torque did not write = no GPU.
* OpenPBS / PBS Pro (`PBS_JOBID`): CUDA_VISIBLE_DEVICES from the
  pbs_cgroups hook: full UUIDs (>= 20), minors (<= 19); empty = none.
* Flux (`FLUX_JOB_ID`): CUDA_VISIBLE_DEVICES, global indices; `-1` = none.
"""

from __future__ import annotations

from pyxis_hook import log
from pyxis_hook.nogpu import split_tokens
from pyxis_hook.spec.envreads import prefixed
from pyxis_hook.spec.slurmvars import GPUS_ON_NODE, SLURM_VARS
from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import Gpu, HostGpus
from pyxis_hook.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing stays off the start path (docs/decisions/2026-12-07-start-costs.md)
    from typing import Callable, Mapping

CVD = "CUDA_VISIBLE_DEVICES"
CONDOR_ASSIGNED = "_CONDOR_AssignedGPUs"
CONDOR_VARS = (CONDOR_ASSIGNED, CVD, "GPU_DEVICE_ORDINAL")
GPUFILE = "PBS_GPUFILE"
#: the scheduler-owned variables: every variable a scheduler decision reads (`scheduler_of`, the readers below,
#: `plan.taskview`), and LSF's `CUDA_VISIBLE_DEVICES<N>` (`is_scheduler_var`).  Only the scheduler sets them:
#: `request_env` takes them from the scheduler's env, never from the container's
SCHEDULER_VARS = frozenset((*SLURM_VARS, GPUS_ON_NODE, CVD, "LSB_JOBID", "PBS_JOBID", GPUFILE, "PBS_VERSION",
                            CONDOR_ASSIGNED, "BATCH_SYSTEM", "GPU_DEVICE_ORDINAL", "FLUX_JOB_ID"))
#: HTCondor's value for a slot without GPUs (condor_gpu_discovery's "no device" ordinal)
CONDOR_NO_GPU = "10000"

_DIGITS = frozenset("0123456789")
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


def _is_index(tok: str) -> bool:
    return 0 < len(tok) <= 9 and _DIGITS.issuperset(tok)


def _is_lsf_task_var(name: str) -> bool:
    """LSF's per-task `CUDA_VISIBLE_DEVICES<N>` (`lsf_task_vars`)."""
    return name.startswith(CVD) and _is_index(name[len(CVD):])


def is_scheduler_var(name: str) -> bool:
    """A scheduler-owned variable (`SCHEDULER_VARS`, LSF's `CUDA_VISIBLE_DEVICES<N>`)."""
    return name in SCHEDULER_VARS or _is_lsf_task_var(name)


def request_env(container: Mapping[str, str], scheduler: Mapping[str, str]) -> dict[str, str]:
    """The env a request is resolved from: the container's choices, the scheduler's allocation.

    `container`: the container's env (the image's, the user's); its
    scheduler-owned variables are dropped, each logged at debug.
    `scheduler`: the env the scheduler gave the job (the hook's own, in the
    enroot mode); only its scheduler-owned variables are taken.  Nothing
    else is read or changed.
    """
    env = {}
    for key, value in container.items():
        if is_scheduler_var(key):
            log.debug(f"{key}={value} in the container's environment is not read: the allocation is the "
                      f"scheduler's, never the image's")
        else:
            env[key] = value
    env.update((k, v) for k, v in scheduler.items() if is_scheduler_var(k))
    return env


def _usable(host: HostGpus) -> list[Gpu]:
    return sorted((g for g in host.gpus if g.index is not None and not g.excluded), key=lambda g: g.index or 0)


def _by_index(host: HostGpus, label: str, tok: str) -> Gpu:
    g = host.gpu_by_index(int(tok))
    if g is None or g.excluded:
        raise RequestError(f"{label}: GPU {tok} does not exist on this host, which has {len(_usable(host))} "
                           f"usable GPU(s) in PCI order")
    return g


def _by_uuid(host: HostGpus, label: str, tok: str) -> Gpu:
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


def _by_minor(host: HostGpus, label: str, tok: str) -> Gpu:
    g = host.gpu_by_minor(int(tok))
    if g is None or g.index is None or g.excluded:
        raise RequestError(f"{label}: /dev/nvidia{tok} is not a GPU of this host")
    return g


def _parse(host: HostGpus, label: str, value: str, token: Callable[[str], Gpu | None]) -> tuple[Gpu, ...]:
    """Each token of `value` through `token` (None: not a form this scheduler writes)."""
    gpus: dict[int, Gpu] = {}
    for tok in split_tokens(value):
        g = token(tok)
        if g is None:
            raise RequestError(f"{label}: {tok!r} is not a GPU this scheduler names")
        gpus[g.minor] = g
    return tuple(sorted(gpus.values(), key=lambda g: g.index or 0))


def _indices(gpus: tuple[Gpu, ...]) -> str:
    return ", ".join(str(g.index) for g in gpus) or "none"


# ----------------------------------------------------------------- one reader per scheduler


def _slurm(env: Mapping[str, str], host: HostGpus) -> Allocation | None:
    var = next((v for v in SLURM_VARS if env.get(v, "").strip()), None)
    if var is None:
        return None
    value = env[var]
    label = f"{var}={value}"

    def token(tok: str) -> Gpu | None:
        if _is_index(tok):
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

    gpus = _parse(host, label, value, token)
    return Allocation("Slurm", label, gpus, f"Slurm allocation from {label}: host GPUs {_indices(gpus)} "
                                            f"(global indices = PCI order)")


def _condor(env: Mapping[str, str], host: HostGpus) -> Allocation | None:
    var = next((v for v in CONDOR_VARS if v in env), None)
    if var is None:
        return None
    value = env[var]
    label = f"{var}={value}"
    if value.strip() in (CONDOR_NO_GPU, ""):
        return Allocation("HTCondor", label, (), f"HTCondor slot without GPUs ({label})")

    def token(tok: str) -> Gpu | None:
        if tok[:4].upper() == "GPU-":
            return _by_uuid(host, label, tok)
        # `CUDA<N>`: the -by-index form; also in CUDA_VISIBLE_DEVICES, where 9.10-24.0.13 did not strip it
        num = tok[4:] if tok[:4].upper() == "CUDA" else tok
        return _by_index(host, label, num) if _is_index(num) else None

    gpus = _parse(host, label, value, token)
    return Allocation("HTCondor", label, gpus, f"HTCondor slot GPUs from {label}: host GPUs {_indices(gpus)}")


def _global_indices(host: HostGpus, label: str, value: str) -> tuple[Gpu, ...]:
    return _parse(host, label, value, lambda t: _by_index(host, label, t) if _is_index(t) else None)


def lsf_task_vars(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """LSF's per-task `CUDA_VISIBLE_DEVICES<N>` on this host, by N (1-based host-local task number).

    LSF MPI gives the task of local rank r its `CUDA_VISIBLE_DEVICES<r+1>` as
    CUDA_VISIBLE_DEVICES and leaves every `<N>` variable in each task's
    environment (open-mpi/ompi `orte/mca/schizo/ompi/schizo_ompi.c`,
    `parse_rank_specific_launcher_settings`).
    """
    found = [(int(k[len(CVD):]), k, v) for k, v in prefixed(env, CVD).items() if _is_lsf_task_var(k)]
    return [(k, v) for _, k, v in sorted(found)]


def _lsf(env: Mapping[str, str], host: HostGpus, allowed: frozenset[int] | None) -> Allocation | None:
    """The job's GPUs here: CUDA_VISIBLE_DEVICES and every task's `CUDA_VISIBLE_DEVICES<N>`, together.

    One container per node serves all the node's tasks, while a task's own
    CUDA_VISIBLE_DEVICES is its share only; the job-level value (when LSF
    sets one) and the tasks' values together are the node's allocation.
    """
    sources = ([(CVD, env[CVD])] if CVD in env else []) + lsf_task_vars(env)
    if not sources:
        return None
    label = "; ".join(f"{k}={v}" for k, v in sources)
    job = f"LSF job {env.get('LSB_JOBID')}"
    tasks = f" (the union over {len(sources)} variables: a task's CUDA_VISIBLE_DEVICES is its share only)" \
        if len(sources) > 1 else ""
    inside = [g for g in _usable(host) if g.minor in allowed] if allowed is not None else []

    def reader(var_label: str) -> Callable[[str], Gpu | None]:
        def token(tok: str) -> Gpu | None:
            if not _is_index(tok):
                return None
            if allowed is None:
                return _by_index(host, var_label, tok)
            if int(tok) >= len(inside):
                raise RequestError(f"{var_label}: GPU {tok} does not exist in this job's device cgroup, which "
                                   f"allows {len(inside)} GPU(s) (LSF renumbers them from 0)")
            return inside[int(tok)]
        return token

    found = {g.minor: g for k, v in sources for g in _parse(host, f"{k}={v}", v, reader(f"{k}={v}"))}
    gpus = tuple(sorted(found.values(), key=lambda g: g.index or 0))
    if allowed is None:
        return Allocation("LSF", label, gpus, f"{job}: {label}: host GPUs {_indices(gpus)} "
                                              f"(global indices: the job is not in a device cgroup){tasks}")
    return Allocation("LSF", label, gpus, f"{job}: {label} counts the {len(inside)} GPU(s) of its device cgroup "
                                          f"from 0: host GPUs {_indices(gpus)}{tasks}")


# The schedulers below write CUDA_VISIBLE_DEVICES (`value`, `label` = "CUDA_VISIBLE_DEVICES=<value>").


def _torque(env: Mapping[str, str], host: HostGpus, value: str, label: str) -> Allocation:
    gpus = _global_indices(host, label, value)
    note = " (PBS_GPUFILE lists every node's GPUs; this node's are these)" if env.get(GPUFILE) else ""
    return Allocation("Torque", label, gpus, f"Torque job {env.get('PBS_JOBID')}: {label}: host GPUs "
                                             f"{_indices(gpus)} (global indices){note}")


def _torque_gpufile(env: Mapping[str, str], host: HostGpus, node: str | None) -> Allocation | None:
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
    gpus = tuple(_by_index(host, f"{label} ({node}-gpu{n})", str(n)) for n in nums)
    return Allocation("Torque", label, gpus, f"{job}: {label}, the lines of this node ({node}): host GPUs "
                                             f"{_indices(gpus)} (global indices; {CVD} is not set)")


def _openpbs(env: Mapping[str, str], host: HostGpus, value: str, label: str) -> Allocation:
    job = f"OpenPBS job {env.get('PBS_JOBID')}"
    if not value.strip():
        return Allocation("OpenPBS", label, (), f"{job} without GPUs ({CVD} is empty)")

    def token(tok: str) -> Gpu | None:
        if tok[:4].upper() == "GPU-":
            return _by_uuid(host, label, tok)
        return _by_minor(host, label, tok) if _is_index(tok) else None  # PBS Pro <= 19: /dev/nvidiaN minors

    gpus = _parse(host, label, value, token)
    return Allocation("OpenPBS", label, gpus, f"{job}: {label}: host GPUs {_indices(gpus)}")


def _flux(env: Mapping[str, str], host: HostGpus, value: str, label: str) -> Allocation:
    job = f"Flux job {env.get('FLUX_JOB_ID')}"
    if value.strip() == "-1":
        return Allocation("Flux", label, (), f"{job} without GPUs ({label})")
    gpus = _global_indices(host, label, value)
    return Allocation("Flux", label, gpus, f"{job}: {label}: host GPUs {_indices(gpus)} (global indices = PCI order)")


def scheduler_of(env: Mapping[str, str]) -> str | None:
    """The scheduler whose job this environment belongs to, by the variables each one always sets."""
    if any(env.get(v, "").strip() for v in SLURM_VARS):
        return "Slurm"
    if CONDOR_ASSIGNED in env or env.get("BATCH_SYSTEM") == "HTCondor":
        return "HTCondor"
    if env.get("LSB_JOBID"):
        return "LSF"
    if env.get("PBS_JOBID"):
        if env.get("PBS_GPUFILE") or env.get("PBS_VERSION", "").upper().startswith("TORQUE"):
            return "Torque"
        return "OpenPBS"
    if env.get("FLUX_JOB_ID"):
        return "Flux"
    return None


def job_allocation(env: Mapping[str, str], host: HostGpus,
                   allowed_minors: frozenset[int] | None = None, *, node: str | None = None) -> Allocation | None:
    """The job's GPUs on this node; None outside a job or when its scheduler set no GPU variable.

    `allowed_minors`: the GPU minors the device cgroup this process runs in
    allows (None: not confined, or cannot tell); LSF's renumbered ids are
    read inside it.  `node`: the host name Torque's GPU file is matched by
    (None: this machine's).  Raises RequestError (one line, naming the
    variable) for a value that names no GPU of this host, or a GPU file
    that cannot be read.
    """
    which = scheduler_of(env)
    if which is None:
        return None
    if which == "Slurm":
        return _slurm(env, host)
    if which == "HTCondor":
        return _condor(env, host)
    if which == "LSF":
        return _lsf(env, host, allowed_minors)
    value = env.get(CVD)
    if value is None:
        return _torque_gpufile(env, host, node) if which == "Torque" else None
    label = f"{CVD}={value}"
    if which == "Torque":
        return _torque(env, host, value, label)
    if which == "OpenPBS":
        return _openpbs(env, host, value, label)
    return _flux(env, host, value, label)
