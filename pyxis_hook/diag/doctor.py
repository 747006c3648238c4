"""Host checks for the usual causes of GPU container failures, each a `Finding` with a fix.

Why one command: the answers to "nvidia-container-cli: initialization error"
are scattered over kernel module state (/proc/driver/nvidia), device nodes,
the host's ld.so.cache, the ldconfig binary, hook registration, the runtime
and the cgroup setup.  `run_checks` probes each without changing anything.
Every root comes from pyxis.conf (`driver-root`, `proc-root`, `dev-root`) and
everything else that is not a root (hooks.d dirs, the environment, $PATH for
the runtimes) from a `DoctorEnv`, so tests point them at fixture trees.
Nothing is executed except `runc --version` / `crun --version`; the
ldconfig binary is inspected with loader/elf.py, never run.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess

from pyxis_hook.host.cgroup import read_text
from pyxis_hook.host.gpus import optional_nodes
from pyxis_hook.errors import ConfigError, ElfError, LdCacheError
from pyxis_hook.diag import installcheck
from pyxis_hook.diag.doctorenv import DoctorEnv
from pyxis_hook.diag.findings import Finding
from pyxis_hook.rootfs import try_resolve_in_root

PERSISTENCED_SOCKET = "/var/run/nvidia-persistenced/socket"
PERSISTENCED_PID = "/var/run/nvidia-persistenced/nvidia-persistenced.pid"
RUNTIMES = ("runc", "crun")


# ------------------------------------------------------------------ driver


def check_driver(inv, config) -> list[Finding]:
    """Kernel module loaded, user-space libraries present, and both of the same version."""
    host = inv.host
    proc_nv = os.path.join(config.proc_root, "driver/nvidia")
    out = []
    if not os.path.isdir(proc_nv):
        out.append(Finding("error", "kernel-module-not-loaded", f"{proc_nv} is missing: the NVIDIA kernel module is "
                           "not loaded", "without it no GPU can be opened, in or out of a container",
                           "modprobe nvidia (install the driver if that fails), then check dmesg"))
    lib_versions = sorted({f.name.rsplit(".so.", 1)[1] for f in inv.files
                           if f.kind == "lib" and f.soname in ("libcuda.so.1", "libnvidia-ml.so.1")}
                          | set(inv.other_versions))
    kernel = host.driver_version
    if kernel and lib_versions and kernel not in lib_versions:
        out.append(Finding("error", "driver-version-mismatch",
                           f"kernel module {kernel} but user-space libraries {', '.join(lib_versions)} "
                           f"in {inv.driver_root}",
                           "NVML and CUDA refuse to work: 'Failed to initialize NVML: Driver/library version mismatch'",
                           "reboot, or reload the module (rmmod nvidia_uvm nvidia_drm nvidia_modeset nvidia; "
                           "modprobe nvidia) so it matches the installed libraries"))
    elif not inv.usable:
        for e in inv.errors or (f"no NVIDIA driver libraries in {inv.driver_root}",):
            out.append(Finding("error", "driver-libraries", e, "there is nothing to inject into containers",
                               "install the NVIDIA user-space driver, or set driver-root in pyxis.conf"))
    elif kernel:
        extra = f" (also installed: {', '.join(inv.other_versions)})" if inv.other_versions else ""
        out.append(Finding("ok", "driver", f"driver {kernel}: kernel module and user-space libraries agree{extra}"))
    else:
        out.append(Finding("ok", "driver", f"user-space driver {inv.driver_version} in {inv.driver_root}"))
    return out


def check_devices(host, config) -> list[Finding]:
    """Device nodes exist with the majors/minors /proc/devices gives, readable by container users; UVM loaded."""
    if host.driver_version is None and not host.gpus:
        return []
    out = []
    if not host.gpus:
        out.append(Finding("warning", "no-gpus", f"{os.path.join(config.proc_root, 'driver/nvidia/gpus')} lists no GPU",
                           "the module is loaded but found no usable GPU", "check dmesg and lspci for NVIDIA devices"))
    if host.majors.uvm is None:
        out.append(Finding("error", "nvidia-uvm-not-loaded",
                           f"no nvidia-uvm line in {os.path.join(config.proc_root, 'devices')}",
                           "CUDA needs /dev/nvidia-uvm: without it cuInit fails and nvidia-smi still works "
                           "('nvidia-smi works but CUDA does not see the GPU')",
                           "modprobe nvidia-uvm (or nvidia-modprobe -u -c=0); make it load at boot"))
    good = 0
    optional = optional_nodes(host.mig_config_minor, host.mig_monitor_minor)
    for n in host.nodes:
        where = os.path.join(config.dev_root, n.path.lstrip("/"))
        if n.problem:
            if n.problem == "missing" and n.path in optional:
                continue
            out.append(Finding("error", "device-node", f"{where}: {n.problem} (expected char {n.major}:{n.minor})",
                               "the hook bind-mounts host nodes; a missing or wrong node means no GPU in the container",
                               "nvidia-modprobe -c=<minor> -u (or nvidia-smi once as root) to create the nodes"))
            continue
        if n.mode is not None and (n.mode & 0o006) != 0o006:
            out.append(Finding("warning", "device-permissions", f"{where} has mode {n.mode:04o}",
                               "containers running as a non-root user cannot open it (the node keeps its host "
                               "mode and owner in the container)",
                               "set NVreg_DeviceFileMode=0666 for the nvidia module, or run containers with the "
                               "node's group"))
            continue
        good += 1
    if good:
        out.append(Finding("ok", "device-nodes", f"{good} device node(s) present with the majors/minors "
                           f"{os.path.join(config.proc_root, 'devices')} gives, mode 0666"))
    return out


def check_persistenced(config) -> list[Finding]:
    sock = try_resolve_in_root(config.driver_root, PERSISTENCED_SOCKET)
    try:
        if sock and stat.S_ISSOCK(os.stat(sock).st_mode):
            return [Finding("ok", "persistenced", f"nvidia-persistenced is running ({sock})")]
    except OSError:
        pass
    pidfile = try_resolve_in_root(config.driver_root, PERSISTENCED_PID)
    text = read_text(pidfile) if pidfile else None
    if text and text.strip().isdigit() and os.path.isdir(os.path.join(config.proc_root, text.strip())):
        return [Finding("ok", "persistenced", f"nvidia-persistenced is running (pid {text.strip()})")]
    return [Finding("warning", "persistenced-not-running", f"no nvidia-persistenced socket at {sock or PERSISTENCED_SOCKET}",
                    "without it the driver tears the GPUs down whenever no process holds them, so every container "
                    "start pays GPU initialisation (seconds per GPU)",
                    "systemctl enable --now nvidia-persistenced")]


def check_host_ldcache(inv, config, machine: str | None = None) -> list[Finding]:
    """The driver root's ld.so.cache must list libcuda.so.1/libnvidia-ml.so.1 of the driver version.

    Looked up with the flags this machine's 64-bit loader accepts
    (`cachelookup.LOADER_FLAGS`; 0x0A03 on aarch64), as the host's own ld.so would.
    """
    from pyxis_hook.loader import cachelookup, ldcache

    machine = machine or os.uname().machine
    flags = cachelookup.LOADER_FLAGS.get(machine, cachelookup.LOADER_FLAGS["generic"])
    path = os.path.join(config.driver_root, "etc/ld.so.cache")
    try:
        cache = ldcache.read_cache(path)
    except (LdCacheError, OSError) as e:
        return [Finding("error", "host-ldcache", f"{path}: {getattr(e, 'strerror', None) or e}",
                        "the hook finds driver libraries through the host's ld.so.cache", "run ldconfig on the host")]
    out = []
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        hit = cachelookup.search_cache(cache, soname, flags)
        real = try_resolve_in_root(config.driver_root, hit.value) if hit else None
        if hit is None or real is None or not os.path.isfile(real):
            out.append(Finding("error", "host-ldcache", f"{path} does not list {soname}" if hit is None else
                               f"{path}: {soname} -> {hit.value}, which does not exist",
                               "the hook finds driver libraries through the host's ld.so.cache",
                               "run ldconfig on the host (the driver installer normally does)"))
        elif inv.driver_version and not os.path.basename(real).endswith(inv.driver_version):
            out.append(Finding("warning", "host-ldcache", f"{path}: {soname} -> {hit.value} is not driver "
                               f"{inv.driver_version}", "programs on the host load another driver version "
                               "than the kernel module", "remove the old driver's libraries and run ldconfig"))
    if not out:
        out.append(Finding("ok", "host-ldcache", f"{path} lists libcuda.so.1 and libnvidia-ml.so.1"))
    return out


def check_ldconfig(config) -> list[Finding]:
    """The configured host ldconfig must be a static ELF: it runs chrooted inside the container."""
    from pyxis_hook.loader.elf import read_elf

    is_host, path = config.host_ldconfig()
    if not is_host:
        return [Finding("info", "ldconfig", f"ldconfig = \"{config.ldconfig}\": the container's own ldconfig is used",
                        "an image can ship any program at that path", "prefer ldconfig = \"@/sbin/ldconfig\"")]
    fix = "point ldconfig in pyxis.conf at glibc's static binary (\"@/sbin/ldconfig.real\" on Ubuntu)"
    if not os.path.isfile(path):
        return [Finding("error", "ldconfig-missing", f"{path} (pyxis.conf ldconfig) does not exist",
                        "the hook cannot refresh the container's ld.so.cache", fix)]
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as e:
        return [Finding("error", "ldconfig-unreadable", f"{path}: {e.strerror}", "the hook cannot load it", fix)]
    if head.startswith(b"#!"):
        return [Finding("error", "ldconfig-script", f"{path} is a shell script, not glibc's ldconfig binary",
                        "the hook runs ldconfig chrooted in the container, where the script's interpreter is the "
                        "image's (or missing)", fix)]
    try:
        info = read_elf(path)
    except ElfError as e:
        return [Finding("error", "ldconfig-not-elf", str(e), "the hook cannot run it in the container", fix)]
    if info.interp or info.needed:
        return [Finding("error", "ldconfig-dynamic", f"{path} is dynamically linked (needs {info.interp or ', '.join(info.needed)})",
                        "run chrooted in the container it would load the image's C library, or fail", fix)]
    return [Finding("ok", "ldconfig", f"{path} is a static ELF binary")]


def check_config(config) -> list[Finding]:
    from pyxis_hook.spec.config import load_config

    if config.source == "<defaults>":
        return [Finding("info", "config", "no pyxis.conf: built-in defaults",
                        "the hook reads /etc/pyxis-hook/pyxis.conf or $PYXIS_HOOK_CONFIG",
                        "create /etc/pyxis-hook/pyxis.conf to change driver-root, ldconfig, ...")]
    try:
        load_config(config.source, verdicts=False)  # as `config check`: read as a start reads it, always checked
    except ConfigError as e:
        return [Finding("error", "config", str(e), "the hook refuses to start with a configuration it cannot read "
                        "or that is invalid", "fix what the line names (the file's permissions, or the key)")]
    return [Finding("ok", "config", f"{config.source} is valid")]


def check_runtimes(config, env: DoctorEnv) -> list[Finding]:
    search = ":".join(env.search_path if env.search_path is not None else config.path)
    out = []
    for name in RUNTIMES:
        exe = shutil.which(name, path=search)
        if exe is None:
            continue
        version = "version unknown"
        if env.run_runtimes:
            try:
                res = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10,
                                     stdin=subprocess.DEVNULL)
                version = (res.stdout.strip().splitlines() or ["version unknown"])[0]
            except (OSError, subprocess.SubprocessError) as e:
                version = f"--version failed: {e}"
        out.append(Finding("ok", "runtime", f"{exe}: {version}"))
    if not out:
        out.append(Finding("warning", "no-runtime", f"neither runc nor crun in {search}",
                           "podman, CRI-O and Docker need one to run OCI containers (enroot does not)",
                           "install runc or crun"))
    return out


def check_cgroup(config, env: DoctorEnv) -> list[Finding]:
    from pyxis_hook.host import cgroup

    path = os.path.join(config.proc_root, env.self_pid, "cgroup")
    dc = cgroup.read_devices_cgroup(config.proc_root, env.self_pid, env.self_pid)
    if dc is None and not os.access(path, os.R_OK):
        return [Finding("info", "cgroup", f"{path} is unreadable: cgroup layout unknown", "", "")]
    if dc is not None and dc.controller == "v1":
        return [Finding("ok", "cgroup", f"cgroup {dc.version}: devices controller in use; the hook adds each node "
                        "to the container's devices.allow")]
    if dc is not None:
        return [Finding("info", "cgroup-v2", f"cgroup {dc.version}: device access is decided by eBPF programs",
                        "the hook does not rewrite them: the runtime must allow the GPU nodes (devices in config.json, "
                        "CDI, or the precreate hook)", "nothing to do with runc/crun/podman; use CDI for other engines")]
    return [Finding("warning", "cgroup", f"{path}: no devices controller and no cgroup v2",
                    "device access cannot be confined", "mount the devices controller or use cgroup v2")]


def check_openat2() -> list[Finding]:
    from pyxis_hook.kernel import lookup

    try:
        ok = lookup.have_openat2()
    except Exception:  # a ctypes failure is the same answer
        ok = False
    if ok:
        return [Finding("ok", "openat2", "openat2(RESOLVE_IN_ROOT) is available")]
    return [Finding("warning", "no-openat2", "openat2 is not available (kernel < 5.6 or a seccomp filter)",
                    "paths inside images are then walked component by component: safe, but slower",
                    "use kernel 5.6 or later, or allow openat2 in the seccomp profile")]


def check_slurm(host, config, env: DoctorEnv) -> list[Finding]:
    """Under Slurm, whether the job's device cgroup confines it to its GPUs (ConstrainDevices)."""
    from pyxis_hook.host import cgroup

    environ = dict(env.environ)
    step = cgroup.read_slurm_cgroup(config.proc_root, env.self_pid)
    job = environ.get("SLURM_JOB_ID") or (str(step.job) if step else None)
    if job is None:
        return []
    minors = [g.minor for g in host.gpus if not g.excluded]
    if not minors:
        return []
    nv = host.majors.nvidia if host.majors.nvidia is not None else 195
    allowed = cgroup.gpu_minors_allowed(config.proc_root, env.self_pid, minors, nv, mountinfo_pid=env.self_pid)
    if allowed is None:
        return [Finding("info", "slurm-devices", f"Slurm job {job}: cannot tell which GPUs its device cgroup allows",
                        "cgroup v2 device rules are eBPF programs, which are not decoded here",
                        "make sure cgroup.conf has ConstrainDevices=yes")]
    from pyxis_hook.errors import RequestError
    from pyxis_hook.spec.allocation import job_allocation

    try:  # the hook's own reading of the job's variables (spec.allocation), not a second count
        job_gpus = job_allocation(environ, host)
    except RequestError:  # a value naming no GPU here: schedcheck's finding says so
        job_gpus = None
    allocated = job_gpus.gpus if job_gpus is not None and job_gpus.scheduler == "Slurm" else ()
    if len(allowed) == len(minors) and (not allocated or len(allocated) < len(minors)):
        return [Finding("warning", "slurm-not-confined",
                        f"Slurm job {job}: its device cgroup allows every GPU ({len(minors)})"
                        + (f" although it was allocated {len(allocated)}" if allocated else ""),
                        "without ConstrainDevices a job can open GPUs allocated to other jobs",
                        "set ConstrainDevices=yes in cgroup.conf and restart slurmd")]
    return [Finding("ok", "slurm-devices", f"Slurm job {job}: device cgroup allows GPU minor(s) "
                    f"{','.join(map(str, sorted(allowed))) or 'none'} of {len(minors)}")]


def run_checks(config, env: DoctorEnv | None = None, inventory=None) -> tuple[Finding, ...]:
    """Every host check, in the order a newcomer should read them."""
    from pyxis_hook.host.discovery import discover

    env = env or DoctorEnv(environ=tuple(os.environ.items()), command=installcheck.running_command())
    inv = inventory if inventory is not None else discover(config, strict=False)
    out: list[Finding] = []
    out += check_driver(inv, config)
    out += check_devices(inv.host, config)
    if inv.host.driver_version:
        out += check_persistenced(config)
    out += check_host_ldcache(inv, config)
    out += check_ldconfig(config)
    out += check_config(config)
    from pyxis_hook.diag import enginecheck

    out += enginecheck.check_launcher()
    out += enginecheck.check_enroot()
    out += installcheck.check_hooks_d(config, env)
    out += check_runtimes(config, env)
    out += installcheck.check_node_artifact(config)
    out += check_cgroup(config, env)
    out += check_openat2()
    out += installcheck.check_start_image()
    out += check_slurm(inv.host, config, env)
    from pyxis_hook.diag.schedcheck import check_scheduler

    out += check_scheduler(inv.host, config, env)
    return tuple(out)


def report_dict(config, findings) -> dict:
    from pyxis_hook.diag.findings import has_errors

    return {"config": config.source, "driver_root": os.path.abspath(config.driver_root),
            "proc_root": os.path.abspath(config.proc_root), "dev_root": os.path.abspath(config.dev_root),
            "findings": [f.to_dict() for f in findings], "ok": not has_errors(findings)}
