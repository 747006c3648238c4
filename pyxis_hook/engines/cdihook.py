"""`pyxis-hook cdi hook STEP`: the createContainer hooks a CDI spec names (`engines.cdi` writes them).

Each step is a one-step Plan applied by the prestart hook's code
(`apply.apply_plan`), under the prestart hook's rules (docs/security.md):

- The rootfs is pinned, never resolved by name.  config.json's `root.path`
  can be changed by whoever owns the bundle after the runtime read it; a
  hook that followed it would make links and rewrite ld.so.cache in a host
  directory (the CVE-2024-0132/-0134 class).  `rootpin.hook_processes`
  finds the container's process (runc and crun run these hooks from the
  container's init inside its namespaces, with a state pid of their own
  numbering; Apptainer's OCI engine on the host with the host pid), and
  `rootpin.pin_rootfs` holds the rootfs the runtime set up as an fd: the
  image is read through it and written through it only.  Bundles others
  can write are warned about or refused (`bundleperm`), as by prestart.
- The host's library wins over the image's copy: at a link path where the
  image keeps a regular (or special) file, `plan.link_edit` decides as for
  prestart, and the bind's source is the runtime's mount of the host's
  file inside the rootfs (the spec's mount at the link's target), opened
  in the container's namespace without following the image's symlinks
  (`apply.mounts.open_in_rootfs`).
"""

from __future__ import annotations

import os

from pyxis_hook.engines.cdi import CDI_COMPAT_CAPABILITIES, DRIVER_VERSION_PATTERN, HOST_DRIVER_VERSION_FLAG
from pyxis_hook.errors import UsageError
from pyxis_hook.host import gpus, gpuscan
from pyxis_hook.host.inventory import DriverFile
from pyxis_hook.plan.build import (ContainerFacts, Plan, ProcDriverView, SymlinkEdit, cuda_compat, ldcache_update,
                                   link_edit, patch_params)
from pyxis_hook.plan.container import container_facts, link_occupants
from pyxis_hook.record import replace

HOOK_STEPS = ("create-symlinks", "update-ldcache", "proc-driver")
#: a link chain longer than this (libcuda.so -> libcuda.so.1 -> libcuda.so.535.x is 2) is not followed
_MAX_CHAIN = 8


def parse_link(text: str):
    """`--link PATH::TARGET` -> SymlinkEdit; PATH must be absolute (it is resolved inside the rootfs)."""

    path, sep, target = text.partition("::")
    if not sep or not path.startswith("/") or not target or "\0" in text:
        raise UsageError(f"--link {text!r}: expected /ABSOLUTE/PATH::TARGET")
    return SymlinkEdit(os.path.normpath(path), target)


def parse_lib(text: str) -> tuple[str, str, str, int]:
    """`--lib /DIR/NAME::SONAME::FLAGS` -> the (dir, name, soname, flags) row of LdcacheUpdate.libs."""

    parts = text.split("::")
    try:
        path, soname, flags = parts
        value = int(flags, 0)
    except ValueError:
        raise UsageError(f"--lib {text!r}: expected /DIR/NAME::SONAME::FLAGS") from None
    d, name = os.path.split(path)
    if not path.startswith("/") or not name or not soname or "/" in soname or not 0 <= value <= 0xFFFFFFFF:
        raise UsageError(f"--lib {text!r}: expected /DIR/NAME::SONAME::FLAGS (flags a 32-bit cache flag value)")
    return (d, name, soname, value)


def link_plan(rootfs: str, links: tuple, view: str) -> Plan:
    """create-symlinks: each link as `plan.link_edit` decides it on what the image holds there.

    `view` reaches the image (the pinned rootfs).  Nothing or a symlink of
    the image: our symlink.  A file of the image: a read-only bind over it
    whose source is the file the link chain ends at, followed through our
    own links, never the image's (`libcuda.so -> libcuda.so.1 ->
    libcuda.so.535.x`): the spec's mount of the host's library there.  A
    directory: skipped, with the warning in the notes.
    """

    occupants = link_occupants(view, [s.container_path for s in links])
    if not occupants:
        return Plan(rootfs=rootfs, symlinks=tuple(links))
    facts = ContainerFacts(rootfs=rootfs, link_occupants=occupants)
    ends = {s.container_path: os.path.normpath(os.path.join(os.path.dirname(s.container_path), s.target))
            for s in links}
    symlinks, mounts, notes = [], [], []
    for s in links:
        end = ends[s.container_path]
        for _ in range(_MAX_CHAIN):
            if end not in ends:
                break
            end = ends[end]
        library = DriverFile(kind="lib", capability="", path=end, host_path=end, name=os.path.basename(end))
        edit, note = link_edit(s.container_path, s.target, library, facts)
        if isinstance(edit, SymlinkEdit):
            symlinks.append(edit)
        elif edit is not None:
            mounts.append(replace(edit, in_rootfs=True))  # apply logs its `covers` warning when it binds
        elif note:
            notes.append(note)
    return Plan(rootfs=rootfs, mounts=tuple(mounts), symlinks=tuple(symlinks), notes=tuple(notes))


def check_arguments(step: str, links=(), folders=(), libs=(), host_driver_version: str = "") -> None:
    """A bad argument is a UsageError before anything is looked at (the spec, not the container, is wrong)."""

    if step not in HOOK_STEPS:
        raise UsageError(f"cdi hook {step!r}: expected one of {', '.join(HOOK_STEPS)}")
    for x in links:
        parse_link(x)
    for x in libs:
        parse_lib(x)
    bad = [d for d in folders if not d.startswith("/")]
    if bad:
        raise UsageError(f"--folder {bad[0]!r}: not an absolute path")
    if host_driver_version and not DRIVER_VERSION_PATTERN.fullmatch(host_driver_version):
        shown = host_driver_version if len(host_driver_version) <= 40 else host_driver_version[:40] + "..."
        raise UsageError(f"{HOST_DRIVER_VERSION_FLAG} {shown!r}: expected a driver version such as 535.104.05")


def hook_plan(step: str, bundle, config, *, links: tuple[str, ...] = (), folders: tuple[str, ...] = (),
              libs: tuple[str, ...] = (), host_driver_version: str = "", view: str | None = None) -> Plan:
    """The one-step Plan a CDI hook applies to `bundle` (an oci.Bundle), reading the image through `view`.

    `view` is the pinned rootfs (`rootpin.PinnedRoot.view`); None reads
    `bundle.rootfs` by name (tests and dry runs only).  The plan names
    `bundle.rootfs`.  update-ldcache with `host_driver_version` applies CUDA
    forward compat as the prestart hook does: `plan.cuda_compat` on the
    image's `container_facts` for CDI_COMPAT_CAPABILITIES, and
    `ldcache_update(compat=...)` puts COMPAT_DIR in `first_dirs`.  The
    pyxis.conf read now counts too: `cuda-compat = "disabled"` turns it off
    without regenerating the spec.
    """

    check_arguments(step, links, folders, libs, host_driver_version)
    rootfs = bundle.rootfs
    view = view or rootfs
    if step == "create-symlinks":
        return link_plan(rootfs, tuple(parse_link(x) for x in links), view)
    if step == "update-ldcache":

        rows = tuple(parse_lib(x) for x in libs)
        facts = replace(container_facts(view), rootfs=rootfs)
        use, note = False, ""
        if host_driver_version:
            use, note = cuda_compat(config, CDI_COMPAT_CAPABILITIES, facts, host_driver_version)
        update, problems = ldcache_update(config, facts, tuple(folders), rows, compat=use)
        if problems:
            raise UsageError(problems[0])
        why = "CDI update-ldcache hook" + (f"; {update.why}" if use else "")
        return Plan(rootfs=rootfs, ldcache=replace(update, why=why), notes=(note,) if note else ())
    if step == "proc-driver":

        files = gpuscan.read_proc_driver_files(config.proc_root)
        if files is None:
            return Plan(rootfs=rootfs, notes=("no /proc/driver/nvidia on this host: no view",))
        host = gpuscan.discover_gpus(config.proc_root, config.dev_root)
        major = host.majors.nvidia or gpus.NVIDIA_MAJOR
        # the GPUs this container got: CDI put their nodes into config.json linux.devices
        minors = {d.minor for d in bundle.linux_devices
                  if d.type == "c" and d.major == major and d.path.startswith("/dev/nvidia")
                  and d.path[len("/dev/nvidia"):].isdigit()}
        dirs = tuple(g.proc_name or g.bus_id for g in host.gpus if g.minor in minors)
        files = tuple((n, patch_params(t) if n == "params" else t) for n, t in files)
        view_ = ProcDriverView(host_dir=os.path.join(config.proc_root, "driver/nvidia"), files=files, gpu_dirs=dirs)
        return Plan(rootfs=rootfs, proc_driver=view_)
    raise AssertionError(step)  # check_arguments refused any other step
