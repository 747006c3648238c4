"""Discovery: the host driver's files per capability, read from the driver root.

`discover(config)` builds an `Inventory` the way libnvidia-container does
(`src/nvc_info.c`, `src/ldcache.c`): ld.so.cache keys matched against per-capability
prefixes, values resolved *inside* the driver root, the exact driver-version
suffix rule, the libnvidia-tls ABI-note check, 64- and 32-bit entries.  On
top of that it walks the DT_NEEDED closure inside the driver (libGLX_nvidia
needs libnvidia-glsi/-tls/-glcore, which older lists do not name) and records
dependencies that are not driver files (libX11.so.6) without injecting them.

Discovery reads every library with pyelftools, so the per-container path
never loads this module: `artifact.load_or_build` caches the result on disk
and is its only library caller.  Imports neither pyelftools nor jsonschema at
import time.
"""

from __future__ import annotations
import os
import stat
from pyxis_hook.host import capabilities as caps
from pyxis_hook import log, pathnames
from pyxis_hook.errors import DriverError, ElfError, LdCacheError, PathError
from pyxis_hook.host.gpus import HostGpus
from pyxis_hook.host.gpuscan import discover_gpus
from pyxis_hook.record import field, record, replace
from pyxis_hook.host.inventory import version_key
from pyxis_hook.rootfs import resolve_in_root, to_root_relative
from pyxis_hook.host.inventory import (VERSIONED_RE, _VERSION_RE, DriverFile, Inventory, NonDriverDep,
                                       driver_major, ipc_files)
from pyxis_hook.host.freshness import stat_signature


TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: elf.py is loaded when discovery reads a library
    from pyxis_hook.loader.elf import ElfInfo

#: glibc's own libraries: always in the image, never worth recording as a missing dependency
GLIBC_SONAMES = frozenset((
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libutil.so.1",
    "libresolv.so.2", "libanl.so.1", "ld-linux-x86-64.so.2", "ld-linux.so.2", "ld-linux-aarch64.so.1",
    "ld64.so.2", "libgcc_s.so.1",
))
#: a pattern is a string: `re` compiles and caches it on first use (compiling every one at import
#: would make every import of this module pay for all of them: docs/decisions/2026-12-07-start-costs.md)
_INFER_RE = rf"^lib(?:cuda|nvidia-ml)\.so\.({_VERSION_RE})$"


# --- discovery -------------------------------------------------------------------------


@record(frozen=False)
class _State:
    """Mutable scratch space of one discovery run (never leaves this module)."""

    root: str
    version: str | None = None
    files: list[DriverFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    deps: dict[tuple[str, int, str], NonDriverDep] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)
    other_versions: set[str] = field(default_factory=set)

    def warn(self, msg: str) -> None:
        if msg not in self.warnings:
            self.warnings.append(msg)
            log.debug(msg)


def _arch() -> tuple[int, int | None, int, int | None]:
    """(64-bit cache ABI byte, 32-bit one, ELF e_machine 64, 32) of this machine (`machines.MACHINES`)."""
    from pyxis_hook.loader.machines import MACHINES

    name = os.uname().machine
    m = MACHINES.get(name)
    if m is None:
        raise DriverError(f"unsupported machine {name!r} (supported: {', '.join(MACHINES)})")
    return m.abi, m.abi32, m.em, m.em32


def discover(config, *, strict: bool = True, host: HostGpus | None = None) -> Inventory:
    """Build the inventory of `config.driver_root` (and the GPUs of proc/dev roots).

    strict: raise DriverError naming the first problem when the result is
    unusable (no driver, half-installed driver, libnvidia-tls without its
    ABI note); otherwise return what could be found, problems in `errors`.
    """
    from pyxis_hook.loader import cachelookup, cachewrite, ldcache

    if host is None:
        host = discover_gpus(config.proc_root, config.dev_root)
    # the tree the driver root names now, pinned: when the root is a link flipped to another
    # driver (an upgrade by a link swap) every path below is still this one tree's, never the
    # old driver's names resolved in the new one's files.  pathnames.realpath, as the start that
    # compares it (host/artifact.load) computes it: one answer on every Python version
    root = pathnames.realpath(config.driver_root)
    # procfs files are not stat-signed: their inode times change when the kernel
    # re-instantiates them; the node artifact compares the version text instead
    st = _State(root=root)
    abi64, abi32, mach64, mach32 = _arch()

    cache_path = os.path.join(root, "etc/ld.so.cache")
    cache = None
    if os.path.lexists(cache_path):
        try:
            cache = ldcache.read_cache(cache_path)
            st.sources.append(cache_path)
        except LdCacheError as e:
            st.errors.append(str(e))
    if not st.errors and (cache is None or not any(
            e.key.startswith(("libcuda.so", "libnvidia-ml.so")) for e in cache.entries)):
        # ldconfig never ran here (dpkg -x, a copied driver), or ran before the driver was unpacked
        # (Debian's nvidia/current without the alternatives links): index what ldconfig would find
        from pyxis_hook.host.libscan import scan_root

        scanned, dirs = scan_root(root)
        if scanned.entries or cache is None:
            st.sources.extend(dirs)
            st.warn(f"{cache_path}: {'lists no NVIDIA driver library' if cache else 'missing'}; indexed the "
                    f"driver libraries by scanning {len(dirs)} directories as ldconfig would "
                    "(run `ldconfig -r` there to use a real cache)")
            cache = scanned if cache is None else replace(
                cache, entries=cachewrite.merge_entries(cache.entries, scanned.entries))

    if cache is not None:
        entries64 = cachelookup.entries_for_arch(cache, abi64)
        entries32 = cachelookup.entries_for_arch(cache, abi32) if abi32 is not None else ()
        st.version = _pick_version(st, host, cache, entries64, abi64)
        if st.version is not None:
            _libraries(st, cache, entries64, "lib", abi64, 64, mach64)
            if entries32:
                _libraries(st, cache, entries32, "lib32", abi32, 32, mach32)
    elif host.driver_version:
        st.version = host.driver_version

    if st.version is None and not st.errors:
        where = os.path.join(config.proc_root, "driver/nvidia/version")
        st.errors.append(f"no NVIDIA driver found: no driver version in {where} and no "
                         f"libcuda.so.<version>/libnvidia-ml.so.<version> in {cache_path}")
    elif st.version is not None and not any(f.kind == "lib" for f in st.files) and cache is not None:
        st.errors.append(f"{cache_path}: no driver library of version {st.version} in the cache "
                         "(driver half installed or cache out of date)")

    _binaries(st, config)
    if st.version:
        _firmware(st)
    _ipc(st, config)
    _icd(st, config)

    cuda = None
    if st.version is not None:
        cuda = _cuda_version(st)

    errors = tuple(st.errors)
    sigs = tuple(s for s in (stat_signature(p) for p in dict.fromkeys(st.sources)) if s is not None)
    inv = Inventory(
        driver_version=st.version,
        cuda_version=cuda,
        host=host,
        files=tuple(st.files),
        missing=tuple(st.missing),
        non_driver_deps=tuple(sorted(st.deps.values(), key=lambda d: (d.elfclass, d.name, d.capability))),
        warnings=tuple(host.warnings) + tuple(st.warnings),
        errors=errors,
        driver_root=root,
        version_source=("procfs" if host.driver_version and st.version == host.driver_version
                        else "files" if st.version else ""),
        other_versions=tuple(sorted(st.other_versions)),
        sources=sigs,
    )
    if strict and errors:
        raise DriverError(errors[0])
    return inv


def _resolve(st: _State, path: str) -> str | None:
    """Host path of `path` resolved inside the driver root, None (with a warning) if it escapes/loops."""
    try:
        return resolve_in_root(st.root, path)
    except PathError as e:
        st.warn(str(e))
        return None


def _mode_in_root(st: _State, path: str) -> tuple[str, int] | None:
    """(host path, st_mode) of `path` resolved inside the driver root; None if it is not there."""
    real = _resolve(st, path)
    if real is None:
        return None
    try:
        return real, os.stat(real).st_mode
    except OSError:
        return None


def _rel(st: _State, host_path: str) -> str:
    return to_root_relative(st.root, host_path)


def _pick_version(st: _State, host: HostGpus, cache, entries, abi: int) -> str | None:
    import re  # discovery only: the hook's path reads the node artifact and never parses names
    """The driver version: procfs when the module is loaded, else inferred from file names.

    Inference follows NCT's `inferVersion` (libcuda.so.<v>, libnvidia-ml.so.<v>),
    but when several versions sit side by side we take the one the loader
    would use: where the cache's `libcuda.so.1` (else libnvidia-ml.so.1) leads.
    """
    from pyxis_hook.loader import cachelookup

    found: set[str] = set()
    for e in entries:
        if not (e.key.startswith("libcuda.so") or e.key.startswith("libnvidia-ml.so")):
            continue
        real = _resolve(st, e.value)
        if real is None:
            continue
        m = re.match(_INFER_RE, os.path.basename(real))
        if m and os.path.isfile(real):
            found.add(m.group(1))
    if host.driver_version:
        others = found - {host.driver_version}
        if others:
            st.other_versions |= others
            st.warn(f"{st.root}: libraries of driver version(s) {', '.join(sorted(others))} are also "
                    f"installed; using {host.driver_version}, the loaded kernel module's")
        if found and host.driver_version not in found:
            st.warn(f"{st.root}: the kernel module is {host.driver_version} but the libraries are "
                    f"{', '.join(sorted(found))}")
        return host.driver_version
    if not found:
        return None
    if len(found) == 1:
        return found.pop()
    chosen = None
    for soname in ("libcuda.so.1", "libnvidia-ml.so.1"):
        hit = cachelookup.search_cache(cache, soname, (abi | 0x0003, abi | 0x0001)) or \
            next((e for e in entries if e.key == soname), None)
        if hit is None:
            continue
        real = _resolve(st, hit.value)
        m = re.match(_INFER_RE, os.path.basename(real or ""))
        if m:
            chosen = m.group(1)
            break
    if chosen is None:
        chosen = max(found, key=version_key)
    st.other_versions |= found - {chosen}
    st.warn(f"{st.root}: several driver versions installed ({', '.join(sorted(found, key=version_key))}) "
            f"and no kernel module to tell which; using {chosen}, the one libcuda.so.1 points to")
    return chosen


def _libraries(st: _State, cache, entries, kind: str, abi: int, elfclass: int, machine: int) -> None:
    import re  # discovery only
    """Prefix-list libraries of one ABI, the suffix rule, ELF checks, then the DT_NEEDED closure."""
    from pyxis_hook.loader import elf

    suffix = f".so.{st.version}"
    by_path: dict[str, dict] = {}
    order: list[str] = []
    for cap, prefixes in caps.LIBRARY_PREFIXES:
        for prefix in prefixes:
            hits = [e for e in entries if e.key.startswith(prefix)]
            if not hits:
                if kind == "lib":
                    st.missing.append(f"{cap}: {prefix}")
                continue
            for e in hits:
                if caps.never_injected(e.key):
                    continue
                real = _resolve(st, e.value)
                if real is None:
                    continue
                if not os.path.exists(real):
                    st.warn(f"{st.root}{e.value}: broken symbolic link in the ld.so.cache (for {e.key}); skipping")
                    continue
                base = os.path.basename(real)
                if not base.endswith(suffix):
                    m = re.match(VERSIONED_RE, base)
                    if m:
                        st.other_versions.add(m.group(2))
                    st.warn(f"{real}: skipping: not driver version {st.version}")
                    continue
                item = by_path.get(real)
                if item is None:
                    item = {"cap": cap, "keys": [], "source": f"ldcache:{e.key}"}
                    by_path[real] = item
                    order.append(real)
                item["keys"].append(e.key)

    infos: dict[str, ElfInfo] = {}
    chosen: list[str] = []
    for real in order:
        info = _read_elf_checked(st, elf, real, elfclass, machine)
        if info is None:
            continue
        if not _abi_note_ok(st, info, real):
            continue
        infos[real] = info
        chosen.append(real)

    # DT_NEEDED closure inside the driver, breadth first and per capability: a library that a
    # capability's library needs serves that capability too, whatever list names it (550+:
    # libnvidia-glcore/-eglcore, graphics, need libnvidia-gpucomp, which the lists file under
    # compute; without it a graphics-only container cannot load libGLX_nvidia/libEGL_nvidia's core)
    flags_ok = (abi | 0x0003, abi | 0x0001)  # libc6 entries, then plain ELF ones
    have = {infos[p].soname or os.path.basename(p): p for p in chosen}
    have.update({os.path.basename(p): p for p in chosen})
    for p in chosen:
        by_path[p]["caps"] = {by_path[p]["cap"]: by_path[p]["source"]}
    queue = [(p, by_path[p]["cap"]) for p in chosen]
    while queue:
        p, cap = queue.pop(0)
        info = infos[p]
        requirer = info.soname or os.path.basename(p)
        for dep in info.needed:
            if dep in GLIBC_SONAMES:
                continue
            if dep in have:
                known = by_path.get(have[dep]) if have[dep] in infos else None
                if known is not None and cap not in known["caps"]:
                    known["caps"][cap] = f"needed-by:{requirer}"
                    queue.append((have[dep], cap))
                continue
            real = _lookup_dep(st, cache, dep, flags_ok, p)
            if real is not None and os.path.basename(real).endswith(suffix):
                dinfo = _read_elf_checked(st, elf, real, elfclass, machine)
                if dinfo is None or not _abi_note_ok(st, dinfo, real):
                    have[dep] = real
                    continue
                source = f"needed-by:{requirer}"
                by_path[real] = {"cap": cap, "keys": [dep], "source": source, "caps": {cap: source}}
                infos[real] = dinfo
                chosen.append(real)
                queue.append((real, cap))
                have[dep] = real
                have[os.path.basename(real)] = real
                continue
            key = (dep, elfclass, cap)  # per capability: a shared library's deps reach each one it serves
            old = st.deps.get(key)
            needed_by = tuple(sorted(set((old.needed_by if old else ()) + (requirer,))))
            st.deps[key] = NonDriverDep(name=dep, needed_by=needed_by, capability=cap,
                                        elfclass=elfclass, host_path=real)
            if real is None and re.match(VERSIONED_RE, dep) and dep.endswith(suffix):
                st.warn(f"{dep}: needed by {requirer} but not found in the driver root")

    # one record per (file, capability it serves); `Inventory.select` hands each host file out once
    for real in chosen:
        info = infos[real]
        item = by_path[real]
        base = os.path.basename(real)
        links = _links_for(base, info.soname, item["keys"])
        for cap, source in item["caps"].items():
            st.files.append(DriverFile(
                kind=kind, capability=cap, path=_rel(st, real), host_path=real, name=base,
                soname=info.soname, elfclass=elfclass, links=links, source=source,
                needed=tuple(info.needed),
            ))
        st.sources.append(real)


def _lookup_dep(st: _State, cache, name: str, flags_ok: tuple[int, ...], requirer: str) -> str | None:
    """Where the driver root's loader would find `name`: the cache, else next to the requirer."""
    from pyxis_hook.loader import cachelookup

    hit = cachelookup.search_cache(cache, name, flags_ok)
    if hit is None:
        hit = next((e for e in cache.entries if e.key == name and e.flags in flags_ok), None)
    if hit is not None:
        real = _resolve(st, hit.value)
        if real and os.path.isfile(real):
            return real
    real = _resolve(st, os.path.join(_rel(st, os.path.dirname(requirer)), name))
    return real if real and os.path.isfile(real) else None


def _read_elf_checked(st: _State, elf, path: str, elfclass: int, machine: int):
    try:
        info = elf.read_elf(path)
    except ElfError as e:
        st.warn(f"{e}; skipping")
        return None
    except OSError as e:
        st.warn(f"{path}: {e.strerror}; skipping")
        return None
    if info.elfclass != elfclass:
        st.warn(f"{path}: skipping: ELF class {info.elfclass}-bit, expected {elfclass}-bit")
        return None
    if info.machine != machine:
        st.warn(f"{path}: skipping: ELF machine {info.machine}, expected {machine}")
        return None
    return info


def _abi_note_ok(st: _State, info, path: str) -> bool:
    """libnvidia-tls must carry a GNU ABI note for Linux >= 2.3.99 (LNC): else a hard error."""
    base = os.path.basename(path)
    if not any(base.startswith(p) for p in caps.ABI_NOTE_REQUIRED):
        return True
    note = info.abi_note
    if note is None or note[0] != 0 or tuple(note[1:]) < caps.ABI_NOTE_MIN:
        st.errors.append(f"{path}: missing or wrong GNU ABI note (need Linux "
                         f"{'.'.join(map(str, caps.ABI_NOTE_MIN))}, found {note})")
        return False
    return True


def _links_for(base: str, soname: str | None, keys: list[str]) -> tuple[tuple[str, str], ...]:
    """SONAME link, `.so` link (when the host cache has one) and LNC's extra links."""
    links: list[tuple[str, str]] = []
    if soname and soname != base:
        links.append((soname, base))
    target = soname if soname and soname != base else base
    dev = next((k for k in keys if k.endswith(".so")), None)
    if dev and dev not in (base, soname):
        links.append((dev, target))
    for lib_soname, link, to in caps.EXTRA_LINKS:
        if soname == lib_soname and all(link != x for x, _ in links):
            links.append((link, to.format(file=base)))
    return tuple(links)


#: where distribution packages keep the driver's binaries when no PATH link was made
#: (Debian: /usr/lib/nvidia/<flavour>/nvidia-smi behind an alternatives link)
VENDOR_BIN_DIRS = ("/usr/lib/nvidia/current", "/usr/lib/nvidia")


def _bin_dirs(st: _State, config) -> list[str]:
    """config.path first (what LNC searches), then the vendor dirs, each flavour of /usr/lib/nvidia,
    then `<prefix>/bin` and `<prefix>/sbin` of the dirs the driver's libraries were found in
    (a prefix install's binaries are on no default path; host/bindirs.py)."""
    from pyxis_hook.host.bindirs import prefix_bin_dirs

    extra = list(VENDOR_BIN_DIRS)
    top = _resolve(st, "/usr/lib/nvidia")
    if top and os.path.isdir(top):
        extra += [f"/usr/lib/nvidia/{n}" for n in sorted(os.listdir(top)) if n != "current"]
    extra += prefix_bin_dirs(os.path.dirname(f.path) for f in st.files if f.kind in ("lib", "lib32"))
    return list(dict.fromkeys([*config.path, *extra]))


def _binaries(st: _State, config) -> None:
    """First hit of each binary on `config.path`, then the vendor and library-prefix dirs (`_bin_dirs`),
    each dir taken inside the driver root: only a regular executable there counts."""
    dirs = _bin_dirs(st, config)
    for cap, names in caps.BINARIES:
        for name in names:
            for d in dirs:
                hit = _mode_in_root(st, os.path.join(d, name))
                if hit is None or not stat.S_ISREG(hit[1]) or not hit[1] & 0o111:
                    continue
                real = hit[0]
                st.files.append(DriverFile(kind="bin", capability=cap, path=_rel(st, real), host_path=real,
                                           name=name, source=f"path:{d}"))
                st.sources.append(real)
                break


def _files_in_root(st: _State, directory: str, pattern: str) -> list[tuple[str, str]]:
    """(root-relative path as listed, host path resolved inside the root) of regular files matching
    `pattern` in `directory`.

    A hit that is a symlink (Debian's alternatives links for ICD files, a
    planted link) is resolved inside the root, never followed on the host;
    the listed path is kept because that is where the container's loaders
    look (/etc/vulkan/icd.d/nvidia_icd.json, not the alternatives target).
    """
    import fnmatch  # only when building (the hook path reads the node artifact)

    d = _resolve(st, directory)
    try:
        names = sorted(os.listdir(d)) if d else []
    except OSError:
        return []
    out: list[tuple[str, str]] = []
    for name in names:
        if not fnmatch.fnmatchcase(name, pattern):
            continue
        listed = os.path.join(directory, name)
        real = _resolve(st, listed)
        if real is not None and os.path.isfile(real):
            out.append((listed, real))
    return out


def _firmware(st: _State) -> None:
    """GSP firmware, in /lib/firmware, else where merged-/usr packages put it (/usr/lib/firmware).

    With /lib -> usr/lib both name the same files; with two real directories
    the first one's copy wins (the kernel's loader searches /lib first).
    Either way each firmware name is listed once, so a merged-/usr image
    never gets two mounts stacked on one file.
    """
    seen: set[str] = set()  # file names
    for template in caps.FIRMWARE_DIRS:
        directory = template.format(version=st.version)
        for listed, real in _files_in_root(st, directory, caps.FIRMWARE_GLOB):
            if os.path.basename(listed) in seen:
                continue
            seen.add(os.path.basename(listed))
            st.files.append(DriverFile(kind="firmware", capability="utility", path=listed, host_path=real,
                                       name=os.path.basename(listed), source="firmware"))
            st.sources.append(real)
    if not seen and (driver_major(st.version) or 0) >= 510:
        first = caps.FIRMWARE_DIRS[0].format(version=st.version)
        st.warn(f"{st.root}{first}: no GSP firmware (gsp*.bin)")


def _icd(st: _State, config) -> None:
    seen: set[str] = set()
    for cap, pattern in caps.ICD_FILES:
        for listed, real in _files_in_root(st, os.path.dirname(pattern), os.path.basename(pattern)):
            if listed in seen:
                continue
            seen.add(listed)
            st.files.append(DriverFile(kind="icd", capability=cap, path=listed, host_path=real,
                                       name=os.path.basename(listed), source=f"icd:{pattern}",
                                       inject=bool(config.graphics_config_files)))
            st.sources.append(real)


def _cuda_version(st: _State) -> int | None:
    """cuDriverGetVersion of the driver's libcuda, run in a child (host/cudaversion.py), when available."""
    lib = next((f for f in st.files if f.kind == "lib" and f.soname == "libcuda.so.1"), None)
    if lib is None:
        return None
    try:
        from pyxis_hook.host import cudaversion
    except ImportError:
        return None
    try:
        v = cudaversion.cuda_driver_version(lib.host_path)
    except Exception as e:  # the child failing must never stop discovery
        st.warn(f"{lib.host_path}: cuDriverGetVersion failed: {e}")
        return None
    return v if isinstance(v, int) and v > 0 else None


def _ipc(st: _State, config) -> None:
    """Daemon sockets and the MPS pipe dir, where they exist (inventory.ipc_files)."""
    st.files.extend(ipc_files(st.root, config.mps_pipe_dir, st.warn))
