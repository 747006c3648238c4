"""One container start: state -> bundle -> Request -> Inventory -> Plan (-> apply).

`prepare` is shared by `prestart` (which then applies), `plan` (which
prints) and the enroot mode (which builds a synthetic bundle), so the dry
run and the real run take every decision in the same code.
"""

from __future__ import annotations

import posix

from pyxis_hook import log, pathnames
from pyxis_hook.rootfs import read_to_end
from pyxis_hook.spec.config import Config
from pyxis_hook.plan.build import Plan
from pyxis_hook.record import record, replace

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: both are loaded by prepare() anyway, after the void check
    from pyxis_hook.host.inventory import Inventory
    from pyxis_hook.spec.request import Request

PROC_DRIVER_FILES = ("params", "version", "registry")
PROC_FILE_LIMIT = 1 << 20


@record
class Prepared:
    """Everything decided for one container; `inventory` is None for a void request.

    A plan from the decision cache comes without `request` and `inventory` (None).
    `allocated`: the GPUs are the batch scheduler's allocation (the enroot hook
    then exports the plan's env to the job).
    """

    request: Request | None
    inventory: Inventory | None
    plan: Plan
    allocated: bool = False


def read_proc_driver_files(proc_root: str) -> tuple[tuple[str, str], ...] | None:
    """The host's /proc/driver/nvidia texts the container's view copies; None without the module."""
    base = pathnames.join(proc_root, "driver/nvidia")
    if not pathnames.isdir(base):
        return None
    out = []
    for name in PROC_DRIVER_FILES:
        try:  # posix calls, not the io stack's three objects a file: every GPU start reads these
            data = read_to_end(posix.open(pathnames.join(base, name), posix.O_RDONLY | posix.O_CLOEXEC), PROC_FILE_LIMIT)
            out.append((name, data.decode("utf-8", "replace")))
        except FileNotFoundError:
            continue  # not every driver publishes every file
        except OSError as e:  # the start goes on; the container's view lacks the file, and the log says so
            log.warning(f"{pathnames.join(base, name)}: cannot read ({e.strerror}): "
                        "the container's /proc/driver/nvidia will not have it")
    return tuple(out)


def with_mig_uuids(inventory):
    """The inventory with MIG device UUIDs from NVML (procfs has none), for requests that name one.

    NVML is the driver's own libnvidia-ml (from the inventory, so a
    driver-root install is used, not whatever the hook's loader finds); it is
    loaded in this process, before any namespace is entered (should it start
    a thread, apply then enters the namespace from a forked, single-threaded child).
    """
    from pyxis_hook.host import inventory as inv_mod, nvml

    lib = next((f.host_path for f in inventory.files if f.kind == "lib" and f.soname == "libnvidia-ml.so.1"), None)
    if lib is None:
        # never a bare name: root's own loader would search LD_LIBRARY_PATH and the host's cache,
        # and load whatever libnvidia-ml it finds there, not the driver root's
        log.warning("MIG device UUIDs unknown: the driver has no libnvidia-ml.so.1 to ask")
        return inventory
    return inv_mod.with_host(inventory, nvml.fill_mig_uuids(inventory.host, lib))


def confinement(env, host, proc_root: str = "/proc", pid: int | str | None = None):
    """(env, allowed GPU minors) for a hook whose process `pid` may sit in a device cgroup.

    `allowed` is None when the cgroup does not narrow the host's GPUs or
    cannot tell (v2).  In a Slurm task cgroup the step's allocation on this
    node wins over the task's narrower view (`cgroup.gpu_bound`), and GPU
    variables that hold the task's renumbered view are set aside
    (`taskview`); the log says which source won.
    """
    from pyxis_hook.host import cgroup, gpus
    from pyxis_hook.plan import taskview

    pid = posix.getpid() if pid is None else pid
    bound = cgroup.gpu_bound(proc_root, pid, [g.minor for g in host.gpus], host.majors.nvidia or gpus.NVIDIA_MAJOR)
    allowed = None
    if bound is not None:
        allowed = bound.minors
        (log.info if bound.task_minors is not None else log.debug)(
            f"{bound.source}: GPU minors {','.join(map(str, sorted(bound.minors))) or 'none'}")
        if len(allowed) == len(host.gpus):
            allowed = None  # not confined
    if taskview.GPUS_ON_NODE in env:
        in_task = bound is not None and bound.task_minors is not None
        if not in_task:
            slurm = cgroup.read_slurm_cgroup(proc_root, pid)
            in_task = slurm is not None and slurm.task is not None
        env, notes = taskview.step_env(env, in_task)
        for note in notes:
            log.info(note)
    return env, allowed


def prepare(config: Config, bundle, *, state=None, check: bool = False, confine: bool = True,
            pin=None, cache: bool = False) -> Prepared:
    """Decide everything for `bundle` (an oci.Bundle); never touches the container.

    `check`: raise DriverError with the plan's first problem (what the hook
    and every mode that applies the plan want).  `confine`: bound the
    selection by the GPUs this process's device cgroup allows (a hook run
    inside a Slurm step); `plan` passes the same default, so the dry run
    decides as the real run does.  `pin`: called once the container asks for
    a GPU, before anything of its rootfs is read; it returns the path the
    image is read through (prestart's `rootpin.PinnedRoot.view`: the rootfs
    the runtime mounted, not whatever `bundle.rootfs` names by now).  The
    plan still names `bundle.rootfs`.  `cache`: take the plan from the
    decision cache when every input is as an earlier start found it
    (`plan.decisions`; the result then has no request or inventory), and
    keep this start's decision there otherwise.
    """
    from pyxis_hook import asks
    from pyxis_hook.spec import oci

    env = bundle.env_map()
    annotations = oci.state_annotations(state, bundle) if state is not None else bundle.annotation_map()
    if asks.void_reason(env) is not None:  # the rule request.void_request applies
        from pyxis_hook.spec.request import void_request

        void = void_request(env)
        return Prepared(void, None, Plan(rootfs=bundle.rootfs, notes=void.reasons))

    view = pin() if pin is not None else bundle.rootfs
    from pyxis_hook.spec import envreads

    looks = None
    if cache:  # fresh on every start, never from the snapshot; parsed again only when a look differs
        from pyxis_hook.host.gpumemo import start_gpus

        # GPUs that must be discovered are a new key: the start plans, so discovery's modules join the
        # planner's tier (`plan_tier`), not the image every start runs
        host, looks = start_gpus(config, on_miss=plan_tier)
    else:
        from pyxis_hook.host.gpuscan import discover_gpus

        host = discover_gpus(config.proc_root, config.dev_root)
    allowed = None
    if confine:
        env, allowed = confinement(env, host)
    proc_files = read_proc_driver_files(config.proc_root)
    lookup = None
    # NVML's MIG UUIDs and Torque's GPU file are read on every start
    if cache and not envreads.names_mig_uuid(env) and not envreads.reads_gpu_file(env):
        from pyxis_hook.plan import decisions

        lookup = decisions.Lookup(config, host, env, annotations, bundle.privileged, allowed, view, proc_files,
                                  gpu_looks=looks)
        cached = lookup.plan()
        log.debug(lookup.why)
        if cached is not None:
            plan, allocated = cached
            return _checked(Prepared(None, None, replace(plan, rootfs=bundle.rootfs), allocated), check)
        plan_tier()
        from pyxis_hook.plan import decisionkeep

        env = decisionkeep.ObservedEnv(env)  # records what the request reads of it, for the decision kept below

    from pyxis_hook.host import snapshot
    from pyxis_hook.plan.container import container_facts, with_occupants
    from pyxis_hook.plan.build import build_plan
    from pyxis_hook.spec import request as req

    seen: list = []
    inventory = snapshot.load_or_build(config, strict=False, host=host, seen=seen)
    host = inventory.host
    if envreads.names_mig_uuid(env) and any(m.uuid is None for m in host.mig_devices):
        inventory = with_mig_uuids(inventory)
        host = inventory.host
    cuda = None
    if inventory.cuda_version:
        from pyxis_hook.host.cudaversion import format_cuda_version

        cuda = format_cuda_version(inventory.cuda_version)
    request = req.resolve_request(env, annotations, host, config, allowed, cuda_version=cuda,
                                  privileged=bundle.privileged)
    # what the image holds where the libraries' links go decides link or cover (plan.link_edit)
    files = inventory.select(request.capabilities)
    # the lookup read the image's facts already: only the links' occupants depend on the request
    facts = with_occupants(lookup.facts, view, files) if lookup is not None else container_facts(view, files=files)
    if view != bundle.rootfs:
        facts = replace(facts, rootfs=bundle.rootfs)
    plan = build_plan(request, inventory, facts, config, proc_files=proc_files)
    allocated = request.allocation is not None
    if lookup is not None:
        log.debug(decisionkeep.save(lookup, env, inventory, files, facts, plan, allocated, seen))
    return _checked(Prepared(request, inventory, plan, allocated), check)


def plan_tier() -> None:
    """Load the start image's planning tier: the modules a start served by the decision cache never runs."""
    from pyxis_hook import startimage

    tier = startimage.load_tier("plan")
    if tier is not None:
        log.debug(tier.status)


def _checked(prepared: Prepared, check: bool) -> Prepared:
    """Log the plan's notes; with `check`, raise DriverError with its first problem."""
    for note in prepared.plan.notes:
        log.debug(note)
    if check and prepared.plan.problems:
        from pyxis_hook.errors import DriverError

        raise DriverError(prepared.plan.problems[0])
    return prepared
