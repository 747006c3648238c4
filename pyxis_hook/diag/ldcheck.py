"""The container's-eye view of the dynamic loader, without running anything from the image.

Why: most "CUDA does not see the GPU" threads end in a loader problem inside
the image — a toolkit stub `libcuda.so.1` or an old `compat/` dir on
`LD_LIBRARY_PATH`, a bundled `libnvidia-ml` of another driver version, a
truncated file earlier in the search path, a stale ld.so.cache, GLX's
`libX11.so.6` missing.  `check_image` resolves every driver library the
container gets the way *its* ld.so will (`diag/ldmodel.py`: LD_LIBRARY_PATH
from config.json, the image's ld.so.cache as it is after injection, the
default dirs compiled into the image's ld.so, the injected files as virtual
files) and turns each deviation into a `Finding`: here for the libraries
and the image's loader setup, in `diag/cudacheck.py` for its CUDA needs.
Nothing from the image is executed; every path is resolved inside the rootfs.
"""

from __future__ import annotations

import os
from typing import Mapping

from pyxis_hook.nogpu import is_legacy
from pyxis_hook.errors import LdCacheError, PathError, RequestError
from pyxis_hook.diag import cudacheck
from pyxis_hook.diag.cudacheck import cuda_facts, cuda_findings
from pyxis_hook.diag.findings import Finding
from pyxis_hook.diag.ldmodel import (InjectedFile, Resolution, SearchSetup, cache_after_injection, compat_rows,
                                     injected_libs, resolve_soname, search_setup, virtual_files)
from pyxis_hook.plan.build import COMPAT_DIR, ContainerFacts, cuda_compat
from pyxis_hook.record import record
from pyxis_hook.rootfs import resolve_in_root, try_resolve_in_root

#: well-known non-driver dependencies -> (Debian/Ubuntu package, RHEL package)
PACKAGES = {
    "libX11.so.6": ("libx11-6", "libX11"),
    "libXext.so.6": ("libxext6", "libXext"),
    "libxcb.so.1": ("libxcb1", "libxcb"),
    "libwayland-client.so.0": ("libwayland-client0", "libwayland-client"),
    "libwayland-server.so.0": ("libwayland-server0", "libwayland-server"),
    "libgbm.so.1": ("libgbm1", "mesa-libgbm"),
    "libdrm.so.2": ("libdrm2", "libdrm"),
}

@record
class LdcheckReport:
    rootfs: str
    source: str
    capabilities: tuple[str, ...]
    driver_version: str | None
    cuda_version: int | None
    libraries: tuple[Resolution, ...]
    findings: tuple[Finding, ...]

    def to_dict(self) -> dict:
        from pyxis_hook.diag.findings import has_errors

        return {"rootfs": self.rootfs, "source": self.source, "capabilities": list(self.capabilities),
                "driver_version": self.driver_version, "cuda_version": self.cuda_version,
                "libraries": [r.to_dict() for r in self.libraries],
                "findings": [f.to_dict() for f in self.findings], "ok": not has_errors(self.findings)}


# ------------------------------------------------------------------ findings per library


def _real_in_root(rootfs: str, path: str) -> str:
    """Root-relative path after following symlinks inside the rootfs."""
    from pyxis_hook.rootfs import to_root_relative

    try:
        return to_root_relative(os.path.normpath(os.path.abspath(rootfs)), resolve_in_root(rootfs, path))
    except (PathError, ValueError):
        return path


def _where_from(how: str, path: str) -> str:
    d = os.path.dirname(path)
    if how == "LD_LIBRARY_PATH":
        return f"remove {d} from LD_LIBRARY_PATH (image ENV or the container's environment)"
    if how == "ld.so.cache":
        return f"delete {path} from the image (or the ld.so.conf.d line naming {d}) and rebuild its cache"
    return f"delete {path} from the image"


def library_findings(rootfs: str, res: Resolution, driver_version: str | None, facts: ContainerFacts | None = None,
                     config=None, hook_compat: bool = False) -> list[Finding]:
    """The findings of one resolution.  A compat copy is judged by NVIDIA's rule (`compat_verdict`);
    `hook_compat`: the hook puts the image's compat dir first (the fix then names cuda-compat)."""
    out: list[Finding] = []
    for c in res.tried:
        if c.outcome == "skipped" and "-bit ELF" in c.reason:
            out.append(Finding(
                "warning", "wrong-class",
                f"{c.path} is a {c.reason.split('-bit')[0]}-bit ELF in a directory searched for the "
                f"{res.elfclass}-bit {res.soname}",
                "the loader skips it, so programs of the other class will not find it where they look",
                f"move {c.path} to the image's {'32' if res.elfclass == 64 else '64'}-bit library directory "
                "or delete it"))
    where = res.injected or res.soname
    if res.outcome == "host":
        out.append(Finding("ok", "resolves-to-host", f"{res.soname} -> {res.path} ({res.how}): the host driver's file"))
        return out
    if res.outcome == "fatal":
        bad = res.tried[-1]
        out.append(Finding(
            "error", "fatal-shadowing",
            f"{bad.path}: {bad.reason} — found via {bad.how} before the host's {where}",
            "glibc's loader stops at a corrupt or truncated candidate instead of trying the next directory, "
            f"so {res.soname} cannot be loaded at all",
            _where_from(bad.how, bad.path)))
        return out
    if res.outcome == "not-found":
        out.append(Finding(
            "error", "not-found", f"{res.soname} ({res.elfclass}-bit) does not resolve in the image",
            f"none of the directories the container's loader searches holds it, although {where} is injected",
            "use ldcache = \"ldconfig\" in pyxis.conf or add the injection directory to the image's /etc/ld.so.conf"))
        return out
    path = res.path or ""
    real = _real_in_root(rootfs, path)
    shown = path if real == path else f"{path} (-> {real})"
    if "/stubs/" in f"{path}/{real}" or os.path.basename(os.path.dirname(path)) == "stubs":
        out.append(Finding(
            "error", "stub-shadows-driver",
            f"{res.soname} resolves to the CUDA toolkit stub {shown} via {res.how}, not the host's {where}",
            "the stub is for linking only: CUDA fails with 'CUDA driver is a stub library' (error 34) "
            "and sees no GPU",
            _where_from(res.how, path)))
        return out
    if "/compat/" in f"{path}/{real}/":
        works, note = cudacheck.compat_verdict(rootfs, real, facts, driver_version, config)
        version = cudacheck.lib_version(os.path.basename(real))
        if works:
            hooks = res.how == "ld.so.cache" and hook_compat and real.startswith(COMPAT_DIR + "/")
            out.append(Finding(
                "info", "compat-libcuda-used",
                f"{res.soname} resolves to the forward-compatibility copy {shown} via {res.how} "
                f"(driver {cudacheck.driver_major_of(version)} on a {cudacheck.driver_major_of(driver_version)} host)",
                "CUDA forward compatibility works only on data-center GPUs and supported driver branches; "
                "elsewhere CUDA fails with error 804",
                "if CUDA reports error 804, set cuda-compat = \"disabled\" in pyxis.conf or update the host driver"
                if hooks else f"if CUDA reports error 804, {_where_from(res.how, path)}"))
        else:
            out.append(Finding(
                "error", "compat-shadows-driver",
                f"{res.soname} resolves to the image's compat copy {shown} via {res.how}, "
                f"not the host's {where}",
                f"a compat library of driver {version or 'unknown'} cannot serve the host driver "
                f"{driver_version or 'unknown'} ({note}): it breaks CUDA (error 804 or version mismatch)",
                _where_from(res.how, path)))
        return out
    out.append(Finding(
        "error", "image-copy-shadows-driver",
        f"{res.soname} resolves to the image's own {shown} via {res.how}, not the host's {where}",
        "a driver library of another version than the kernel module fails "
        "('Driver/library version mismatch', CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)",
        _where_from(res.how, path)))
    return out


def covered_findings(lib: InjectedFile) -> list[Finding]:
    """The image's own files at `lib`'s link paths, which the hook covers with the host's file."""
    return [Finding(
        "warning", "image-file-covered",
        f"{path} is the image's own file; the hook covers it with the host's {lib.host_path}",
        "the user-space driver must match the host's kernel module: the image's copy (often of another "
        "driver version) would fail with 'Driver/library version mismatch'",
        f"delete {path} from the image (the hook injects the host's driver)") for path in lib.covered]


def missing_dep_findings(rootfs: str, deps, setups: Mapping[int, SearchSetup],
                         virtual: Mapping[tuple[str, str], InjectedFile]) -> list[Finding]:
    """Non-driver DT_NEEDED of injected libraries (GLX's libX11.so.6) that the image lacks."""
    out = []
    for dep in deps:
        setup = setups.get(dep.elfclass)
        if setup is None:
            continue
        res = resolve_soname(rootfs, dep.name, setup, virtual)
        if res.outcome in ("host", "image"):
            continue
        deb, rpm = PACKAGES.get(dep.name, (None, None))
        fix = (f"install it in the image (Debian/Ubuntu: apt-get install {deb}; RHEL: dnf install {rpm})" if deb
               else f"install the package that provides {dep.name} in the image")
        out.append(Finding(
            "error", "missing-dependency",
            f"{dep.name} ({dep.elfclass}-bit), needed by {', '.join(dep.needed_by)}, is not in the image",
            f"the driver does not ship it, so the injected {dep.needed_by[0]} cannot be loaded "
            f"({dep.capability} capability)", fix))
    return out


# ------------------------------------------------------------------ the image's loader setup


def loader_setup_findings(rootfs: str, image_cache, cache_problem: str | None,
                          virtual: Mapping[tuple[str, str], InjectedFile], config) -> list[Finding]:
    from pyxis_hook.loader.ldconf import read_ld_so_conf

    out: list[Finding] = []
    if cache_problem == "missing":
        out.append(Finding("warning", "no-ld-so-cache", "the image has no /etc/ld.so.cache",
                           "programs find libraries only through LD_LIBRARY_PATH and the default dirs "
                           "until the hook writes one", "RUN ldconfig at the end of the image build"))
    elif cache_problem:
        out.append(Finding("warning", "corrupt-ld-so-cache", f"/etc/ld.so.cache: {cache_problem}",
                           "glibc ignores a cache it cannot read, so only the default dirs are searched",
                           "rebuild it: RUN ldconfig at the end of the image build"))
    if image_cache is not None:
        stale = []
        for e in image_cache.entries:
            d = try_resolve_in_root(rootfs, os.path.dirname(e.value))
            if d is not None and (d, os.path.basename(e.value)) in virtual:
                continue
            try:
                exists = os.path.exists(resolve_in_root(rootfs, e.value))
            except PathError:
                exists = False
            if not exists:
                stale.append(e)
        if stale:
            more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
            out.append(Finding("warning", "stale-cache-entry",
                               f"/etc/ld.so.cache lists {stale[0].key} -> {stale[0].value}, which does not "
                               f"exist{more}",
                               "the cache is older than the files: the loader falls back to the search dirs "
                               "and may find another copy", "rebuild it: RUN ldconfig at the end of the image build"))
    if not os.path.lexists(resolve_in_root(rootfs, "/etc/ld.so.conf")):
        out.append(Finding("warning", "no-ld-so-conf", "the image has no /etc/ld.so.conf",
                           "ldconfig then indexes only its built-in dirs; the hook cannot merge into a loader "
                           "setup it cannot read", "add /etc/ld.so.conf (include /etc/ld.so.conf.d/*.conf)"))
    else:
        conf = read_ld_so_conf(rootfs)
        if conf.unsafe:
            out.append(Finding("error", "ld-so-conf-refused", conf.problems[0],
                               "glibc's ldconfig would block, spin or open a device on this configuration, so "
                               "the hook refuses to start the container rather than run it",
                               "make /etc/ld.so.conf and the files it includes regular files, with no include "
                               "loop"))
        elif conf.truncated:
            out.append(Finding("warning", "ld-so-conf-unreadable", conf.problems[0],
                               "ldconfig skips it with a warning; the hook cannot model the configuration and "
                               "runs the confined ldconfig instead of merging", "remove or fix the file"))
        for file, line, pattern in conf.unmatched_includes:
            # a glob over an empty directory is normal; a named file that is absent is a mistake
            sev = "info" if any(c in pattern for c in "*?[") else "warning"
            out.append(Finding(sev, "include-matches-nothing",
                               f"{file}:{line}: include {pattern} matches nothing",
                               "ldconfig skips it silently, so directories you expect to be indexed are not",
                               "create the files it names or remove the line"))
    out.extend(_ldconfig_findings(rootfs, config))
    return out


def _ldconfig_findings(rootfs: str, config) -> list[Finding]:
    host_binary = config.ldconfig.startswith("@")
    path = "/sbin/ldconfig" if host_binary else config.ldconfig
    try:
        host = resolve_in_root(rootfs, path)
    except PathError:
        host = ""
    uses = "the hook runs the host's ldconfig, so this only matters inside the container" if host_binary else \
        f"pyxis.conf ldconfig = \"{config.ldconfig}\" runs it to rebuild the cache"
    sev = "info" if host_binary else "error"
    if not host or not os.path.isfile(host):
        return [Finding(sev, "ldconfig-missing", f"{path} is missing in the image", uses,
                        "nothing to do" if host_binary else "use ldconfig = \"@/sbin/ldconfig\" (the host's)")]
    try:
        with open(host, "rb") as f:
            head = f.read(4)
    except OSError:
        head = b""
    if head.startswith(b"#!"):
        real = os.path.isfile(resolve_in_root(rootfs, path + ".real"))
        return [Finding("info" if real or host_binary else "error", "ldconfig-wrapper",
                        f"{path} is a shell script" + (f" (wrapping {path}.real)" if real else ""),
                        uses + "; a wrapper runs the image's shell with the hook's privileges",
                        "nothing to do" if host_binary else f"use ldconfig = \"@/sbin/ldconfig\" or {path}.real")]
    if head != b"\x7fELF":
        return [Finding(sev, "ldconfig-not-elf", f"{path} is neither an ELF binary nor a script", uses,
                        "nothing to do" if host_binary else "use ldconfig = \"@/sbin/ldconfig\" (the host's)")]
    return []


# ------------------------------------------------------------------ the whole check


def capabilities_for(env: Mapping[str, str], config, explicit: str | None) -> tuple[tuple[str, ...], list[Finding]]:
    """The capabilities the hook would grant (spec/request.py's own rules), or () and a finding when it
    would refuse the container.  `explicit` (--capabilities) stands for NVIDIA_DRIVER_CAPABILITIES.

    The request module decides, so a legacy CUDA_VERSION image gets every
    capability and an unknown one is an error here exactly as in the hook.
    """
    from pyxis_hook.spec import request

    if explicit is not None:
        env = {**env, request.CAPABILITIES: explicit}
    try:
        return tuple(request.capabilities(env, config, is_legacy(env), [])), []
    except RequestError as e:
        return (), [Finding("error", "bad-capabilities", str(e),
                            "the hook refuses to start a container asking for a capability it does not know",
                            "fix NVIDIA_DRIVER_CAPABILITIES (or --capabilities), or add the capability to "
                            "supported-capabilities in pyxis.conf")]


def request_findings(env: Mapping[str, str], source: str) -> list[Finding]:
    if source == "rootfs":
        return []
    value = env.get("NVIDIA_VISIBLE_DEVICES")
    if value in (None, "", "void"):
        return [Finding("warning", "no-gpu-requested",
                        "NVIDIA_VISIBLE_DEVICES is " + ("unset" if value is None else repr(value)) +
                        " in the container's environment",
                        "the hook leaves such a container alone: no device and no driver library is injected",
                        "pass NVIDIA_VISIBLE_DEVICES=all (or GPU indices/UUIDs), e.g. podman run -e "
                        "NVIDIA_VISIBLE_DEVICES=all, or use a CUDA base image that sets it")]
    if value == "none":
        return [Finding("info", "no-gpu-requested", "NVIDIA_VISIBLE_DEVICES=none",
                        "the container gets the driver libraries but no GPU", "set it to all or to GPU ids")]
    return []


def check_image(rootfs: str, env: Mapping[str, str], inventory, config, *, capabilities: str | None = None,
                source: str = "rootfs", facts=None) -> LdcheckReport:
    """All ldcheck findings for the image at `rootfs` (a host path) with container environment `env`.

    `source` is "rootfs" or "bundle" (injection simulated) or "pid" (a running container: its
    cache is read as it is and the injected files must really be there).
    """
    from pyxis_hook.loader import ldcache
    from pyxis_hook.plan.container import container_facts

    rootfs = os.path.normpath(os.path.abspath(rootfs))
    caps, findings = capabilities_for(env, config, capabilities)
    findings += request_findings(env, source)
    if not inventory.usable:
        for e in inventory.errors or ("no NVIDIA driver found",):
            findings.append(Finding("error", "no-driver", e, "there is no driver library to inject or check",
                                    "run `pyxis-hook doctor` on the host"))
    if facts is None:
        facts = container_facts(rootfs, files=inventory.select(caps))
    libs = injected_libs(inventory, caps, facts)
    if "compat32" in caps and not facts.lib32_dir and any(f.kind == "lib32" for f in inventory.files):
        findings.append(Finding("warning", "no-lib32-dir", "the image has no 32-bit library directory",
                                "32-bit driver libraries (compat32) are not injected", "install the image's "
                                "32-bit C library (Debian: dpkg --add-architecture i386; apt-get install libc6:i386)"))
    virtual = virtual_files(rootfs, libs)

    image_cache = None
    cache_problem = None
    cache_host = resolve_in_root(rootfs, "/etc/ld.so.cache")
    if not os.path.exists(cache_host):
        cache_problem = "missing"
    else:
        try:
            image_cache = ldcache.read_cache(cache_host)
        except LdCacheError as e:
            cache_problem = str(e).split(": ", 1)[-1]
        except OSError as e:
            cache_problem = e.strerror or str(e)
    # the hook's own decision on the image's forward-compat driver (plan.build_plan: only with libraries)
    hook_compat = bool(libs) and cuda_compat(config, caps, facts, inventory.driver_version)[0]
    first = compat_rows(rootfs, facts) if hook_compat else ()
    effective = image_cache if source == "pid" else cache_after_injection(image_cache, libs, first)
    llp = env.get("LD_LIBRARY_PATH", "")
    setups = {cls: search_setup(rootfs, cls, llp, effective) for cls in (64, 32)}

    results = []
    for lib in libs:
        findings.extend(covered_findings(lib))
        res = resolve_soname(rootfs, lib.soname, setups[lib.elfclass], virtual)
        results.append(res)
        findings.extend(library_findings(rootfs, res, inventory.driver_version, facts, config, hook_compat))
        if source == "pid":
            findings.extend(_present_findings(rootfs, lib))
    deps = [d for d in inventory.deps_for(caps) if d.elfclass == 64 or "compat32" in caps]
    findings.extend(missing_dep_findings(rootfs, deps, setups, virtual))
    search_dirs = setups[64].ld_library_path + setups[64].system_dirs + tuple(
        sorted({os.path.dirname(e.value) for e in (image_cache.entries if image_cache else ())}))
    findings.extend(cuda_findings(env, cuda_facts(rootfs, search_dirs), inventory.cuda_version,
                                  inventory.driver_version, config, facts, caps))
    findings.extend(loader_setup_findings(rootfs, image_cache, cache_problem, virtual, config))
    return LdcheckReport(rootfs, source, caps, inventory.driver_version, inventory.cuda_version,
                         tuple(results), tuple(findings))


def _present_findings(rootfs: str, lib: InjectedFile) -> list[Finding]:
    """--pid: the injected file must be there and be the host's file (same inode through the bind mount)."""
    try:
        st = os.stat(resolve_in_root(rootfs, lib.container_path))
    except (OSError, PathError):
        return [Finding("error", "not-injected", f"{lib.container_path} is missing in the running container",
                        "the hook did not inject it (no GPU requested, or it failed)",
                        "check NVIDIA_VISIBLE_DEVICES and the hook's log")]
    try:
        hst = os.stat(lib.host_path)
    except OSError:
        return []
    if (st.st_dev, st.st_ino) != (hst.st_dev, hst.st_ino):
        return [Finding("error", "not-host-file", f"{lib.container_path} is not the host's {lib.host_path}",
                        "a file of the image sits where the driver library should be mounted",
                        "restart the container so the hook mounts the host's file")]
    return []


def format_text(report: LdcheckReport) -> str:
    from pyxis_hook.diag.findings import format_findings

    head = (f"ldcheck {report.rootfs} ({report.source}); driver {report.driver_version or 'unknown'}; "
            f"capabilities {','.join(report.capabilities) or 'none'}\n")
    return head + format_findings(report.findings)
