"""The files the NVIDIA kernel module publishes, read into a HostGpus on every start.

`discover_gpus` reads `/proc/driver/nvidia`, `/proc/devices` and the device
nodes under `/dev` (the records are `host/gpus.py`, the parser of each file
`host/gpufiles.py`), each probe through a `host/probe.py` `Reader`.
"""

from __future__ import annotations

import posix
import stat

from pyxis_hook import log, pathnames
from pyxis_hook.host.gpufiles import (majors_from_devices, numbered, parse_access_minor, parse_driver_version,
                                      parse_information, parse_mig_minors, parse_proc_devices, truthy)
from pyxis_hook.host.probe import Reader
from pyxis_hook.rootfs import read_to_end
from pyxis_hook.host.gpus import (MODESET_MINOR, NVIDIA_MAJOR, NVIDIACTL_MINOR, DeviceMajors, DeviceNode, Gpu,
                                  HostGpus, MigDevice, cap_node_path, format_bus_id, imex_node_path, optional_nodes,
                                  parse_bus_id)


def _join(root: str, path: str) -> str:
    """`root` + absolute `path` (both host paths; roots come from trusted config)."""
    return pathnames.join(root, path.lstrip("/"))


def discover_gpus(proc_root: str = "/proc", dev_root: str = "/", reader: Reader | None = None) -> HostGpus:
    """Read `<proc-root>/driver/nvidia`, `<proc-root>/devices` and `<dev-root>/dev` into a HostGpus.

    Every file and directory is probed through `reader` (a fresh one by
    default), which collects the warnings.

    MIG device UUIDs stay None: `host.nvml.fill_mig_uuids` asks the driver's NVML for them.
    """
    r = reader if reader is not None else Reader()
    nv = _join(proc_root, "driver/nvidia")
    names: dict[str, int] = {}
    devices_text = r.read(_join(proc_root, "devices"))
    if devices_text is not None:
        names = parse_proc_devices(devices_text)
    majors = majors_from_devices(names)

    if not r.isdir(nv):
        r.warnings.append(f"{nv}: missing: the NVIDIA kernel module is not loaded")
        return HostGpus(driver_version=None, gpus=(), majors=majors, warnings=tuple(r.warnings),
                        proc_root=proc_root, dev_root=dev_root)

    driver_version = None
    vtext = r.read(pathnames.join(nv, "version"))
    if vtext is not None:
        driver_version = parse_driver_version(vtext)
        if driver_version is None:
            r.warnings.append(f"{pathnames.join(nv, 'version')}: no driver version in its first line")

    gpus = _read_gpus(r, pathnames.join(nv, "gpus"))
    if majors.nvidia is None and (gpus or devices_text is not None):
        r.warnings.append(f"{_join(proc_root, 'devices')}: no nvidia-frontend/nvidia character major")

    mig_devices = _read_mig(r, nv, gpus)
    mig_config = _cap_minor(r, pathnames.join(nv, "capabilities/mig/config"))
    mig_monitor = _cap_minor(r, pathnames.join(nv, "capabilities/mig/monitor"))
    if mig_config is None or mig_monitor is None:
        # only then: the module's table lists every GPU it could drive, on every node
        # (docs/decisions/2026-12-07-real-node-shapes.md)
        mtext = r.read(_join(proc_root, "driver/nvidia-caps/mig-minors"), missing_ok=True)
        minor_map = dict(parse_mig_minors(mtext)) if mtext is not None else {}
        if mig_config is None:
            mig_config = minor_map.get("config")
        if mig_monitor is None:
            mig_monitor = minor_map.get("monitor")

    imex = _read_imex(r, dev_root)

    nodes = _check_nodes(r, gpus, majors, mig_devices, mig_config, mig_monitor, imex, dev_root)
    optional = optional_nodes(mig_config, mig_monitor)
    for n in nodes:
        if n.problem and not (n.problem == "missing" and n.path in optional):
            r.warnings.append(f"{_join(dev_root, n.path)}: {n.problem}")
    return HostGpus(
        driver_version=driver_version,
        gpus=gpus,
        majors=majors,
        mig_devices=mig_devices,
        mig_config_minor=mig_config,
        mig_monitor_minor=mig_monitor,
        imex_channels=imex,
        warnings=tuple(r.warnings),
        nodes=nodes,
        proc_root=proc_root,
        dev_root=dev_root,
    )


def _read_gpus(r: Reader, gpus_dir: str) -> tuple[Gpu, ...]:
    found = []
    for name in r.listdir(gpus_dir):
        path = pathnames.join(gpus_dir, name, "information")
        text = r.read(path)
        if text is None:
            continue
        info = parse_information(text)
        pci = parse_bus_id(info.get("Bus Location", "")) or parse_bus_id(name)
        minor_s = info.get("Device Minor", "")
        if pci is None or not (minor_s.isascii() and minor_s.isdigit()):
            r.warnings.append(f"{path}: no usable 'Bus Location' or 'Device Minor'")
            continue
        found.append((pci, name, int(minor_s), info))
    found.sort(key=lambda t: t[0])  # the index is the rank in PCI order among the usable GPUs
    out = []
    index = 0
    for pci, name, minor, info in found:
        excluded = truthy(info.get("GPU Excluded"))
        out.append(Gpu(index=None if excluded else index, minor=minor, uuid=info.get("GPU UUID") or None,
                       bus_id=format_bus_id(pci), model=info.get("Model") or None, excluded=excluded,
                       proc_name=name))
        index += 0 if excluded else 1
    return tuple(out)


def _cap_minor(r: Reader, path: str) -> int | None:
    text = r.read(path, missing_ok=True)
    if text is None:
        return None
    minor = parse_access_minor(text)
    if minor is None:
        r.warnings.append(f"{path}: no DeviceFileMinor")
    return minor


def _read_mig(r: Reader, nv: str, gpus: tuple[Gpu, ...]) -> tuple[MigDevice, ...]:
    """MIG devices = existing `capabilities/gpu<m>/mig/gi<g>/ci<c>/access` files (created instances only)."""
    out = []
    # one listing for all GPUs: a GPU without MIG support has no capabilities/gpu<m> (a 64-GPU
    # node would otherwise pay 64 failed listings on every start)
    capable = frozenset(r.listdir(pathnames.join(nv, "capabilities")))
    for g in gpus:
        if f"gpu{g.minor}" not in capable:
            continue
        base = f"capabilities/gpu{g.minor}/mig"
        gis = []
        for gname in r.listdir(pathnames.join(nv, base)):
            gi = numbered(gname, "gi")
            if gi is not None:
                gis.append(gi)
        devs: list[MigDevice] = []
        for gi in sorted(gis):
            gi_rel = f"{base}/gi{gi}/access"
            gi_minor = _cap_minor(r, pathnames.join(nv, gi_rel))
            cis = sorted(ci for c in r.listdir(pathnames.join(nv, base, f"gi{gi}"))
                         if (ci := numbered(c, "ci")) is not None)
            for ci in cis:
                ci_rel = f"{base}/gi{gi}/ci{ci}/access"
                ci_minor = _cap_minor(r, pathnames.join(nv, ci_rel))
                if gi_minor is None or ci_minor is None:
                    continue
                devs.append(MigDevice(
                    uuid=None, parent_uuid=g.uuid, gpu_minor=g.minor, gi=gi, ci=ci,
                    access_minors=(gi_minor, ci_minor),
                    proc_paths=(f"/proc/driver/nvidia/{gi_rel}", f"/proc/driver/nvidia/{ci_rel}"),
                    mig_index=len(devs)))
        out.extend(devs)
    return tuple(out)


def _read_imex(r: Reader, dev_root: str) -> tuple[int, ...]:
    d = _join(dev_root, "dev/nvidia-caps-imex-channels")
    return tuple(sorted(c for n in r.listdir(d) if (c := numbered(n, "channel")) is not None))


def check_node(dev_root: str, path: str, major: int, minor: int, reader: Reader | None = None) -> DeviceNode:
    """Stat `<dev-root>` + `path`; like LNC, st_rdev must equal major:minor exactly."""
    host = _join(dev_root, path)
    found = (reader or Reader()).stat(host)
    if found is None:
        return DeviceNode(path, major, minor, None, False, "missing")
    if isinstance(found, str):
        return DeviceNode(path, major, minor, None, False, f"cannot stat: {found}")
    st_mode, st_rdev = found
    mode = stat.S_IMODE(st_mode)
    if not stat.S_ISCHR(st_mode):
        return DeviceNode(path, major, minor, mode, True, "not a character device")
    got = (posix.major(st_rdev), posix.minor(st_rdev))
    if got != (major, minor):
        return DeviceNode(path, major, minor, mode, True,
                          f"invalid device node: is {got[0]}:{got[1]}, expected {major}:{minor}")
    return DeviceNode(path, major, minor, mode, True, None)


def _check_nodes(r: Reader, gpus, majors: DeviceMajors, migs, mig_config, mig_monitor, imex,
                 dev_root) -> tuple[DeviceNode, ...]:
    wanted: list[tuple[str, int, int]] = []
    nv = majors.nvidia if majors.nvidia is not None else NVIDIA_MAJOR
    wanted.append(("/dev/nvidiactl", nv, NVIDIACTL_MINOR))
    for g in sorted(gpus, key=lambda g: g.minor):
        if g.excluded:
            continue  # never injected; its node may legitimately be absent
        wanted.append((f"/dev/nvidia{g.minor}", nv, g.minor))
    if majors.uvm is not None:
        wanted += [("/dev/nvidia-uvm", majors.uvm, 0), ("/dev/nvidia-uvm-tools", majors.uvm, 1)]
    wanted.append(("/dev/nvidia-modeset", nv, MODESET_MINOR))
    if majors.caps is not None:
        cap_minors = {m for d in migs for m in d.access_minors}
        cap_minors |= {m for m in (mig_config, mig_monitor) if m is not None}
        wanted += [(cap_node_path(m), majors.caps, m) for m in sorted(cap_minors)]
    if majors.imex is not None:
        wanted += [(imex_node_path(c), majors.imex, c) for c in imex]
    return tuple(check_node(dev_root, p, ma, mi, r) for p, ma, mi in wanted)


#: the /proc/driver/nvidia texts a container's view of it copies
PROC_DRIVER_FILES = ("params", "version", "registry")
PROC_FILE_LIMIT = 1 << 20


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
