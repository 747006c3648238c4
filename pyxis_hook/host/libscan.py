"""Index a driver root that has no ld.so.cache, the way ldconfig would have indexed it.

A tree made with `dpkg -x` of the driver packages, a driver copied from
another host, an image layer holding only the driver: the libraries are
there but ldconfig never ran, so there is no `etc/ld.so.cache`.
libnvidia-container stops at that point; we index what ldconfig would scan
— the root's ld.so.conf, the built-in directories, the vendor
subdirectories the packages use (Debian's `nvidia/current`, `nvidia/tesla-*`)
and `/usr/local/nvidia/lib*` — and give discovery the same `CacheEntry`
records a real cache would, sorted as ldconfig sorts them.

Only names a driver can own are read (pyelftools, once per driver: this is
discovery, not the per-container path).
"""

from __future__ import annotations

import os

from pyxis_hook.host import capabilities as caps
from pyxis_hook.loader import cachewrite, ldcache
from pyxis_hook import log
from pyxis_hook.errors import ElfError, PathError
from pyxis_hook.rootfs import resolve_in_root

#: ldconfig's built-in directories, for 64- and 32-bit, per machine (plus the lib64 forms)
BUILTIN_DIRS = {
    "x86_64": ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib",
               "/lib/i386-linux-gnu", "/usr/lib/i386-linux-gnu", "/lib32", "/usr/lib32"),
    "aarch64": ("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"),
    "ppc64le": ("/lib/powerpc64le-linux-gnu", "/usr/lib/powerpc64le-linux-gnu", "/lib64", "/usr/lib64", "/lib",
                "/usr/lib"),
}
EXTRA_DIRS = ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib")
#: where distribution packages keep the driver below a library directory
VENDOR_SUBDIR = "nvidia"
GENERATOR = "pyxis-hook: indexed by scanning (the driver root has no ld.so.cache)"


def driver_name(name: str) -> bool:
    """A file name a driver library (or one it needs internally) can have."""
    if not (name.startswith("lib") and ".so" in name):
        return False
    if name.startswith(("libnvidia", "libnv", "libcuda")):
        return True
    return any(name.startswith(p) for _cap, prefixes in caps.LIBRARY_PREFIXES for p in prefixes)


def candidate_dirs(root: str, machine: str | None = None) -> tuple[str, ...]:
    """Root-relative directories to index, in ldconfig's order, each followed by its vendor subdirs."""
    from pyxis_hook.loader.ldconf import existing_dirs, read_ld_so_conf

    machine = machine or os.uname().machine
    conf = read_ld_so_conf(root, "/etc/ld.so.conf")
    base = list(dict.fromkeys([*conf.dirs, *BUILTIN_DIRS.get(machine, ()), *EXTRA_DIRS]))
    return existing_dirs(root, [sub for d in base for sub in (d, *_vendor_subdirs(root, d))])


def _vendor_subdirs(root: str, d: str) -> list[str]:
    """`<d>/nvidia` and each `<d>/nvidia/<flavour>` (current, tesla-470, legacy-390xx, ...)."""
    try:
        top = resolve_in_root(root, f"{d}/{VENDOR_SUBDIR}")
        names = sorted(os.listdir(top))
    except (OSError, PathError):
        return []
    return [f"{d}/{VENDOR_SUBDIR}", *(f"{d}/{VENDOR_SUBDIR}/{n}" for n in names)]


def scan_root(root: str, machine: str | None = None) -> tuple[ldcache.LdCache, tuple[str, ...]]:
    """(a cache-like index of the driver libraries under `root`, the host paths of the dirs read)."""
    from pyxis_hook.loader import elf
    from pyxis_hook.loader.ldcache import written_flags

    machine = machine or os.uname().machine
    entries: list[ldcache.CacheEntry] = []
    seen: set[tuple[str, int]] = set()
    dirs_read: list[str] = []
    for d in candidate_dirs(root, machine):
        host_dir = resolve_in_root(root, d)
        dirs_read.append(host_dir)
        try:
            names = sorted(os.listdir(host_dir))
        except OSError:
            continue
        for name in names:
            if not driver_name(name):
                continue
            try:
                real = resolve_in_root(root, f"{d}/{name}")
            except PathError:
                continue
            if not os.path.isfile(real):
                continue
            try:
                info = elf.read_elf(real)
            except ElfError as e:
                log.debug(f"scan: {e}")
                continue
            if info.etype != 3:  # ET_DYN only, as ldconfig
                continue
            key = info.soname or name
            flags = written_flags(info.elfclass, info.needed, machine)
            if (key, flags) in seen:
                continue  # an earlier directory (or the real file next to its link) wins, as in ldconfig
            seen.add((key, flags))
            link = f"{d}/{key}"
            try:
                value = link if os.path.lexists(resolve_in_root(root, link)) else f"{d}/{name}"
            except PathError:  # a looping SONAME link: the file itself is the entry
                value = f"{d}/{name}"
            entries.append(ldcache.CacheEntry(key, value, flags))
    cache = ldcache.LdCache(entries=cachewrite.sort_entries(entries), generator=GENERATOR, fmt="scan",
                            name=os.path.join(root, "etc/ld.so.cache"))
    return cache, tuple(dirs_read)
