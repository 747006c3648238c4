"""The container's-eye view of the dynamic loader, without running anything from the image.

Why: most "CUDA does not see the GPU" threads end in a loader problem inside
the image — a toolkit stub `libcuda.so.1` or an old `compat/` dir on
`LD_LIBRARY_PATH`, a bundled `libnvidia-ml` of another driver version, a
truncated file earlier in the search path, a stale ld.so.cache, GLX's
`libX11.so.6` missing.  `check_image` resolves every driver library the
container gets the way *its* ld.so will (LD_LIBRARY_PATH from config.json,
the image's ld.so.cache as it is after injection — image entries merged with
the injected ones via `ldcache.merge_entries` — and the default dirs compiled
into the image's ld.so) and turns each deviation into a `Finding`.

The injected files are not in the image yet (unless `--pid`), so they are
modelled as *virtual files*: a candidate whose directory resolves (inside the
rootfs) to the injection directory and whose name is the injected file or one
of its links is the host driver's file.  Every other candidate goes through
glibc's `open_verify` rules (`resolve.verify_candidate`): wrong class or
machine is skipped, a short or corrupt file stops the load ("fatal
shadowing").  Nothing from the image is executed; every path is resolved
inside the rootfs.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Mapping

from pyxis_hook.spec.asks import is_legacy
from pyxis_hook.errors import LdCacheError, PathError, RequestError, RequirementError
from pyxis_hook.diag.findings import Finding
from pyxis_hook.plan.build import COMPAT_DIR, ContainerFacts, cuda_compat
from pyxis_hook.record import record, replace
from pyxis_hook.rootfs import resolve_in_root, try_resolve_in_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyxis_hook.loader.ldcache import LdCache

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

#: where CUDA images keep the runtime (besides the search dirs); the forward-compat driver's
#: dir is plan.COMPAT_DIR, read by container.container_facts as the hook reads it
CUDA_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
             "/usr/local/cuda/targets/sbsa-linux/lib")

CUDART_PREFIX = "libcudart.so."


@record
class InjectedFile:
    """A driver library as the container gets it: `container_path` (the versioned file) and
    `names`, every name it answers to in that directory (file, SONAME link, extra links);
    `covered`: the image's own files the hook covers with it there (`plan.link_edit`)."""

    soname: str
    container_path: str
    names: tuple[str, ...]
    host_path: str
    elfclass: int
    capability: str
    needed: tuple[str, ...] = ()
    covered: tuple[str, ...] = ()


@record
class Candidate:
    """One file the loader looked at: `outcome` is host (the injected driver file), image (an image
    file that is accepted), skipped (wrong class/machine/unreadable) or fatal (the load stops)."""

    path: str
    how: str
    outcome: str
    reason: str = ""


@record
class Resolution:
    """Where one SONAME resolves: `path` None when nothing matched; `tried` in search order."""

    soname: str
    elfclass: int
    injected: str | None
    path: str | None
    how: str
    outcome: str  # host | image | fatal | not-found
    tried: tuple[Candidate, ...] = ()

    @property
    def is_host_file(self) -> bool:
        return self.outcome == "host"

    def to_dict(self) -> dict:
        return {"soname": self.soname, "elfclass": self.elfclass, "injected": self.injected,
                "path": self.path, "how": self.how, "outcome": self.outcome,
                "is_host_file": self.is_host_file,
                "tried": [{"path": c.path, "how": c.how, "outcome": c.outcome, "reason": c.reason}
                          for c in self.tried]}


@record
class SearchSetup:
    """What the container's loader of one class searches: LD_LIBRARY_PATH dirs, the cache, the
    default dirs, and the subdirectories tried in each (glibc-hwcaps first)."""

    elfclass: int
    machine: int
    ld_library_path: tuple[str, ...]
    cache: LdCache | None  # after injection
    system_dirs: tuple[str, ...]
    subdirs: tuple[str, ...] = ("",)
    hwcaps: tuple[str, ...] = ()
    legacy_cache_ok: object | None = None  # which legacy hwcap cache entries (glibc < 2.37) it takes


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


# ------------------------------------------------------------------ what gets injected


def injected_libs(inventory, capabilities, facts) -> tuple[InjectedFile, ...]:
    """The libraries `inventory.select(capabilities)` puts into the container described by `facts`
    (lib -> facts.lib_dir/name, lib32 -> facts.lib32_dir/name, as plan.build_plan places them).

    Each link name answers with the host's file exactly when the hook's own
    `plan.link_edit` makes it (a symlink, or a bind over the image's file);
    a directory of the image there stays the image's.
    """
    from pyxis_hook.plan.build import MountEdit, link_edit

    out = []
    for f in inventory.select(capabilities, kinds=("lib", "lib32")):
        d = facts.lib_dir if f.kind == "lib" else facts.lib32_dir
        if not d or not f.soname:
            continue
        names, covered = [f.name], []
        for link, target in f.links:
            edit, _note = link_edit(f"{d}/{link}", target, f, facts)
            if edit is not None:
                names.append(link)
            if isinstance(edit, MountEdit):
                covered.append(edit.container_path)
        out.append(InjectedFile(f.soname, f"{d}/{f.name}", tuple(dict.fromkeys(names)), f.host_path,
                               f.elfclass or (64 if f.kind == "lib" else 32), f.capability, tuple(f.needed),
                               tuple(covered)))
    return tuple(out)


def virtual_files(rootfs: str, libs: tuple[InjectedFile, ...]) -> dict[tuple[str, str], InjectedFile]:
    """(host dir, file name) -> injected library, for every name an injected library answers to."""
    out: dict[tuple[str, str], InjectedFile] = {}
    for lib in libs:
        d = try_resolve_in_root(rootfs, os.path.dirname(lib.container_path))
        if d is None:
            continue
        for n in lib.names:
            out[(d, n)] = lib
    return out


def cache_after_injection(image_cache, libs: tuple[InjectedFile, ...], first: tuple = ()):
    """The image's cache (or an empty one) with one entry per injected SONAME, as the hook leaves it.

    Each entry gets the flags ldconfig would give the file (`ldcache.written_flags`:
    a 32-bit library without DT_NEEDED is plain ELF, 0x0001), as the hook's merge writes them.
    `first` are (dir, file name, SONAME, flags) rows of a directory the hook puts before the
    injected one (CUDA forward compat, `LdcacheUpdate.first_dirs`): in the real cache both
    entries are listed and the first wins, so here the first dir's entry takes the slot.
    """
    from pyxis_hook.loader import ldcache

    added = [ldcache.CacheEntry(lib.soname, f"{os.path.dirname(lib.container_path)}/{lib.soname}",
                                ldcache.written_flags(lib.elfclass, lib.needed)) for lib in libs]
    if first:
        ahead = [ldcache.CacheEntry(soname, f"{d}/{name}", flags) for d, name, soname, flags in first]
        taken = {(e.key, e.flags) for e in ahead}
        added = ahead + [e for e in added if (e.key, e.flags) not in taken]
    existing = image_cache.entries if image_cache is not None else ()
    merged = ldcache.merge_entries(existing, added)
    return ldcache.LdCache(merged, image_cache.generator if image_cache is not None else None, "new",
                           name="/etc/ld.so.cache (after injection)")


def compat_rows(rootfs: str, facts: ContainerFacts) -> tuple[tuple[str, str, str, int], ...]:
    """The cache rows of the image's compat dir when the hook puts it first: `facts.compat_libs`
    (what ldconfig indexes there), each valued `dir/SONAME` as ldconfig links it, or the file
    itself where the image lacks that link (ldconfig would make it; the file is the same)."""
    host = try_resolve_in_root(rootfs, COMPAT_DIR)
    rows = []
    for name, soname, flags in facts.compat_libs:
        there = host is not None and os.path.lexists(os.path.join(host, soname))
        rows.append((COMPAT_DIR, soname if there else name, soname, flags))
    return tuple(rows)


# ------------------------------------------------------------------ the search


def loader_of(elfclass: int, machine: str | None = None) -> tuple[int, str | None, str | None]:
    """(ELF e_machine, PT_INTERP, the kernel's AT_PLATFORM) of the container's loader for a class on this machine.

    From `machines.MACHINES` (which e_machine the driver's libraries of each
    class have here; x86-64's for a machine without a row) and resolve's
    per-(class, machine) loader tables; None where glibc has no such loader
    (32-bit on ppc64le).
    """
    from pyxis_hook.loader import machines, resolve

    row = machines.machine(machine or os.uname().machine) or machines.MACHINES["x86_64"]
    em = (row.em if elfclass == 64 else row.em32) or 0
    return em, resolve.DEFAULT_RTLD.get((elfclass, em)), resolve.DEFAULT_PLATFORM.get(em)


def _fallback_dirs(elfclass: int, machine: str | None = None) -> tuple[str, ...]:
    """Debian's and RHEL's default dirs, for an image whose ld.so cannot be inspected."""
    from pyxis_hook.loader import machines

    return machines.lib_dirs(machine or os.uname().machine, elfclass)


def search_setup(rootfs: str, elfclass: int, ld_library_path: str, cache) -> SearchSetup:
    """The loader of `rootfs` for one class: its compiled-in dirs and hwcaps subdirs (loader/resolve.py)."""
    from pyxis_hook.loader import resolve

    machine, interp, platform = loader_of(elfclass)
    try:
        if interp is None:
            raise PathError(f"no {elfclass}-bit loader for ELF machine {machine}")
        env = resolve.loader_env_for_root(rootfs, elfclass=elfclass, machine=machine, interp=interp,
                                          inhibit_cache=True, cwd="/")
        dirs, hwcaps, legacy, platform = env.system_dirs, env.hwcaps, env.legacy_subdirs, env.platform
        legacy_ok = env.legacy_cache_ok
    except (PathError, OSError):
        dirs = _fallback_dirs(elfclass)
        hwcaps, legacy, legacy_ok = (), (), None
    subdirs = tuple(f"glibc-hwcaps/{h}" for h in hwcaps) + tuple(legacy) + ("",)
    # $LIB/$PLATFORM expand as in ld.so; $ORIGIN (the main program's dir) is unknown here: dropped
    dst = resolve.LoaderEnv(lib_token=dirs[0].lstrip("/") if dirs else "lib", platform=platform)
    llp = resolve.fillin(resolve.split_search_path(ld_library_path), None, dst) if ld_library_path else ()
    return SearchSetup(elfclass, machine, llp, cache, tuple(dirs), subdirs, tuple(hwcaps), legacy_ok)


def _candidates(setup: SearchSetup, name: str):
    """resolve's search order (`resolve.search_order`) for a name a program without RPATH/RUNPATH dlopens."""
    from pyxis_hook.loader import ldcache, resolve

    def cached() -> str | None:
        hit = ldcache.lookup(setup.cache, name, ldcache.accepted_flags(setup.elfclass), hwcaps=setup.hwcaps,
                             legacy_ok=setup.legacy_cache_ok)
        return hit[0].value if hit else None

    return resolve.search_order(name, ld_library_path=setup.ld_library_path,
                                cached=cached if setup.cache is not None else None,
                                system_dirs=setup.system_dirs, subdirs=setup.subdirs)


def _skip_reason(rootfs: str, path: str, elfclass: int, machine: int) -> str:
    from pyxis_hook.loader.elf import elf_header
    from pyxis_hook.errors import ElfError

    try:
        cls, mach = elf_header(resolve_in_root(rootfs, path))
    except (ElfError, PathError, OSError):
        return "cannot be opened"
    if cls != elfclass:
        return f"{cls}-bit ELF, the loader wants {elfclass}-bit"
    if mach != machine:
        return f"ELF machine {mach}, the loader wants {machine}"
    return "not for this system (ABI note)"


def resolve_soname(rootfs: str, name: str, setup: SearchSetup,
                   virtual: Mapping[tuple[str, str], InjectedFile] | None = None) -> Resolution:
    """Where the container's ld.so finds `name` (as dlopen'ed by a program without RPATH)."""
    from pyxis_hook.loader import resolve

    virtual = virtual or {}
    tried: list[Candidate] = []
    injected = next((lib.container_path for lib in virtual.values()
                     if lib.soname == name and lib.elfclass == setup.elfclass), None)
    seen: set[str] = set()
    for path, how in _candidates(setup, name):
        if path in seen:
            continue
        seen.add(path)
        d = try_resolve_in_root(rootfs, os.path.dirname(path))
        lib = virtual.get((d, os.path.basename(path))) if d is not None else None
        if lib is not None and lib.elfclass == setup.elfclass:
            tried.append(Candidate(path, how, "host"))
            return Resolution(name, setup.elfclass, lib.container_path, path, how, "host", tuple(tried))
        try:
            status = resolve.verify_candidate(rootfs, path, setup.elfclass, setup.machine, name)
        except resolve.LoadFailed as e:
            tried.append(Candidate(path, how, "fatal", e.reason))
            return Resolution(name, setup.elfclass, injected, path, how, "fatal", tuple(tried))
        if status == "ok":
            tried.append(Candidate(path, how, "image"))
            return Resolution(name, setup.elfclass, injected, path, how, "image", tuple(tried))
        if status == "skip":
            tried.append(Candidate(path, how, "skipped",
                                   _skip_reason(rootfs, path, setup.elfclass, setup.machine)))
    return Resolution(name, setup.elfclass, injected, None, "not found", "not-found", tuple(tried))


# ------------------------------------------------------------------ findings per library


def _real_in_root(rootfs: str, path: str) -> str:
    """Root-relative path after following symlinks inside the rootfs."""
    from pyxis_hook.rootfs import to_root_relative

    try:
        return to_root_relative(os.path.normpath(os.path.abspath(rootfs)), resolve_in_root(rootfs, path))
    except (PathError, ValueError):
        return path


def _driver_major(version: str | None) -> int | None:
    """535 of "535.104.05" (inventory's version order); None when unknown or not a driver version."""
    from pyxis_hook.host.inventory import driver_major

    return driver_major(version)


def _lib_version(name: str) -> str | None:
    """The driver version in a versioned driver library file name (libcuda.so.550.54.15 -> 550.54.15)."""
    from pyxis_hook.host import inventory

    m = re.match(inventory.VERSIONED_RE, name)
    return m.group(2) if m else None


def compat_verdict(rootfs: str, real: str, facts: ContainerFacts | None, driver_version: str | None,
                   config=None) -> tuple[bool, str]:
    """Whether NVIDIA's forward-compat rule (`plan.cuda_compat`, capabilities and cuda-compat aside)
    lets the compat library at root-relative `real` serve this host driver, and the rule's note.

    The image's COMPAT_DIR is judged by its libcuda as the hook reads it (`facts`); a copy
    elsewhere (a versioned /usr/local/cuda-X.Y/compat on LD_LIBRARY_PATH) by its own file name
    and, for a libcuda, its own `.note.cuda.fwd_compatibility` (`container.read_elf_facts`).
    """
    from pyxis_hook.spec.config import Config

    d = try_resolve_in_root(rootfs, os.path.dirname(real))
    if facts is not None and facts.compat_libcuda and d is not None and d == try_resolve_in_root(rootfs, COMPAT_DIR):
        judged = facts
    else:
        version = _lib_version(os.path.basename(real))
        drivers = _note_of(rootfs, real) if os.path.basename(real).startswith("libcuda.so.") else None
        judged = ContainerFacts(rootfs, compat_libcuda=f"libcuda.so.{version}" if version else "",
                                compat_drivers=drivers)
        if not version:
            return False, f"{real} has no driver version in its name"
    use, note = cuda_compat(replace(config or Config(), cuda_compat="ldconfig"), ("compute",), judged, driver_version)
    return use, note.removeprefix("cuda-compat: ")


def _note_of(rootfs: str, path: str) -> tuple[int, ...] | None:
    """The driver branches of a library's forward-compat note (None: no note, or unreadable), read
    by the hook's own reader."""
    from pyxis_hook.plan import container

    from pyxis_hook.rootfs import RootFS

    try:
        with RootFS(rootfs) as rfs:  # through fds inside the root: a swapped link never reaches the host
            fd = rfs.open_regular(path)
    except (OSError, PathError):
        return None
    try:
        return container.read_elf_facts(fd, os.fstat(fd).st_size, os.uname().machine, True)[3]
    except container.ElfFactsError:  # the reader's "cannot make sense of it": as without a note
        return None
    finally:
        os.close(fd)


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
        works, note = compat_verdict(rootfs, real, facts, driver_version, config)
        version = _lib_version(os.path.basename(real))
        if works:
            hooks = res.how == "ld.so.cache" and hook_compat and real.startswith(COMPAT_DIR + "/")
            out.append(Finding(
                "info", "compat-libcuda-used",
                f"{res.soname} resolves to the forward-compatibility copy {shown} via {res.how} "
                f"(driver {_driver_major(version)} on a {_driver_major(driver_version)} host)",
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


# ------------------------------------------------------------------ CUDA compatibility


@record
class CudaFacts:
    """The CUDA runtimes the image ships (the forward-compat driver is `ContainerFacts.compat_*`,
    read by `container.container_facts` as the hook reads it)."""

    cudart: tuple[tuple[str, int], ...] = ()  # (root-relative path, version as 12040)


def cuda_facts(rootfs: str, search_dirs) -> CudaFacts:
    from pyxis_hook.host.cudaversion import parse_cuda_version

    found: dict[str, int] = {}
    for d in dict.fromkeys(tuple(search_dirs) + CUDA_DIRS):
        host = try_resolve_in_root(rootfs, d)
        if host is None or not os.path.isdir(host):
            continue
        for p in sorted(glob.glob(os.path.join(glob.escape(host), CUDART_PREFIX + "*"))):
            version = parse_cuda_version(os.path.basename(p)[len(CUDART_PREFIX):])
            if version is not None:
                found.setdefault(f"{d.rstrip('/')}/{os.path.basename(p)}", version)
    return CudaFacts(tuple(found.items()))


def cuda_findings(env: Mapping[str, str], cuda: CudaFacts, host_cuda: int | None, driver_version: str | None,
                  config, facts: ContainerFacts | None = None, capabilities=("compute",)) -> list[Finding]:
    """The image's CUDA needs against the host driver, and what its forward-compat driver does.

    Whether the compat driver bridges a gap is the hook's own decision
    (`plan.cuda_compat` on the hook's `ContainerFacts`): "bridges the gap"
    exactly when the hook puts COMPAT_DIR first, else the rule's note says why not.
    """
    from pyxis_hook.spec import require
    from pyxis_hook.host.cudaversion import format_cuda_version

    out: list[Finding] = []
    facts = facts or ContainerFacts(rootfs="")
    bridge, note = cuda_compat(config, capabilities, facts, driver_version)
    why_not = note.removeprefix("cuda-compat: ")
    lib = f"{COMPAT_DIR}/{facts.compat_libcuda}"
    host_text = format_cuda_version(host_cuda) if host_cuda else None
    if facts.compat_libcuda and not bridge:
        out.append(Finding("info", "compat-not-used", why_not,
                           "the hook puts the image's forward-compat driver first only by NVIDIA's rule (the "
                           "note's driver branches, else a newer major), for compute, with cuda-compat = "
                           "\"ldconfig\"; otherwise it leaves it out", "nothing to do (or drop "
                           f"{COMPAT_DIR} from the image)"))

    def gap(code: str, what: str, need: str) -> Finding:
        if bridge:
            return Finding("warning", "cuda-needs-compat",
                           f"{what}; the image's forward-compat {lib} "
                           f"(driver {_driver_major(_lib_version(facts.compat_libcuda))}) bridges the gap",
                           "forward compatibility works only on data-center GPUs with a supported driver branch; "
                           "elsewhere CUDA fails with error 804",
                           "to avoid depending on it, update the host driver")
        why = "a CUDA runtime newer than the driver fails: 'CUDA driver version is insufficient for CUDA runtime version'"
        if facts.compat_libcuda:
            why += f"; the image's forward-compat driver cannot bridge it: {why_not}"
        return Finding("error", code, what, why,
                       f"update the host driver to one that supports CUDA {need} "
                       f"or use an image built for CUDA {host_text} or older")

    try:
        reqs = require.parse_requirements(env, config.disable_require)
    except RequirementError as e:
        out.append(Finding("error", "bad-requirement", str(e),
                           "the hook refuses a container whose NVIDIA_REQUIRE_* cannot be parsed",
                           "fix the variable in the image, or set NVIDIA_DISABLE_REQUIRE=true"))
        reqs = ()
    if host_cuda is None:
        if reqs or cuda.cudart:
            out.append(Finding("info", "host-cuda-unknown", "the host driver's CUDA version is unknown",
                               "cuDriverGetVersion of the host libcuda could not be asked, so the image's "
                               "CUDA needs cannot be checked", "run `pyxis-hook info` on the host"))
        return out
    hf = require.HostFacts(cuda=host_text, driver=driver_version)
    for req in reqs:
        if not require.requirement_holds(req, hf, None):
            cuda_terms = [str(t) for g in req.groups for t in g if t.key == "cuda"]
            need = cuda_terms[0].lstrip("cuda<>=!") if cuda_terms else req.expression
            label = (f"CUDA_VERSION={env.get('CUDA_VERSION', '')!r} (legacy image without NVIDIA_REQUIRE_CUDA)"
                     if req.variable == "CUDA_VERSION" else f"{req.variable}={req.expression!r}")
            out.append(gap("cuda-version-mismatch",
                           f"{label} needs CUDA {need} but the host driver {driver_version} provides CUDA {host_text}",
                           need))
    for path, version in cuda.cudart:
        if version > host_cuda:
            out.append(gap("cudart-newer-than-driver",
                           f"{path} is CUDA {format_cuda_version(version)} but the host driver "
                           f"{driver_version} provides CUDA {host_text}", format_cuda_version(version)))
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
