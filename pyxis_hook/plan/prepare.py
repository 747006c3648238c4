"""The deciding part of a container start: bundle -> GPUs -> node artifact -> Request -> Plan.

`prepare` is shared by every container start (`pyxis_hook/pipeline.py`,
which then applies), `plan` (which prints), `precreate` and the enroot
mode, so the dry run and the real run take every decision in the same code.
Loaded only once a container asks for a GPU.
"""

from __future__ import annotations

import posix

from pyxis_hook import log, nogpu
from pyxis_hook.errors import DriverError
from pyxis_hook.host import artifact, cgroup, gpus
from pyxis_hook.host.cudaversion import format_cuda_version
from pyxis_hook.host.gpuscan import discover_gpus, read_proc_driver_files
from pyxis_hook.plan.build import Plan, build_plan
from pyxis_hook.plan import taskview
from pyxis_hook.plan.container import container_facts
from pyxis_hook.record import record, replace
from pyxis_hook.spec import envreads, oci
from pyxis_hook.spec import request as req
from pyxis_hook.spec.config import Config

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only
    from pyxis_hook.host.inventory import Inventory
    from pyxis_hook.spec.request import Request


@record
class Prepared:
    """Everything decided for one container; `inventory` is None for a void request.

    `artifact`: how the driver's inventory was got (`artifact.obtain`'s word), for the start's record.
    `allocated`: the GPUs are the batch scheduler's allocation (the enroot hook
    then exports the plan's env to the job).
    """

    request: Request | None
    inventory: Inventory | None
    plan: Plan
    allocated: bool = False
    artifact: str = ""


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


def confinement(env, host, proc_root: str = "/proc", pid: int | str | None = None, own_table: str | None = None):
    """(env, allowed GPU minors) for a hook whose process `pid` may sit in a device cgroup.

    `allowed` is None when the cgroup does not narrow the host's GPUs or
    cannot tell (v2).  In a Slurm task cgroup the step's allocation on this
    node wins over the task's narrower view (`cgroup.gpu_bound`), and GPU
    variables that hold the task's renumbered view are set aside
    (`taskview`); the log says which source won.  `own_table`: this
    process's mount table as the start read it already (`prepare`'s).
    """
    pid = posix.getpid() if pid is None else pid
    bound = cgroup.gpu_bound(proc_root, pid, [g.minor for g in host.gpus], host.majors.nvidia or gpus.NVIDIA_MAJOR,
                             mountinfo=own_table if proc_root == "/proc" else None)
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
            view: str | None = None, stored=None, own_table: str | None = None) -> Prepared:
    """Decide everything for `bundle` (an oci.Bundle); never touches the container.

    The stages, in order: the no-GPU answer; the GPUs read now and the
    device cgroup's bound; the node artifact; the request against the
    job's allocation; the driver files selected for its capabilities; the
    image's facts; the plan.  `check`: raise DriverError with the plan's
    first problem.  `confine`: bound the selection by this process's device
    cgroup (`plan` passes the default too, so the dry run decides as the
    start does).  `view`: the path the image is read through (a start's
    pinned rootfs, `rootpin.PinnedRoot.view`); the plan still names
    `bundle.rootfs`.  `stored`: the node artifact as loading `config` read
    it (`spec.config.read_config`), for `artifact.obtain`.  `own_table`: this
    process's mount table as the start read it (`rootpin.PinnedRoot.own_table`).
    """
    env = bundle.env_map()
    annotations = oci.state_annotations(state, bundle) if state is not None else bundle.annotation_map()
    if nogpu.void_reason(env) is not None:  # the rule request.void_request applies
        void = req.void_request(env)
        return Prepared(void, None, Plan(rootfs=bundle.rootfs, notes=void.reasons))
    view = view or bundle.rootfs
    host = discover_gpus(config.proc_root, config.dev_root)
    allowed = None
    if confine:
        env, allowed = confinement(env, host, own_table=own_table)
    proc_files = read_proc_driver_files(config.proc_root)
    inventory, source = artifact.obtain(config, strict=False, host=host, stored=stored)
    if envreads.names_mig_uuid(env) and any(m.uuid is None for m in inventory.host.mig_devices):
        inventory = with_mig_uuids(inventory)
    cuda = format_cuda_version(inventory.cuda_version) if inventory.cuda_version else None
    request = req.resolve_request(env, annotations, inventory.host, config, allowed, cuda_version=cuda,
                                  privileged=bundle.privileged)
    files = inventory.select(request.capabilities)
    # what the image holds where the libraries' links go decides link or cover (plan.link_edit)
    facts = container_facts(view, files=files)
    if view != bundle.rootfs:
        facts = replace(facts, rootfs=bundle.rootfs)
    plan = build_plan(request, inventory, facts, config, proc_files=proc_files)
    return _checked(Prepared(request, inventory, plan, request.allocation is not None, source), check)


def _checked(prepared: Prepared, check: bool) -> Prepared:
    """Log the plan's notes; with `check`, raise DriverError with its first problem."""
    for note in prepared.plan.notes:
        log.debug(note)
    if check and prepared.plan.problems:
        raise DriverError(prepared.plan.problems[0])
    return prepared
