"""The plan: a declarative description of everything the hook will do to a container.

`build_plan` is pure (Request + Inventory + ContainerFacts -> Plan).  The
plan is what `pyxis-hook plan` prints, what `cdi generate` turns into CDI
containerEdits, and the only input of `apply.apply_plan`, so the dry run and
the real run can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: mount options, as CDI/OCI spell them
LIB_OPTIONS = ("ro", "nosuid", "nodev", "bind", "rprivate")
DEV_OPTIONS = ("ro", "nosuid", "noexec", "bind", "rprivate")
IPC_OPTIONS = ("nosuid", "nodev", "noexec", "bind", "rprivate")
PROC_OPTIONS = ("ro", "nosuid", "nodev", "noexec", "bind", "rprivate")


@dataclass(frozen=True)
class DeviceEdit:
    """A character device the container gets: bind-mounted from the host node, allowed in the cgroup."""

    path: str  # inside the container, e.g. /dev/nvidia0
    host_path: str  # absolute host path of the source node (under dev-root)
    major: int
    minor: int
    file_mode: int = 0o666


@dataclass(frozen=True)
class MountEdit:
    """A read-only bind of one host file (or socket/dir) to a path inside the container."""

    host_path: str
    container_path: str
    kind: str = "file"  # file | dir | socket
    options: tuple[str, ...] = LIB_OPTIONS
    capability: str = ""
    why: str = ""


@dataclass(frozen=True)
class SymlinkEdit:
    """A symlink created inside the container (SONAME and .so links, libGLX_indirect)."""

    container_path: str
    target: str


@dataclass(frozen=True)
class CgroupRule:
    """A device cgroup rule in OCI terms (type c, major, minor, access)."""

    major: int
    minor: int
    access: str = "rw"
    type: str = "c"


@dataclass(frozen=True)
class ProcDriverView:
    """The container's /proc/driver/nvidia: a tmpfs with copies of a few host files.

    `params` has `ModifyDeviceFiles: 0` so NVML inside never mknods; only the
    selected GPUs' `gpus/<bus>` directories are bound in.
    """

    host_dir: str  # <proc-root>/driver/nvidia on the host
    files: tuple[tuple[str, str], ...]  # (name, content) copied into the tmpfs
    gpu_dirs: tuple[str, ...]  # bus ids, e.g. 0000:06:00.0


@dataclass(frozen=True)
class LdcacheUpdate:
    """How the container's ld.so.cache is refreshed after the libraries are in place."""

    mode: str  # "merge" | "ldconfig" | "none"
    ldconfig: str = ""  # host path of the ldconfig binary (mode ldconfig)
    lib_dirs: tuple[str, ...] = ()  # container dirs passed on ldconfig's command line
    conf_dirs: tuple[str, ...] = ()  # dirs added through an ld.so.conf.d file (e.g. CUDA compat)
    why: str = ""


@dataclass(frozen=True)
class ContainerFacts:
    """What the planner needs to know about the container, read safely from its rootfs."""

    rootfs: str
    lib_dir: str = "/usr/lib/x86_64-linux-gnu"
    lib32_dir: str = "/usr/lib/i386-linux-gnu"
    bin_dir: str = "/usr/bin"
    debian_like: bool = True
    has_ld_so_conf: bool = True
    readonly: bool = False
    uid: int = 0
    gid: int = 0


@dataclass(frozen=True)
class Plan:
    """Everything the hook will do, in the order apply does it."""

    rootfs: str
    devices: tuple[DeviceEdit, ...] = ()
    mounts: tuple[MountEdit, ...] = ()
    symlinks: tuple[SymlinkEdit, ...] = ()
    cgroup_rules: tuple[CgroupRule, ...] = ()
    cgroup_mode: str = "none"  # "v1" | "runtime" (v2: the runtime must allow) | "none"
    proc_driver: ProcDriverView | None = None
    ldcache: LdcacheUpdate = field(default_factory=lambda: LdcacheUpdate("none"))
    env: tuple[tuple[str, str], ...] = ()  # variables the container should see (reported)
    notes: tuple[str, ...] = ()  # decisions and reasons, for `plan` and the log

    @property
    def empty(self) -> bool:
        return not (self.devices or self.mounts or self.symlinks or self.proc_driver)

    def to_dict(self) -> dict:
        return asdict(self)
