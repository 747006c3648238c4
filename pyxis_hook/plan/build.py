"""The plan: a declarative description of everything the hook will do to a container.

`build_plan` is pure (Request + Inventory + ContainerFacts -> Plan).  The
plan is what `pyxis-hook plan` prints, what `cdi generate` turns into CDI
containerEdits, and the only input of `apply.apply_plan`, so the dry run and
the real run can never disagree.
"""

from __future__ import annotations

from pyxis_hook import pathnames
from pyxis_hook.record import field, record

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:  # only for type hints: plan/build.py imports nothing heavy
    from typing import Iterable

    from pyxis_hook.spec.config import Config
    from pyxis_hook.host.inventory import DriverFile, Inventory
    from pyxis_hook.spec.request import Request

#: where CUDA images keep the forward-compat driver (NVIDIA's `enable-cuda-compat` hook)
COMPAT_DIR = "/usr/local/cuda/compat"

#: mount options, as CDI/OCI spell them
LIB_OPTIONS = ("ro", "nosuid", "nodev", "bind", "rprivate")
DEV_OPTIONS = ("ro", "nosuid", "noexec", "bind", "rprivate")
IPC_OPTIONS = ("nosuid", "nodev", "noexec", "bind", "rprivate")
PROC_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "bind", "rprivate")


@record
class DeviceEdit:
    """A character device the container gets: bind-mounted from the host node, allowed in the cgroup."""

    path: str  # inside the container, e.g. /dev/nvidia0
    host_path: str  # absolute host path of the source node (under dev-root)
    major: int
    minor: int
    file_mode: int = 0o666


@record
class MountEdit:
    """A read-only bind of one host file (or socket/dir) to a path inside the container."""

    host_path: str
    container_path: str
    kind: str = "file"  # file | dir | socket
    options: tuple[str, ...] = LIB_OPTIONS
    capability: str = ""
    why: str = ""
    #: a bind over a file of the image (`link_edit`): the warning that names it, which apply logs
    #: when it mounts; "" for every other bind
    covers: str = ""
    #: `host_path` is a path inside the container's rootfs, not on the host: the runtime's own mount of
    #: the host's file there (a CDI hook is handed no host path), opened in the container's mount
    #: namespace without following a symlink of the image, and bound only if it is such a mount
    in_rootfs: bool = False


@record
class SymlinkEdit:
    """A symlink created inside the container (SONAME and .so links, libGLX_indirect)."""

    container_path: str
    target: str


@record
class CgroupRule:
    """A device cgroup rule in OCI terms (type c, major, minor, access)."""

    major: int
    minor: int
    access: str = "rw"
    type: str = "c"


@record
class ProcDriverView:
    """The container's /proc/driver/nvidia: a tmpfs with copies of a few host files.

    `params` has `ModifyDeviceFiles: 0` so NVML inside never mknods; only the
    selected GPUs' `gpus/<bus>` directories are bound in.
    """

    host_dir: str  # <proc-root>/driver/nvidia on the host
    files: tuple[tuple[str, str], ...]  # (name, content) copied into the tmpfs
    gpu_dirs: tuple[str, ...]  # bus ids, e.g. 0000:06:00.0


@record
class LdcacheUpdate:
    """How the container's ld.so.cache is refreshed after the libraries are in place."""

    mode: str  # "merge" | "ldconfig" | "none"
    #: host path of the ldconfig binary (mode ldconfig; mode merge: the fallback).  Only ever a
    #: host binary: an `ldconfig` key naming one in the image leaves this empty and the plan a problem
    ldconfig: str = ""
    lib_dirs: tuple[str, ...] = ()  # container dirs passed on ldconfig's command line
    why: str = ""
    #: mode merge: the injected libraries as (container dir, file name, SONAME, cache flags);
    #: `ldmerge` adds them to the image's cache, or falls back to `ldconfig` (then needed) and logs why
    libs: tuple[tuple[str, str, str, int], ...] = ()
    #: dirs scanned before the image's configured ones (CUDA forward compat: the image's
    #: /usr/local/cuda/compat).  They also lead `lib_dirs`: glibc's ldconfig scans its command-line
    #: dirs first, in order, so its cache lists their `libcuda.so.1` before the injected driver's,
    #: as a `/etc/ld.so.conf.d/00-compat-*.conf` would; `ldmerge` ranks their rows the same way
    first_dirs: tuple[str, ...] = ()


@record
class ContainerFacts:
    """What the planner needs to know about the container, read safely from its rootfs."""

    rootfs: str
    lib_dir: str = "/usr/lib/x86_64-linux-gnu"
    lib32_dir: str = "/usr/lib/i386-linux-gnu"
    bin_dir: str = "/usr/bin"
    has_ld_so_conf: bool = True
    #: the image's forward-compat driver: the one regular `libcuda.so.<version>` in COMPAT_DIR
    #: (file name), "" when there is none or more than one
    compat_libcuda: str = ""
    #: the driver majors its `.note.cuda.fwd_compatibility` lists; None when it has no such note
    compat_drivers: tuple[int, ...] | None = None
    #: what glibc's ldconfig would index in COMPAT_DIR: (file name, SONAME, cache flags)
    compat_libs: tuple[tuple[str, str, int], ...] = ()
    #: why COMPAT_DIR cannot be indexed without ldconfig ("" when it can): merge then runs ldconfig
    compat_problem: str = ""
    #: what the image holds at the paths of the injected libraries' links (`link_paths`), when it is
    #: neither nothing nor a symlink: (container path, "regular file" | "directory" | "special file")
    link_occupants: tuple[tuple[str, str], ...] = ()


@record
class Plan:
    """Everything the hook will do, in the order apply does it."""

    rootfs: str
    devices: tuple[DeviceEdit, ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    symlinks: tuple[SymlinkEdit, ...] = ()
    cgroup_rules: tuple[CgroupRule, ...] = ()
    #: "auto": apply writes the rules into a v1 devices cgroup (never inside a Slurm job; on v2 it
    #: says the runtime must allow them); "none": `no-cgroups = true`, the rules are only reported
    cgroup_mode: str = "none"
    proc_driver: ProcDriverView | None = None
    ldcache: LdcacheUpdate = field(default_factory=lambda: LdcacheUpdate("none"))
    env: tuple[tuple[str, str], ...] = ()  # variables the container should see (reported)
    notes: tuple[str, ...] = ()  # decisions and reasons, for `plan` and the log
    problems: tuple[str, ...] = ()  # what makes the plan unusable (prestart fails with the first)

    @property
    def empty(self) -> bool:
        return not (self.devices or self.mounts or self.symlinks or self.proc_driver)


#: device nodes whose absence makes the container unusable (the rest are warnings)
_REQUIRED_NODE_PREFIXES = ("/dev/nvidiactl", "/dev/nvidia-caps/", "/dev/nvidia-caps-imex-channels/")


def _required(path: str) -> bool:
    return path.startswith(_REQUIRED_NODE_PREFIXES) or (
        path.startswith("/dev/nvidia") and path[len("/dev/nvidia"):].isdigit())


def _dev_host_path(dev_root: str, path: str) -> str:
    return pathnames.normpath(dev_root.rstrip("/") + path) if dev_root not in ("", "/") else path


def patch_params(text: str) -> str:
    """The driver's params with `ModifyDeviceFiles: 0`: NVML in the container must not mknod/chmod."""
    out = []
    for line in text.splitlines(keepends=True):
        if line.split(":", 1)[0].strip() == "ModifyDeviceFiles":
            line = "ModifyDeviceFiles: 0\n"
        out.append(line)
    return "".join(out)


def _mount_for(f: "DriverFile", facts: ContainerFacts) -> MountEdit | None:
    """Where one driver file lands in the container (libnvidia-container's rules)."""
    if f.kind == "lib":
        return MountEdit(f.host_path, f"{facts.lib_dir}/{f.name}", "file", LIB_OPTIONS, f.capability, f.source)
    if f.kind == "lib32":
        if not facts.lib32_dir:
            return None
        return MountEdit(f.host_path, f"{facts.lib32_dir}/{f.name}", "file", LIB_OPTIONS, f.capability, f.source)
    if f.kind == "bin":
        return MountEdit(f.host_path, f"{facts.bin_dir}/{f.name}", "file", LIB_OPTIONS, f.capability, f.source)
    if f.kind == "ipc":
        kind = "dir" if f.source.startswith("mps:") else "socket"
        return MountEdit(f.host_path, f.path, kind, IPC_OPTIONS, f.capability, f.source)
    # firmware and ICD files keep their path
    return MountEdit(f.host_path, f.path, "file", LIB_OPTIONS, f.capability, f.source)


def _lib_dir(f: "DriverFile", facts: ContainerFacts) -> str:
    """The container dir a library lands in ("" for a 32-bit one in an image without a 32-bit dir)."""
    return facts.lib_dir if f.kind == "lib" else facts.lib32_dir if f.kind == "lib32" else ""


def link_paths(files: "Iterable[DriverFile]", facts: ContainerFacts) -> tuple[str, ...]:
    """The container paths of the links `build_plan` makes next to `files`: what the facts must look at."""
    return tuple(f"{d}/{link}" for f in files if (d := _lib_dir(f, facts)) for link, _ in f.links)


def link_edit(path: str, target: str, f: "DriverFile",
              facts: ContainerFacts) -> tuple[SymlinkEdit | MountEdit | None, str]:
    """How the host's library `f` answers at `path` (its SONAME, `.so` or extra link), and a note.

    The one decision `build_plan` and `ldcheck` share.  The user-space
    driver must match the host's kernel module, so an image's own file at
    a driver library's link path (a `COPY` of another host's libraries, an
    unpacked runfile) is never right on this host: the host's file must
    win there, or NVML and CUDA fail with "Driver/library version
    mismatch".  Nothing there, or a symlink of the image: our symlink
    (replacing the image's).  A file of the image (`facts.link_occupants`):
    a read-only bind of the host's file over it, which reads, writes and
    follows nothing of the image, with a warning naming it.  A directory:
    nothing can go there (None), said in a warning.  Only the driver's
    own link names in the injection dir are decided here: the image's CUDA
    toolkit libraries and its COMPAT_DIR are never touched.
    """
    occupant = dict(facts.link_occupants).get(path)
    if occupant is None:
        return SymlinkEdit(path, target), ""
    if occupant == "directory":
        return None, (f"warning: {path}: a directory of the image is there: the host's {f.name} "
                      "cannot be linked there (skipped)")
    note = (f"{path}: the image's own {occupant} is covered by the host's {f.host_path} "
            "(a driver library must match the host's kernel module)")
    return MountEdit(f.host_path, path, "file", LIB_OPTIONS, f.capability, f.source, covers=note), \
        "warning: " + note


def _version(text: str) -> tuple[int, ...]:
    """'550.54.15' -> (550, 54, 15); () when it is not dotted numbers."""
    from pyxis_hook.spec.require import is_dotted_number

    return tuple(int(p) for p in text.split(".")) if is_dotted_number(text) else ()


def cuda_compat(config: "Config", capabilities: "Iterable[str]", facts: ContainerFacts,
                driver_version: str | None) -> tuple[bool, str]:
    """Whether the image's forward-compat libcuda is put before the host driver's, and why.

    NVIDIA's rule (nvidia-cdi-hook `enable-cuda-compat`):
    with a `.note.cuda.fwd_compatibility`, only when the host driver's major
    is among the note's "Driver" branches and the compat version is newer;
    without the note, when its major is newer than the host's.  Only for the
    `compute` capability and `cuda-compat = "ldconfig"`.  The note is ""
    when the image has no compat libcuda (nothing to explain).
    """
    if not facts.compat_libcuda:
        return False, ""
    where = f"{COMPAT_DIR}/{facts.compat_libcuda}"
    if "compute" not in set(capabilities):
        return False, f"cuda-compat: {where} not used: the container did not ask for the compute capability"
    if config.cuda_compat != "ldconfig":
        return False, f"cuda-compat: {where} not used: cuda-compat = {config.cuda_compat!r} in {config.source}"
    compat = _version(facts.compat_libcuda[len("libcuda.so."):])
    host = _version(driver_version or "")
    if not compat or not host:
        return False, f"cuda-compat: {where} not used: the host driver version is unknown"
    if facts.compat_drivers is not None:
        branches = ", ".join(str(d) for d in facts.compat_drivers) or "none"
        if host[0] not in facts.compat_drivers:
            return False, (f"cuda-compat: {where} not used: its forward-compatibility note supports driver "
                           f"branches {branches}, not the host's {host[0]}")
        newer = compat > host
    else:
        newer = compat[0] > host[0]
    if not newer:
        return False, (f"cuda-compat: {where} not used: not newer than the host driver {driver_version} "
                       "(forward-compat libraries are used only when newer)")
    return True, (f"cuda-compat: {COMPAT_DIR} comes first in the container's ld.so.cache: its libcuda "
                  f"{'.'.join(map(str, compat))} is newer than the host driver {driver_version} "
                  "(forward compatibility works on data-center GPUs only; cuda-compat = \"disabled\" turns it off)")


def ldcache_update(config: "Config", facts: ContainerFacts, lib_dirs: "Iterable[str]",
                   libs: "Iterable[tuple]" = (), *, compat: bool = False) -> tuple[LdcacheUpdate, tuple[str, ...]]:
    """How the cache is refreshed for libraries injected into `lib_dirs`, and the problems.

    The one place that reads the `ldcache` and `ldconfig` keys: build_plan
    and the CDI update-ldcache hook both call it, so they cannot disagree.
    `libs` are (container dir, DriverFile, SONAME) or ready (dir, file name,
    SONAME, cache flags) rows.  Merge needs the image's /etc/ld.so.conf and
    at least one row, else ldconfig runs.  An `ldconfig` key without '@'
    names a binary in the image, which is never run (docs/security.md): that is
    a problem of the plan, never a silent switch to the host's binary.
    `compat` (what `cuda_compat` decided) puts COMPAT_DIR first in
    `lib_dirs` and `first_dirs`, and its libraries (`facts.compat_libs`)
    among the merge rows; a compat dir the merge cannot index runs ldconfig.
    """
    mode = config.ldcache
    why = f"ldcache = {mode!r} in {config.source}"
    rows: tuple[tuple[str, str, str, int], ...] = ()
    lib_dirs = tuple(lib_dirs)
    first_dirs: tuple[str, ...] = ()
    if compat:  # `cuda_compat` said yes: COMPAT_DIR leads the scan order in both modes
        first_dirs = (COMPAT_DIR,)
        lib_dirs = first_dirs + tuple(d for d in lib_dirs if d != COMPAT_DIR)
        libs = tuple(libs) + tuple((COMPAT_DIR, name, soname, flags) for name, soname, flags in facts.compat_libs)
    if mode == "merge":
        rows = _cache_rows(libs)
        if compat and facts.compat_problem:
            mode, why = "ldconfig", f"{COMPAT_DIR}: {facts.compat_problem}: merge cannot index it, ldconfig instead"
        elif not facts.has_ld_so_conf:
            mode, why = "ldconfig", "the image has no /etc/ld.so.conf: merge cannot model its loader, ldconfig instead"
        elif not rows:
            mode, why = "ldconfig", "no library with a SONAME to merge: ldconfig instead"
        else:
            why += ("; the injected libraries are added to the image's cache as ldconfig would, "
                    "or ldconfig runs when the image's cache cannot be modelled (logged)")
    problems: tuple[str, ...] = ()
    ldconfig = ""
    if mode in ("merge", "ldconfig"):
        is_host, path = config.host_ldconfig()
        if is_host:
            ldconfig = path
        else:
            problems = (f"ldconfig = {config.ldconfig!r} in {config.source} names a binary in the image; "
                        f"only host binaries ('@{path}') are run",)
    return LdcacheUpdate(mode, ldconfig=ldconfig, lib_dirs=lib_dirs, why=why,
                         libs=rows if mode == "merge" else (), first_dirs=first_dirs), problems


def _cache_rows(libs: "Iterable[tuple]") -> tuple[tuple[str, str, str, int], ...]:
    """(dir, name, SONAME, flags) rows; flags computed here, so only when merging."""
    rows = []
    for lib in libs:
        if len(lib) == 4:
            rows.append(tuple(lib))
            continue
        from pyxis_hook.loader.ldcache import written_flags  # a cached import after the first

        d, f, soname = lib
        rows.append((d, f.name, soname, written_flags(f.elfclass, f.needed)))
    return tuple(rows)


def build_plan(request: "Request", inventory: "Inventory", facts: ContainerFacts, config: "Config", *,
               proc_files: tuple[tuple[str, str], ...] | None = None) -> Plan:
    """Request + Inventory + container facts -> Plan; pure (no I/O).

    `proc_files` are the host's /proc/driver/nvidia `params`, `version` and
    `registry` texts (None when the kernel module is not loaded: the
    container then gets no /proc/driver/nvidia view, on purpose).
    """
    notes = list(request.reasons)
    if request.void:
        return Plan(rootfs=facts.rootfs, notes=tuple(notes) + ("nothing to do: the container is left as is",))
    problems: list[str] = []
    if not inventory.usable:
        problems.extend(inventory.errors or ("no NVIDIA driver found under driver-root "
                                             f"{inventory.driver_root}",))
    caps = set(request.capabilities)
    host = inventory.host
    from pyxis_hook.host.gpus import device_nodes_for

    nodes = device_nodes_for(
        host, request.gpu_minors, request.mig_devices,
        uvm=bool(caps & {"compute", "video"}), modeset="display" in caps,
        mig_config=request.mig_config, mig_monitor=request.mig_monitor,
        imex_channels=request.imex_channels,
    )
    devices: list[DeviceEdit] = []
    for n in nodes:
        if n.problem:
            msg = f"device node {_dev_host_path(host.dev_root, n.path)}: {n.problem}"
            if _required(n.path):
                problems.append(msg)
            else:
                notes.append("warning: " + msg + " (skipped)")
            continue
        devices.append(DeviceEdit(n.path, _dev_host_path(host.dev_root, n.path), n.major, n.minor,
                                  0o666 if n.mode is None else n.mode))
    files = inventory.select(caps)
    mounts: list[MountEdit] = []
    symlinks: list[SymlinkEdit] = []
    seen_targets: set[str] = set()
    cache_libs: list[tuple[str, DriverFile, str]] = []  # (container dir, file, SONAME)
    for f in files:
        m = _mount_for(f, facts)
        if m is None:
            notes.append(f"warning: {f.name}: no 32-bit library directory in this image (skipped)")
            continue
        if m.container_path in seen_targets:
            continue
        seen_targets.add(m.container_path)
        mounts.append(m)
        if f.kind in ("lib", "lib32"):
            d = pathnames.dirname(m.container_path)
            for link, target in f.links:
                edit, note = link_edit(f"{d}/{link}", target, f, facts)
                if note:
                    notes.append(note)
                if isinstance(edit, SymlinkEdit):
                    symlinks.append(edit)
                elif edit is not None and edit.container_path not in seen_targets:
                    seen_targets.add(edit.container_path)
                    mounts.append(edit)
            if f.soname:
                cache_libs.append((d, f, f.soname))
    if request.mode == "none":
        notes.append("NVIDIA_VISIBLE_DEVICES=none: driver files and control nodes only, no GPU")
    proc_driver = None
    gpu_dirs = tuple(g.proc_name or g.bus_id for g in request.gpus) + tuple(
        dict.fromkeys(g.proc_name or g.bus_id for m in request.mig_devices
                      for g in host.gpus if g.minor == m.gpu_minor and g not in request.gpus))
    if proc_files is not None:
        files_out = tuple((name, patch_params(text) if name == "params" else text) for name, text in proc_files)
        proc_driver = ProcDriverView(host_dir=pathnames.join(host.proc_root, "driver/nvidia"), files=files_out,
                                     gpu_dirs=gpu_dirs)
        for mig in request.mig_devices:
            for p in mig.proc_paths:
                rel = p[len("/proc"):] if p.startswith("/proc/") else p
                mounts.append(MountEdit(pathnames.join(host.proc_root, rel.lstrip("/")), p, "file", PROC_OPTIONS,
                                        "", "mig access file"))
    else:
        notes.append("no /proc/driver/nvidia on this host (kernel module not loaded): "
                     "the container gets no /proc/driver/nvidia view")
    lib_prefixes = tuple(d + "/" for d in (facts.lib_dir, facts.lib32_dir) if d)
    lib_dirs = tuple(dict.fromkeys(pathnames.dirname(m.container_path) for m in mounts
                                   if lib_prefixes and m.container_path.startswith(lib_prefixes)))
    use_compat, compat_note = cuda_compat(config, caps, facts, inventory.driver_version)
    if not lib_dirs:
        ldcache = LdcacheUpdate("none", why="no libraries injected")
        if use_compat:
            compat_note = f"cuda-compat: {COMPAT_DIR} not used: no driver library is injected"
    else:
        # every row's dir is one of lib_dirs: rows come from lib/lib32 mounts, all under lib_prefixes
        ldcache, ldcache_problems = ldcache_update(config, facts, lib_dirs, cache_libs, compat=use_compat)
        problems.extend(ldcache_problems)
    if compat_note:
        notes.append(compat_note)
    # the rules are always planned (what `plan` shows); whether apply writes them is
    # cgroup_mode, the one place no-cgroups is decided
    rules = tuple(CgroupRule(d.major, d.minor) for d in devices)
    cgroup_mode = "none" if config.no_cgroups else "auto"
    env: tuple[tuple[str, str], ...] = ()
    if request.cuda_visible_devices is not None and (request.gpus or request.mig_devices):
        env = (("CUDA_VISIBLE_DEVICES", request.cuda_visible_devices),)
    return Plan(rootfs=facts.rootfs, devices=tuple(devices), mounts=tuple(mounts), symlinks=tuple(symlinks),
                cgroup_rules=rules, cgroup_mode=cgroup_mode, proc_driver=proc_driver, ldcache=ldcache,
                env=env, notes=tuple(notes), problems=tuple(problems))
