"""What the container asks for: devices, capabilities, requirements, MIG/IMEX, within the job's allocation.

`resolve_request` turns the container environment (config.json
`process.env`, last duplicate already applied), its annotations, the host's
GPUs (`gpus.HostGpus`) and pyxis.conf into a `Request`.  It is pure: no file
is read but the GPU file a Torque job without CUDA_VISIBLE_DEVICES names
(`spec.allocation`), so `plan` can show the decision for any environment and the tests
can try every form.  The rules are NCT's (hook) and libnvidia-container's
(CLI: `src/cli/common.c`, `src/cli/dsl.c`); the Slurm policy is docs/slurm.md's:

* NVIDIA_VISIBLE_DEVICES unset/empty/`void` -> void: not a GPU container,
  nothing is injected and nothing else is even parsed (as NCT exits early).
* Indices are *host* indices (rank in PCI order, `host/gpus.py`), the numbering
  Slurm's SLURM_STEP_GPUS/SLURM_JOB_GPUS use, never `/dev/nvidiaN` minors.
* Under `slurm-policy = "allocation"` the job's allocation bounds the
  selection, whichever scheduler made it (`spec.allocation`, docs/schedulers.md):
  `all` means the allocation, an explicit GPU outside it is an error.
  CUDA_VISIBLE_DEVICES bounds only as the allocation of a scheduler that
  writes it (LSF, PBS, Torque, HTCondor, Flux); it never selects anything
  (it is renumbered per task and user-editable) and is otherwise only
  checked against what the container will see.
* `allowed_minors` (from the hook's own device cgroup) is a hard bound too
  (and the set an LSF job's renumbered ids count in).
* The allocation is the scheduler's, never the image's: a caller holding the
  two apart passes `allocation.request_env(container, scheduler)` as `env`
  (the enroot mode does); `process.env` holds both as one list
  (docs/schedulers.md, "The allocation rule").

Every decision appends a sentence to `reasons`, which `plan` prints.
"""

from __future__ import annotations


from pyxis_hook.spec import require
from pyxis_hook.spec.allocation import is_index, job_allocation, scheduler_of
from pyxis_hook.nogpu import VISIBLE, is_legacy, split_tokens, void_reason
from pyxis_hook.spec.config import Config
from pyxis_hook.errors import RequestError
from pyxis_hook.host.gpus import Gpu, HostGpus, MigDevice
from pyxis_hook.record import record

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing is never imported at run time
    from typing import Mapping

    from pyxis_hook.spec.allocation.gpuforms import Allocation

CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES"
MIG_CONFIG = "NVIDIA_MIG_CONFIG_DEVICES"
MIG_MONITOR = "NVIDIA_MIG_MONITOR_DEVICES"
IMEX = "NVIDIA_IMEX_CHANNELS"
MAX_IMEX_CHANNEL = 1 << 20


@record
class Request:
    """The resolved request; `void` means: leave the container exactly as the runtime made it."""

    void: bool
    #: "void", "none" (driver files + control nodes, no GPU), "all" or "list"
    mode: str
    #: selected GPUs in host-index order (each also gets its /dev/nvidiaN)
    gpus: tuple[Gpu, ...] = ()
    #: selected MIG devices (their parent GPU's node is needed too: `gpu_minor`)
    mig_devices: tuple[MigDevice, ...] = ()
    #: sorted driver capabilities
    capabilities: tuple[str, ...] = ()
    #: requirements that were checked (and held); () when disabled or none
    requirements: tuple[require.Requirement, ...] = ()
    requirements_disabled: bool = False
    mig_config: bool = False
    mig_monitor: bool = False
    imex_channels: tuple[int, ...] = ()
    #: what CUDA_VISIBLE_DEVICES the container needs to see every selected device (None: void)
    cuda_visible_devices: str | None = None
    #: host indices of the job's allocation in force, None when no allocation bounds the request
    allocation: tuple[int, ...] | None = None
    #: e.g. "SLURM_STEP_GPUS=0,1" ("" when no allocation)
    allocation_source: str = ""
    #: the batch scheduler the allocation came from ("Slurm", "LSF", ...; "" when none)
    scheduler: str = ""
    #: legacy CUDA_VERSION image (NCT `IsLegacy`)
    legacy: bool = False
    #: things the user should fix but that do not stop the container
    warnings: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()

    @property
    def gpu_minors(self) -> tuple[int, ...]:
        """Minors of every /dev/nvidiaN the container gets: selected GPUs and MIG parents."""
        return tuple(sorted({g.minor for g in self.gpus} | {m.gpu_minor for m in self.mig_devices}))


# ----------------------------------------------------------------- host listing for errors


# ----------------------------------------------------------------- the job's allocation


def _job_allocation(env: Mapping[str, str], host: HostGpus, config: Config, allowed_minors: frozenset[int] | None,
                    reasons: list[str]) -> Allocation | None:
    if config.slurm_policy == "ignore":
        if scheduler_of(env) is not None:
            reasons.append("slurm-policy is 'ignore': the batch scheduler's GPU variables "
                           "(SLURM_STEP_GPUS/SLURM_JOB_GPUS, CUDA_VISIBLE_DEVICES, ...) are not read")
        return None
    found = job_allocation(env, host, allowed_minors)
    if found is not None:
        reasons.append(found.reason)
    return found


# ----------------------------------------------------------------- capabilities, MIG control, IMEX


def capabilities(env: Mapping[str, str], config: Config, legacy: bool, reasons: list[str]) -> tuple[str, ...]:
    supported = tuple(config.supported_capabilities)
    raw = env.get(CAPABILITIES)
    if raw is None and legacy:
        reasons.append(f"{CAPABILITIES} unset in a legacy CUDA_VERSION image: all supported capabilities")
        return tuple(sorted(supported))
    if not raw:
        caps = tuple(sorted(c for c in config.default_capabilities if c in supported))
        reasons.append(f"{CAPABILITIES} unset or empty: default capabilities {','.join(caps) or '(none)'}")
        return caps
    tokens = split_tokens(raw)
    if "all" in tokens:
        reasons.append(f"{CAPABILITIES}={raw}: 'all' = supported capabilities {','.join(sorted(supported))}")
        return tuple(sorted(supported))
    for tok in tokens:
        if tok not in supported:
            raise RequestError(f"unsupported capabilities found in '{raw}' (allowed '{','.join(supported)}')")
    caps = tuple(sorted(set(tokens)))
    reasons.append(f"{CAPABILITIES}={raw}: capabilities {','.join(caps) or '(none)'}")
    return caps


def _mig_control(env: Mapping[str, str], var: str, privileged: bool, specific_migs: bool,
                 reasons: list[str]) -> bool:
    value = env.get(var, "")
    if not value:
        return False
    short = var.removeprefix("NVIDIA_")
    if not privileged:
        raise RequestError(f"cannot set {short} in non privileged container ({var}={value})")
    tokens = split_tokens(value)
    if [t.lower() for t in tokens] != ["all"]:
        raise RequestError(f"{var}={value}: only 'all' devices are currently supported")
    if specific_migs:
        raise RequestError(f"{var}={value}: cannot be combined with specific MIG devices in {VISIBLE}")
    reasons.append(f"{var}=all: MIG {'configuration' if 'CONFIG' in var else 'monitoring'} access for all GPUs")
    return True


def _imex_channels(env: Mapping[str, str], legacy: bool, reasons: list[str]) -> tuple[int, ...]:
    raw = env.get(IMEX)
    if raw is None and legacy:
        raw = "all"
    tokens = split_tokens(raw or "")
    if not tokens or "void" in tokens or "none" in tokens:
        return ()
    if "all" in tokens:
        reasons.append(f"{IMEX}={raw}: 'all' is dropped (as in NCT); name channel ids to get them")
        return ()
    channels = set()
    for tok in tokens:
        if not is_index(tok) or int(tok) >= MAX_IMEX_CHANNEL:
            raise RequestError(f"{IMEX}={raw}: unsupported IMEX channel value {tok!r}")
        channels.add(int(tok))
    result = tuple(sorted(channels))
    reasons.append(f"{IMEX}={raw}: IMEX channels {','.join(map(str, result))}")
    return result


# ----------------------------------------------------------------- CUDA_VISIBLE_DEVICES consistency


def _cuda_visible(env: Mapping[str, str], gpus: tuple[Gpu, ...], migs: tuple[MigDevice, ...],
                  allocation: tuple[Gpu, ...] | None, reasons: list[str], warnings: list[str]) -> str:
    """What CUDA_VISIBLE_DEVICES the container needs, and whether its own value agrees.

    Inside the container CUDA enumerates only the injected GPUs, so they are
    local indices 0..n-1 (what Slurm sets under ConstrainDevices=yes); MIG
    devices are named by UUID.
    """
    n = len(gpus)
    needed_parts = [str(i) for i in range(n)]
    mig_uuids = [m.uuid for m in migs if m.uuid]
    needed_parts += mig_uuids
    needed = ",".join(needed_parts)
    actual = env.get("CUDA_VISIBLE_DEVICES")
    if actual is None:
        if n or migs:
            reasons.append(f"CUDA_VISIBLE_DEVICES is unset: CUDA will use every injected device ({needed or 'none'})")
        return needed
    if not n and not migs:  # nothing to disagree with: HTCondor's 10000, Flux's -1, PBS's empty value all agree
        reasons.append(f"CUDA_VISIBLE_DEVICES={actual}: the container gets no GPU, CUDA will see none")
        return needed
    tokens = split_tokens(actual)
    if not tokens:
        warnings.append(f"CUDA_VISIBLE_DEVICES is set but empty: CUDA will see none of the {n + len(migs)} "
                        f"injected device(s); use CUDA_VISIBLE_DEVICES={needed} or unset it")
        return needed
    if actual.strip() == "NoDevFiles":
        warnings.append("CUDA_VISIBLE_DEVICES=NoDevFiles (pre-19.05 Slurm: no GPU allocated): CUDA will see no device")
        return needed
    uuids = {g.uuid.lower() for g in gpus if g.uuid} | {u.lower() for u in mig_uuids}
    bad = []
    for tok in tokens:
        if is_index(tok):
            if int(tok) >= n:
                bad.append(tok)
        elif tok[:4].upper() in ("GPU-", "MIG-"):
            if tok.lower() not in uuids and not (tok[:4].upper() == "MIG-" and migs and not mig_uuids) \
                    and sum(1 for u in uuids if u.startswith(tok.lower())) != 1:  # CUDA takes a unique prefix
                bad.append(tok)
        else:
            bad.append(tok)
    if bad:
        msg = (f"CUDA_VISIBLE_DEVICES={actual} disagrees with the injected devices: {','.join(bad)} "
               f"will not exist in the container, which sees {n} GPU(s); use CUDA_VISIBLE_DEVICES={needed} "
               f"or unset it")
        if allocation is not None and [t for t in tokens if is_index(t)] == [str(g.index) for g in allocation] \
                and n and any(g.index != i for i, g in enumerate(allocation)):
            msg += " (these are Slurm's global indices: is ConstrainDevices=yes set in cgroup.conf?)"
        warnings.append(msg)
    elif len(set(tokens)) < n + len(mig_uuids):
        reasons.append(f"CUDA_VISIBLE_DEVICES={actual} selects a subset of the {n} injected GPU(s) ({needed})")
    else:
        reasons.append(f"CUDA_VISIBLE_DEVICES={actual} agrees with the injected devices")
    return needed


# ----------------------------------------------------------------- main entry


def void_request(env: Mapping[str, str]) -> Request | None:
    """The void Request when the container asks for no GPU at all, else None.

    Needs nothing but the env, so `prestart` can exit before loading the
    inventory or reading /proc (design.md: the hot path "exits at once when
    the container asked for no GPU").  `resolve_request` gives the same answer.
    """
    why = void_reason(env)
    return None if why is None else Request(void=True, mode="void", legacy=is_legacy(env), reasons=(why,))


def resolve_request(
    env: Mapping[str, str],
    annotations: Mapping[str, str],
    host: HostGpus,
    config: Config,
    allowed_minors: frozenset[int] | None = None,
    *,
    cuda_version: str | None = None,
    privileged: bool = False,
) -> Request:
    """Resolve what the container asked for; raise RequestError/RequirementError (one line) if impossible.

    `allowed_minors`: GPU minors the hook's device cgroup allows (None = not
    confined).  `cuda_version` (`major.minor`, from the inventory) feeds
    `cuda` requirements (None: unknown, and a cuda condition fails).  `privileged`
    (CAP_SYS_ADMIN in the bounding set, `oci.Bundle.privileged`) gates MIG
    config/monitor like NCT.
    """
    reasons: list[str] = []
    warnings: list[str] = []
    legacy = is_legacy(env)

    void = void_request(env)
    if void is not None:
        return void
    raw = env.get(VISIBLE)
    if raw is None and legacy:
        raw = "all"
        reasons.append(f"{VISIBLE} unset in a legacy image (CUDA_VERSION set, NVIDIA_REQUIRE_CUDA unset): 'all'")
    tokens = split_tokens(raw or "")
    special = next((t for t in tokens if t in ("all", "none")), None)
    if special is None and any(t.lower() == "all" for t in tokens):
        special = "all"  # the CLI accepts 'all' in any case
    mode = special or "list"

    job = _job_allocation(env, host, config, allowed_minors, reasons)
    allocation = None if job is None else job.gpus
    allocation_source = "" if job is None else job.source
    allowed_by_slurm = None if allocation is None else {g.minor for g in allocation}

    def check_allowed(tok: str, gpu: Gpu, what: str) -> None:
        if allowed_by_slurm is not None and gpu.minor not in allowed_by_slurm:
            raise RequestError(f"{what} {tok} is not in this job's allocation ({allocation_source})")
        if allowed_minors is not None and gpu.minor not in allowed_minors:
            allowed = ",".join(map(str, sorted(allowed_minors))) or "none"
            raise RequestError(f"{what} {tok} (/dev/nvidia{gpu.minor}) is not allowed by this process's device "
                               f"cgroup (allowed GPU minors: {allowed})")

    gpus: dict[int, Gpu] = {}
    migs: dict[tuple[int, int, int], MigDevice] = {}
    if mode == "none":
        reasons.append(f"{VISIBLE}={raw}: 'none': driver files and control nodes, no GPU")
    elif mode == "all":
        candidates = [g for g in host.gpus if g.index is not None and not g.excluded]
        dropped = []
        for g in candidates:
            if (allowed_by_slurm is None or g.minor in allowed_by_slurm) and \
                    (allowed_minors is None or g.minor in allowed_minors):
                gpus[g.minor] = g
            else:
                dropped.append(g)
        for m in host.mig_devices:
            if m.gpu_minor in gpus:
                migs[(m.gpu_minor, m.gi, m.ci)] = m
        bound = []
        if job is not None:
            bound.append(f"the {job.scheduler} allocation ({allocation_source})")
        if allowed_minors is not None:
            bound.append("the device cgroup")
        reasons.append(f"{VISIBLE}={raw}: 'all' = every GPU" + (" within " + " and ".join(bound) if bound else
                                                                 " of the host") +
                       f": {len(gpus)} GPU(s)" + (f", {len(migs)} MIG device(s)" if migs else ""))
        if dropped:
            reasons.append("left out: GPU " + ", ".join(str(g.index) for g in dropped))
        if candidates and not gpus:
            warnings.append(f"{VISIBLE}={raw} selected no GPU: none of the host's GPUs is allowed here")
        elif not candidates:
            warnings.append(f"{VISIBLE}={raw} selected no GPU: this host has no usable GPU")
    else:
        from pyxis_hook.spec import devicelist  # the token grammar: read only by a request that names devices

        for tok in tokens:
            dev = devicelist.resolve_token(host, tok)
            if isinstance(dev, MigDevice):
                parent = host.gpu_by_minor(dev.gpu_minor)
                if parent is None:
                    raise devicelist.unknown(tok, host)
                check_allowed(tok, parent, "MIG device")
                migs[(dev.gpu_minor, dev.gi, dev.ci)] = dev
            else:
                check_allowed(tok, dev, "GPU")
                gpus[dev.minor] = dev
        reasons.append(f"{VISIBLE}={raw}: " + devicelist.selection(host, _sorted_gpus(gpus), _sorted_migs(host, migs))
                       + " (indices are host indices in PCI order)")

    sel_gpus = _sorted_gpus(gpus)
    sel_migs = _sorted_migs(host, migs)

    specific_migs = mode == "list" and bool(migs)
    mig_config = _mig_control(env, MIG_CONFIG, privileged, specific_migs, reasons)
    mig_monitor = _mig_control(env, MIG_MONITOR, privileged, specific_migs, reasons)
    caps = capabilities(env, config, legacy, reasons)
    imex = _imex_channels(env, legacy, reasons)

    disabled = require.requirements_disabled(env, config.disable_require)
    reqs = require.parse_requirements(env, config.disable_require)
    if disabled:
        reasons.append("requirements not checked: " + ("disable-require = true in pyxis.conf"
                                                       if config.disable_require else "NVIDIA_DISABLE_REQUIRE is true"))
    elif reqs:
        facts = require.HostFacts(cuda=cuda_version, driver=host.driver_version,
                                  devices=tuple(require.DeviceFacts() for _ in (*sel_gpus, *sel_migs)))
        require.check_requirements(reqs, facts)
        reasons.append("requirements hold: " + "; ".join(f"{r.variable}={r.expression}" for r in reqs) +
                       f" ({require.describe_host(facts)}; arch/brand are unknown without NVML and pass)")

    cvd = _cuda_visible(env, sel_gpus, sel_migs, allocation, reasons, warnings)

    if any(k.startswith("cdi.k8s.io/") for k in annotations):
        reasons.append("cdi.k8s.io/ annotations are for the runtime's CDI support and are ignored here")

    return Request(
        void=False,
        mode=mode,
        gpus=sel_gpus,
        mig_devices=sel_migs,
        capabilities=caps,
        requirements=reqs,
        requirements_disabled=disabled,
        mig_config=mig_config,
        mig_monitor=mig_monitor,
        imex_channels=imex,
        cuda_visible_devices=cvd,
        allocation=None if allocation is None else tuple(g.index for g in allocation),
        allocation_source=allocation_source,
        scheduler="" if job is None else job.scheduler,
        legacy=legacy,
        warnings=tuple(warnings),
        reasons=tuple(reasons + [f"warning: {w}" for w in warnings]),
    )


def _sorted_gpus(gpus: dict[int, Gpu]) -> tuple[Gpu, ...]:
    return tuple(sorted(gpus.values(), key=lambda g: (g.index, g.minor)))


def _sorted_migs(host: HostGpus, migs: dict[tuple[int, int, int], MigDevice]) -> tuple[MigDevice, ...]:
    def key(m: MigDevice) -> tuple[int, int, int]:
        parent = host.gpu_by_minor(m.gpu_minor)
        return (parent.index if parent is not None and parent.index is not None else 1 << 30, m.gi, m.ci)

    return tuple(sorted(migs.values(), key=key))
