"""Host GPU facts read from procfs and /dev, without NVML.

The hook must know which GPUs exist, their minors, UUIDs and PCI ids, the
character-device majors and the MIG capability minors before it can plan a
single mount.  libnvidia-container asks NVML for these; we read the files the
kernel module publishes (`/proc/driver/nvidia/...`, `/proc/devices`) because
they need no library in our process, work on a node whose driver cannot
talk to its GPU, and are trivially faked in tests.  This module holds the
records (and the PCI bus ids every layer compares); the parser of each
file is `host/gpufiles.py`, reading them is `host/gpuscan.py`.
Everything here is stdlib-only and cheap to import.

Discovery raises nothing for a host that merely lacks the driver or has a
broken file: a missing kernel module gives `HostGpus(driver_version=None,
...)` with a warning, an unreadable file gives a warning naming its path, so
`info` can still print what it found.

The host index of a GPU is its rank after sorting by PCI id (domain, bus,
device, function as integers), which is NVML's order on an unconstrained
host and what Slurm's global GPU ids count (docs/slurm.md).  It is
NOT the device minor.  Excluded GPUs (`GPU Excluded: Yes`) get no index:
NVML does not enumerate them either.
"""

from __future__ import annotations


from pyxis_hook.record import record

#: The NVIDIA control/GPU major is fixed by the driver; uvm, caps, imex are dynamic.
NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255
MODESET_MINOR = 254


@record
class Gpu:
    """One GPU as the kernel module lists it under /proc/driver/nvidia/gpus/<bus>/.

    `bus_id` is normalised (`normalize_bus_id`); `proc_name` is the procfs
    directory name, the thing to bind at /proc/driver/nvidia/gpus/<proc_name>.
    """

    index: int | None
    minor: int
    uuid: str | None
    bus_id: str
    model: str | None
    excluded: bool = False
    proc_name: str = ""


@record
class MigDevice:
    """One MIG compute instance (a GPU instance `gi` plus compute instance `ci`).

    procfs cannot tell a MIG device's UUID; `uuid` is None unless an NVML lookup
    filled it (`host.nvml.fill_mig_uuids`).  `access_minors` are the
    nvidia-caps minors of the GI and the CI access files (in that order);
    `proc_paths` are those access files as paths under /proc (container-side;
    the host file is `<proc-root>` + the part after "/proc").  `mig_index` is
    the rank of (gi, ci) among the parent's MIG devices: our stand-in for
    NVML's MIG device index in `<gpu>:<mig>` tokens (NVML's own order is not
    visible in procfs).
    """

    uuid: str | None
    parent_uuid: str | None
    gpu_minor: int
    gi: int
    ci: int
    access_minors: tuple[int, ...]
    proc_paths: tuple[str, ...]
    mig_index: int = 0


@record
class DeviceMajors:
    """Character-device majors from /proc/devices (None = that module is not loaded).

    `names` keeps every nvidia-ish line as (name, major) for `info`.
    """

    nvidia: int | None
    uvm: int | None
    caps: int | None
    imex: int | None
    nvswitch: int | None = None
    names: tuple[tuple[str, int], ...] = ()


@record
class DeviceNode:
    """A device node the driver should have made, and what `<dev-root>` really has.

    `path` is the container-side path (`/dev/nvidia0`); the host node is
    `<dev-root>` + path.  `mode` is the host node's permission bits (None when
    absent).  `problem` says why the node is unusable (missing, not a char
    device, wrong major:minor) and is None when it is fine.
    """

    path: str
    major: int
    minor: int
    mode: int | None = None
    exists: bool = False
    problem: str | None = None


@record
class HostGpus:
    """Everything procfs and /dev say about the host's NVIDIA devices.

    `nodes` are every expected device node with its check result;
    `warnings` are one-line texts naming the path concerned.
    """

    driver_version: str | None
    gpus: tuple[Gpu, ...]
    majors: DeviceMajors
    mig_devices: tuple[MigDevice, ...] = ()
    mig_config_minor: int | None = None
    mig_monitor_minor: int | None = None
    imex_channels: tuple[int, ...] = ()
    warnings: tuple[str, ...] = ()
    nodes: tuple[DeviceNode, ...] = ()
    proc_root: str = "/proc"
    dev_root: str = "/"

    def gpu_by_minor(self, minor: int) -> Gpu | None:
        return next((g for g in self.gpus if g.minor == minor), None)

    def gpu_by_index(self, index: int) -> Gpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def gpu_by_uuid(self, uuid: str) -> Gpu | None:
        """UUIDs compare case-insensitively (NVML prints lower case; users paste either)."""
        want = uuid.lower()
        return next((g for g in self.gpus if g.uuid and g.uuid.lower() == want), None)

    def gpu_by_bus_id(self, bus_id: str) -> Gpu | None:
        """Match either the 4-digit procfs or the 8-digit NVML form of a PCI id."""
        norm = normalize_bus_id(bus_id)
        if norm is None:
            return None
        return next((g for g in self.gpus if g.bus_id == norm), None)

    def node(self, path: str) -> DeviceNode | None:
        return next((n for n in self.nodes if n.path == path), None)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (schemas/gpus.schema.json); inverse of `from_dict`."""
        return {
            "driver_version": self.driver_version,
            "gpus": [_gpu_to_dict(g) for g in self.gpus],
            "majors": {
                "nvidia": self.majors.nvidia,
                "uvm": self.majors.uvm,
                "caps": self.majors.caps,
                "imex": self.majors.imex,
                "nvswitch": self.majors.nvswitch,
                "names": [[n, m] for n, m in self.majors.names],
            },
            "mig_devices": [_mig_to_dict(m) for m in self.mig_devices],
            "mig_config_minor": self.mig_config_minor,
            "mig_monitor_minor": self.mig_monitor_minor,
            "imex_channels": list(self.imex_channels),
            "warnings": list(self.warnings),
            "nodes": [_node_to_dict(n) for n in self.nodes],
            "proc_root": self.proc_root,
            "dev_root": self.dev_root,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "HostGpus":
        """Rebuild from `to_dict()` output; KeyError/TypeError on a malformed dict (callers wrap)."""
        maj = d["majors"]
        return cls(
            driver_version=d["driver_version"],
            gpus=tuple(Gpu(**g) for g in d["gpus"]),
            majors=DeviceMajors(
                nvidia=maj["nvidia"],
                uvm=maj["uvm"],
                caps=maj["caps"],
                imex=maj["imex"],
                nvswitch=maj.get("nvswitch"),
                names=tuple((str(n), int(m)) for n, m in maj.get("names", ())),
            ),
            mig_devices=tuple(
                MigDevice(**{**m, "access_minors": tuple(m["access_minors"]), "proc_paths": tuple(m["proc_paths"])})
                for m in d.get("mig_devices", ())
            ),
            mig_config_minor=d.get("mig_config_minor"),
            mig_monitor_minor=d.get("mig_monitor_minor"),
            imex_channels=tuple(d.get("imex_channels", ())),
            warnings=tuple(d.get("warnings", ())),
            nodes=tuple(DeviceNode(**n) for n in d.get("nodes", ())),
            proc_root=d.get("proc_root", "/proc"),
            dev_root=d.get("dev_root", "/"),
        )


def _gpu_to_dict(g: Gpu) -> dict:
    return {"index": g.index, "minor": g.minor, "uuid": g.uuid, "bus_id": g.bus_id, "model": g.model,
            "excluded": g.excluded, "proc_name": g.proc_name}


def _mig_to_dict(m: MigDevice) -> dict:
    return {"uuid": m.uuid, "parent_uuid": m.parent_uuid, "gpu_minor": m.gpu_minor, "gi": m.gi, "ci": m.ci,
            "access_minors": list(m.access_minors), "proc_paths": list(m.proc_paths), "mig_index": m.mig_index}


def _node_to_dict(n: DeviceNode) -> dict:
    return {"path": n.path, "major": n.major, "minor": n.minor, "mode": n.mode, "exists": n.exists,
            "problem": n.problem}


# ---------------------------------------------------------------- PCI ids

# The parsers below are plain string code, not regular expressions: `re` (with the `enum` it
# imports) stays off the start path, and these run on every start (docs/decisions/2026-12-07-start-costs.md).
# tests/unit/host/test_gpus.py checks each against the regular expression it replaces.
_HEX = frozenset("0123456789abcdefABCDEF")


def _is_hex(s: str, most: int) -> bool:
    return 0 < len(s) <= most and _HEX.issuperset(s)


def parse_bus_id(text: str) -> tuple[int, int, int, int] | None:
    """(domain, bus, device, function) of `0000:06:00.0`, `00000000:06:00.0` or `06:00.0`; None if not a PCI id."""
    head, dot, fn = text.strip().rpartition(".")
    if not dot or len(fn) != 1 or fn not in "01234567":
        return None
    parts = head.split(":")
    if len(parts) == 2:
        dom, (bus, dev) = "", parts
    elif len(parts) == 3 and _is_hex(parts[0], 8):
        dom, bus, dev = parts
    else:
        return None
    if not (_is_hex(bus, 2) and _is_hex(dev, 2)):
        return None
    dev_i = int(dev, 16)
    if dev_i > 0x1F:
        return None
    return int(dom or "0", 16), int(bus, 16), dev_i, int(fn)


def is_full_bus_id(text: str) -> bool:
    """A PCI id with its domain and nothing around it: `0000:06:00.0`, NVML's `00000000:06:00.0`."""
    return text.count(":") == 2 and text == text.strip() and parse_bus_id(text) is not None


def normalize_bus_id(text: str) -> str | None:
    """Canonical lower-case procfs form (`0000:06:00.0`); the 8-digit NVML form maps to it.

    Domains wider than 16 bits (Azure, nvidia-docker#1316) keep all their
    digits, exactly as the kernel prints them.  None when `text` is no PCI id.
    """
    parsed = parse_bus_id(text)
    return None if parsed is None else format_bus_id(parsed)


def format_bus_id(parsed: tuple[int, int, int, int]) -> str:
    """The procfs form of a parsed PCI id."""
    dom, bus, dev, fn = parsed
    return f"{dom:04x}:{bus:02x}:{dev:02x}.{fn:x}"


# ---------------------------------------------------------------- pure parsers

def cap_node_path(minor: int) -> str:
    return f"/dev/nvidia-caps/nvidia-cap{minor}"


def optional_nodes(mig_config_minor: int | None, mig_monitor_minor: int | None) -> frozenset[str]:
    """The expected nodes a healthy host may lack: `/dev/nvidia-modeset` (needs nvidia-modeset.ko),
    `/dev/nvidia-uvm-tools`, and MIG's config and monitor nodes, which nvidia-modprobe makes on
    demand (a request that needs a missing one fails then, `plan.build`)."""
    return frozenset(["/dev/nvidia-modeset", "/dev/nvidia-uvm-tools"] + [
        cap_node_path(m) for m in (mig_config_minor, mig_monitor_minor) if m is not None])


def imex_node_path(channel: int) -> str:
    return f"/dev/nvidia-caps-imex-channels/channel{channel}"


def device_nodes_for(host: HostGpus, gpu_minors=(), mig_devices=(), *, uvm: bool = False,
                     modeset: bool = False, mig_config: bool = False, mig_monitor: bool = False,
                     imex_channels=()) -> tuple[DeviceNode, ...]:
    """The nodes a container needs for this selection, in injection order, with their host check result.

    nvidiactl always; /dev/nvidia<minor> per GPU and per MIG parent; uvm pair
    for compute/video; modeset for display; nvidia-cap<M> per MIG access
    minor and for config/monitor; one IMEX channel node each.  Nodes the
    GPU probes did not find (e.g. an IMEX channel that does not exist) come
    back with problem "missing".
    """
    nv = host.majors.nvidia if host.majors.nvidia is not None else NVIDIA_MAJOR
    wanted: list[tuple[str, int | None, int]] = [("/dev/nvidiactl", nv, NVIDIACTL_MINOR)]
    minors = list(dict.fromkeys([*gpu_minors, *(d.gpu_minor for d in mig_devices)]))
    wanted += [(f"/dev/nvidia{m}", nv, m) for m in minors]
    if uvm:
        wanted += [("/dev/nvidia-uvm", host.majors.uvm, 0), ("/dev/nvidia-uvm-tools", host.majors.uvm, 1)]
    if modeset:
        wanted.append(("/dev/nvidia-modeset", nv, MODESET_MINOR))
    caps: list[int] = [m for d in mig_devices for m in d.access_minors]
    if mig_config and host.mig_config_minor is not None:
        caps.append(host.mig_config_minor)
    if mig_monitor and host.mig_monitor_minor is not None:
        caps.append(host.mig_monitor_minor)
    wanted += [(cap_node_path(m), host.majors.caps, m) for m in dict.fromkeys(caps)]
    wanted += [(imex_node_path(c), host.majors.imex, c) for c in imex_channels]
    out = []
    recorded = {n.path: n for n in host.nodes}  # one lookup per node: a 64-GPU node asks for ~70
    for path, major, minor in wanted:
        known = recorded.get(path)
        if known is not None:
            out.append(known)
        elif major is None:
            out.append(DeviceNode(path, -1, minor, None, False, "its driver module is not loaded (no major)"))
        else:
            out.append(DeviceNode(path, major, minor, None, False, "missing"))
    return tuple(out)
