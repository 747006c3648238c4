"""The loader of a root as ld.so would behave there (`LoaderEnv`), found without running it.

A search result depends on more than the object: on the root's ld.so (its
compiled-in system dirs and glibc version, read from its bytes by
`inspect_ldso`), on the CPU as that loader sees it (glibc-hwcaps and legacy
hwcap subdirs, $PLATFORM: `loadercpu`), on its ld.so.cache and on
LD_LIBRARY_PATH.  This module gathers those into one record, so the
resolver (`resolve`) and the explaining tools (`diag/ldmodel.py`) ask the
same questions of a root the same way.  The per-machine defaults glibc
compiles in (loader path, cache flags, AT_PLATFORM) are here too: they
stand in for what a root does not say.
"""

from __future__ import annotations

import os
import re
import struct
from typing import Callable

from pyxis_hook.loader import cpu as loadercpu
from pyxis_hook.errors import LdCacheError
from pyxis_hook.record import record
from pyxis_hook.rootfs import resolve_in_root

#: (name, elfclass, e_machine) -> root-relative paths; ld.so uses only the first (`_dl_load_cache_lookup`)
CacheLookup = Callable[[str, int, int], "tuple[str, ...]"]

EM_386, EM_X86_64, EM_AARCH64 = 3, 62, 183

#: the loader path compiled into glibc per (class, machine), used when the object has no PT_INTERP
DEFAULT_RTLD = {(64, EM_X86_64): "/lib64/ld-linux-x86-64.so.2", (32, EM_386): "/lib/ld-linux.so.2",
                (64, EM_AARCH64): "/lib/ld-linux-aarch64.so.1", (32, EM_X86_64): "/libx32/ld-linux-x32.so.2"}

#: which loader's ld.so.cache flags (`cachelookup.LOADER_FLAGS` key: the one table of them) an object of
#: (class, machine) is looked up with; a class/machine not here finds nothing in the cache
CACHE_LOADER = {(64, EM_X86_64): "x86_64", (32, EM_386): "i386", (64, EM_AARCH64): "aarch64",
                (32, EM_X86_64): "x32"}

#: the kernel's AT_PLATFORM per machine (x86-64 reports "x86_64", i386 "i686"); glibc overrides it on
#: some x86 CPUs (`loadercpu`)
DEFAULT_PLATFORM = {EM_X86_64: "x86_64", EM_386: "i686", EM_AARCH64: "aarch64"}


@record
class LoaderEnv:
    """Everything about the loader and its environment that changes a search result.

    `cache` is None for `--inhibit-cache` (or a root without ld.so.cache).
    `rtld` is the loader's own path (None: the object's PT_INTERP, else glibc's
    default for its class); it is "already loaded" for every search.
    `cwd` is where relative search dirs (an empty RPATH element) start.
    `legacy_cache_ok` says which legacy hwcap cache entries a loader before
    glibc 2.37 takes (None: none, as from 2.37 on); `cache` applies it.
    """

    root: str = "/"
    cache: CacheLookup | None = None
    system_dirs: tuple[str, ...] = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")
    ld_library_path: str = ""
    hwcaps: tuple[str, ...] = ()
    legacy_subdirs: tuple[str, ...] = ()
    lib_token: str = "lib"
    platform: str | None = "x86_64"
    rtld: str | None = None
    cwd: str = "/"
    glibc_version: tuple[int, int] | None = None
    legacy_cache_ok: Callable[[int], bool] | None = None


def detect_hwcaps(cpuinfo: str = "/proc/cpuinfo") -> tuple[str, ...]:
    """glibc-hwcaps subdirs the x86-64 loader supports on this CPU, most preferred first."""
    return loadercpu.x86_64_loader(loadercpu.host_cpu(cpuinfo)).hwcaps


def loader_cpu(machine: int, cpu: loadercpu.Cpu | None = None) -> loadercpu.LoaderCpu | None:
    """What the loader for ELF `machine` makes of `cpu` (default: this machine's); None off x86."""
    if machine not in (EM_X86_64, EM_386):
        return None
    cpu = loadercpu.host_cpu() if cpu is None else cpu
    return loadercpu.x86_64_loader(cpu) if machine == EM_X86_64 else loadercpu.i386_loader(cpu)


_DIRS_RE = re.compile(rb"(?:/[\x21-\x7e]*/\x00){1,16}")
_VERSION_RE = re.compile(rb"release version (\d+)\.(\d+)")


def inspect_ldso(host_path: str) -> tuple[tuple[str, ...] | None, tuple[int, int] | None]:
    """(system dirs, glibc version) compiled into an ld.so, read from its bytes without running it.

    glibc stores the dirs as one NUL-separated string ("/lib/x86_64-linux-gnu/\\0/usr/lib/...\\0")
    right after the array of their lengths (`system_dirs_len`, elf/dl-load.c); matching both
    makes a false hit practically impossible.  Returns (None, None) parts it cannot find.
    """
    try:
        with open(host_path, "rb") as f:
            data = f.read(16 << 20)
    except OSError:
        return None, None
    dirs = None
    for m in _DIRS_RE.finditer(data):
        parts = m.group(0).split(b"\0")[:-1]
        for width, fmt in ((8, "<Q"), (4, "<I"), (8, ">Q"), (4, ">I")):
            start = m.start() - width * len(parts)
            if start < 0:
                continue
            lens = struct.unpack_from(fmt[0] + fmt[1] * len(parts), data, start)
            if list(lens) == [len(p) for p in parts]:
                dirs = tuple(os.fsdecode(p).rstrip("/") or "/" for p in parts)
                break
        if dirs:
            break
    vm = _VERSION_RE.search(data)
    version = (int(vm.group(1)), int(vm.group(2))) if vm else None
    return dirs, version


def _heuristic_system_dirs(root: str, interp: str) -> tuple[str, ...]:
    """pax-utils' rule when the ld.so cannot be read: dir of realpath(PT_INTERP), its /usr twin, /lib, /usr/lib."""
    real = resolve_in_root(root, interp)
    rel = real[len(os.path.normpath(root)):] if os.path.normpath(root) != "/" else real
    d = os.path.dirname(rel) or "/"
    base = d[4:] if d.startswith("/usr/") else d
    dirs = [base, "/usr" + base]
    if "-linux-" in os.path.basename(base):
        dirs += ["/lib", "/usr/lib"]
    return tuple(dirs)


def cache_lookup_for(cache, *, hwcaps: tuple[str, ...] = (), legacy_ok=None) -> CacheLookup:
    """Adapt a `pyxis_hook.loader.ldcache.LdCache` to the resolver's CacheLookup (flags per class/machine).

    `hwcaps` and `legacy_ok` are `cachelookup.lookup`'s: the glibc-hwcaps subdirs and
    the legacy hwcap entries (glibc < 2.37) the loader takes.
    """
    from pyxis_hook.loader import cachelookup

    flags_by_arch = {arch: cachelookup.LOADER_FLAGS[name] for arch, name in CACHE_LOADER.items()}

    def lookup(name: str, elfclass: int, machine: int) -> tuple[str, ...]:
        ok = flags_by_arch.get((elfclass, machine))
        if ok is None:
            return ()
        return tuple(e.value for e in cachelookup.lookup(cache, name, ok, hwcaps=hwcaps, legacy_ok=legacy_ok))

    return lookup


def loader_env_for_root(
    root: str = "/",
    *,
    elfclass: int = 64,
    machine: int = EM_X86_64,
    interp: str | None = None,
    ld_library_path: str = "",
    inhibit_cache: bool = False,
    hwcaps: tuple[str, ...] | None = None,
    system_dirs: tuple[str, ...] | None = None,
    platform: str | None = None,
    cache_path: str = "/etc/ld.so.cache",
    rtld: str | None = None,
    cwd: str | None = None,
    cpu: loadercpu.Cpu | None = None,
) -> LoaderEnv:
    """The loader of `root` as ld.so would behave there: its compiled-in dirs, $LIB, hwcaps, cache.

    `elfclass`/`machine` are those of the objects to resolve (the loader's own);
    `interp` is the root-relative PT_INTERP whose ld.so decides the system dirs
    and glibc version (legacy hwcap subdirs before 2.37), default glibc's path
    for that class.  `hwcaps`, `platform` and the legacy subdirs default to
    what that loader makes of `cpu` (default: this machine's, from
    /proc/cpuinfo; see `loadercpu`), else to the kernel's AT_PLATFORM.  A
    missing or unreadable cache is treated as no cache, as ld.so does.
    """
    root = os.path.normpath(os.path.abspath(root))
    if interp is None:
        interp = DEFAULT_RTLD.get((elfclass, machine), "/lib64/ld-linux-x86-64.so.2")
    seen = loader_cpu(machine, cpu)
    if platform is None:
        platform = seen.platform if seen else DEFAULT_PLATFORM.get(machine)
    ldso_host = resolve_in_root(root, interp)
    found_dirs, version = inspect_ldso(ldso_host)
    dirs = system_dirs or found_dirs or _heuristic_system_dirs(root, interp)
    if hwcaps is None:
        hwcaps = seen.hwcaps if seen else ()
    legacy: tuple[str, ...] = ()
    legacy_ok = None
    if version is not None and version < (2, 37) and seen is not None:
        legacy = loadercpu.legacy_subdirs(seen.hwcap_names, platform)
        legacy_ok = loadercpu.legacy_cache_ok(seen.hwcap_names, platform)
    cache = None
    if not inhibit_cache:
        from pyxis_hook.loader import ldcache

        try:
            cache = cache_lookup_for(ldcache.read_cache(resolve_in_root(root, cache_path)), hwcaps=hwcaps,
                                     legacy_ok=legacy_ok)
        except (LdCacheError, OSError):
            cache = None
    return LoaderEnv(root=root, cache=cache, system_dirs=tuple(dirs), ld_library_path=ld_library_path,
                     hwcaps=tuple(hwcaps), legacy_subdirs=legacy, lib_token=dirs[0].lstrip("/") if dirs else "lib",
                     platform=platform, rtld=rtld, cwd=cwd if cwd is not None else (os.getcwd() if root == "/" else "/"),
                     glibc_version=version, legacy_cache_ok=legacy_ok)
