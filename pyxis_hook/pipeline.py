"""A container start that asks for a GPU, stage by stage: the table of contents of the hook.

Every kind of start enters here from `pyxis_hook.start` (or the CLI):
`prestart` (the runtime's hook: OCI state on stdin, the bundle's
config.json), `enroot` (enroot's hook: its environment and env file) and
`cdi_step` (one createContainer hook of a CDI spec).  Each runs the same
stages, top to bottom:

1. documents: what the container is and asks (`documents`, `engines.enroot.documents`);
2. the no-GPU exit (`nogpu.void_reason`);
3. pin the rootfs: the image is read and changed through one fd from here on (`rootpin.pin_bundle`);
4. decide (`plan.prepare.prepare`): the GPUs read now and the device cgroup's bound, the node
   artifact (`host.artifact.load_or_build`), the request against the job's allocation
   (`spec.request.resolve_request`), the driver files selected for its capabilities, the image's
   facts (`plan.container.container_facts`), the plan (`plan.build.build_plan`);
5. apply, in the container's mount namespace (`apply.child.apply_plan`);
6. the start's record in the system log (`log.start_record`: what it gave, and how it got the
   driver's inventory).

Each stage raises a PyxisHookError for what the user must fix; the caller
(`start.run_started`, `cli.main`) turns it into the one error line.
"""

from __future__ import annotations

from pyxis_hook import log, nogpu
from pyxis_hook.apply import rootpin
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.host import artifact
from pyxis_hook.plan.prepare import prepare
from pyxis_hook.record import replace
from pyxis_hook.spec import oci

#: what the start in progress is for, as far as it got (`start.pipeline_container` names it in a failure's record)
current: dict[str, str] = {}


def _record(container: str, prepared) -> None:
    """The system log's record of a start that gave its GPUs (`log.start_record`)."""
    plan = prepared.plan
    gpus = ",".join(d.path[len("/dev/nvidia"):] for d in plan.devices if d.path[len("/dev/nvidia"):].isdigit())
    log.start_record("ok", {"container": container, "gpus": gpus or "none", "devices": len(plan.devices),
                            "mounts": len(plan.mounts), "artifact": prepared.artifact})


def documents(stdin_bytes: bytes, bundle_dir: str | None = None, docs: tuple | None = None):
    """(oci.State, oci.Bundle) of a `prestart`: from `docs` (`start.first_look`'s) when they are the files it would read."""
    if docs is None or bundle_dir is not None:
        state = oci.parse_state(stdin_bytes)
        return state, oci.load_bundle(bundle_dir or state.bundle)
    state_doc, config_path, config_doc = docs
    state = oci.state_from_doc(state_doc)
    if oci.config_path_of(state.bundle) != config_path:  # '..', '.' or '//' in the bundle path: read what it names
        return state, oci.load_bundle(state.bundle)
    return state, oci.bundle_from_doc(config_doc, config_path[:-len("/config.json")] or "/", config_path)


def prestart(config, stdin_bytes: bytes, bundle_dir: str | None = None, docs: tuple | None = None,
             stored=None) -> int:
    """The OCI prestart/createRuntime hook: the container gets its GPUs, or a PyxisHookError says why not.

    `stored`: the node artifact as loading `config` read it (`spec.config.read_config`), else read when needed.
    """
    state, bundle = documents(stdin_bytes, bundle_dir, docs)
    current["container"] = state.id
    void = nogpu.void_reason(bundle.env_map())
    if void is not None:
        log.debug(f"container {state.id}: {void}")
        _keep_verdict(stored)
        return 0
    pinned = rootpin.pin_bundle(bundle, state.pid, config.writable_bundle, f"container {state.id}")
    try:
        prepared = prepare(config, bundle, state=state, check=True, view=pinned.view, stored=stored,
                           own_table=pinned.own_table)
        plan = prepared.plan
        log.info(f"container {state.id}: {len(plan.devices)} devices, {len(plan.mounts)} mounts, "
                 f"ldcache {plan.ldcache.mode}")
        apply_plan(plan, state.pid, config, root=pinned)
    finally:
        pinned.close()
    _record(state.id, prepared)
    return 0


def enroot(config, environ: dict[str, str], stored=None) -> int:
    """enroot's hook: the container `ENROOT_PID`/`ENROOT_ROOTFS` name gets its GPUs (enroot programs no cgroup).

    `stored`: as `prestart`'s.
    """
    from pyxis_hook.engines import enroot as enroot_engine  # enroot's starts only: a runtime's never run it

    current["container"] = environ.get("ENROOT_ROOTFS", "").rstrip("/").rpartition("/")[2] or "enroot"
    doc = enroot_engine.documents(environ)
    bundle = enroot_engine.synthetic_bundle(doc.rootfs, dict(doc.env))
    void = nogpu.void_reason(bundle.env_map())
    if void is not None:
        log.debug(f"enroot container {doc.pid}: {void}")
        enroot_engine.append_environ(doc.environ_path, doc.honoured)
        _keep_verdict(stored)
        return 0
    config = replace(config, no_cgroups=True)
    prepared = prepare(config, bundle, check=True, stored=stored)
    plan = prepared.plan
    log.info(f"enroot container {doc.pid}: {len(plan.devices)} devices, {len(plan.mounts)} mounts")
    # written before the mounts: a failed write leaves nothing mounted, and a failed apply makes
    # enroot refuse the container, whose environment file is then never read
    enroot_engine.append_environ(doc.environ_path, doc.honoured + (plan.env if prepared.allocated else ()))
    apply_plan(plan, doc.pid, config)
    _record(current["container"], prepared)
    return 0


def cdi_step(config, step: str, stdin_bytes: bytes, *, links=(), folders=(), libs=(),
             host_driver_version: str = "") -> int:
    """One createContainer hook of a CDI spec: the state read, the rootfs pinned, the step planned and applied there."""
    from pyxis_hook.engines import cdihook  # the spec's argument model (`re`, `os`): no other start loads it

    cdihook.check_arguments(step, links, folders, libs, host_driver_version)
    state = oci.parse_state(stdin_bytes, require_pid=False, allow_zero_pid=True)
    bundle = oci.load_bundle(state.bundle)
    pid, ref = rootpin.hook_processes(state.pid or 0)
    pinned = rootpin.pin_bundle(bundle, pid, config.writable_bundle, f"container {state.id}: cdi hook {step}", ref=ref)
    try:
        plan = cdihook.hook_plan(step, bundle, config, links=tuple(links), folders=tuple(folders), libs=tuple(libs),
                                 host_driver_version=host_driver_version, view=pinned.view)
        for note in plan.notes:  # the cuda-compat decision, a link path the image holds a directory at
            if note.startswith("warning: "):
                log.warning(f"container {state.id}: cdi hook {step}: {note[len('warning: '):]}")
            else:
                log.info(f"container {state.id}: cdi hook {step}: {note}")
        if not (plan.empty and plan.ldcache.mode == "none"):
            apply_plan(plan, pid, config, root=pinned)  # hook plans carry no cgroup rules
    finally:
        pinned.close()
    return 0


def _keep_verdict(stored) -> None:
    """A start that reads no node artifact further still records pyxis.conf's new verdict (`stored`), as one that does."""
    if stored is not None:
        artifact.record_verdict(stored)
