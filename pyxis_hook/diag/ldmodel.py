"""The container's loader, modelled for ldcheck: the injected files as virtual files, and glibc's search.

ldcheck must answer "which file would this container's ld.so load" before
the hook has injected anything (unless `--pid`), so the injected driver
libraries are modelled as *virtual files* (`virtual_files`): a candidate
whose directory resolves (inside the rootfs) to the injection directory and
whose name is the injected file or one of its links is the host driver's
file.  The cache is the image's as the hook leaves it (`cache_after_injection`,
the same merge rule).  The search itself is the hook's one model of ld.so's
order (`searchpath.search_order`), walked here with the container's
LD_LIBRARY_PATH, its loader's compiled-in dirs and hwcaps subdirs
(`search_setup`); every other candidate goes through glibc's `open_verify`
rules (`resolve.verify_candidate`).  What a resolution means for the user
is `diag/ldcheck.py`'s business; this module only says where a name lands.
"""

from __future__ import annotations

import os
from typing import Mapping

from pyxis_hook.errors import PathError
from pyxis_hook.plan.build import COMPAT_DIR, ContainerFacts
from pyxis_hook.record import record
from pyxis_hook.rootfs import resolve_in_root, try_resolve_in_root

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyxis_hook.loader.ldcache import LdCache


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
    from pyxis_hook.loader import cachewrite, ldcache

    added = [ldcache.CacheEntry(lib.soname, f"{os.path.dirname(lib.container_path)}/{lib.soname}",
                                ldcache.written_flags(lib.elfclass, lib.needed)) for lib in libs]
    if first:
        ahead = [ldcache.CacheEntry(soname, f"{d}/{name}", flags) for d, name, soname, flags in first]
        taken = {(e.key, e.flags) for e in ahead}
        added = ahead + [e for e in added if (e.key, e.flags) not in taken]
    existing = image_cache.entries if image_cache is not None else ()
    merged = cachewrite.merge_entries(existing, added)
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
    class have here; x86-64's for a machine without a row) and loaderenv's
    per-(class, machine) loader tables; None where glibc has no such loader
    (32-bit on ppc64le).
    """
    from pyxis_hook.loader import loaderenv, machines

    row = machines.machine(machine or os.uname().machine) or machines.MACHINES["x86_64"]
    em = (row.em if elfclass == 64 else row.em32) or 0
    return em, loaderenv.DEFAULT_RTLD.get((elfclass, em)), loaderenv.DEFAULT_PLATFORM.get(em)


def _fallback_dirs(elfclass: int, machine: str | None = None) -> tuple[str, ...]:
    """Debian's and RHEL's default dirs, for an image whose ld.so cannot be inspected."""
    from pyxis_hook.loader import machines

    return machines.lib_dirs(machine or os.uname().machine, elfclass)


def search_setup(rootfs: str, elfclass: int, ld_library_path: str, cache) -> SearchSetup:
    """The loader of `rootfs` for one class: its compiled-in dirs and hwcaps subdirs (loader/loaderenv.py)."""
    from pyxis_hook.loader import loaderenv, searchpath

    machine, interp, platform = loader_of(elfclass)
    try:
        if interp is None:
            raise PathError(f"no {elfclass}-bit loader for ELF machine {machine}")
        env = loaderenv.loader_env_for_root(rootfs, elfclass=elfclass, machine=machine, interp=interp,
                                            inhibit_cache=True, cwd="/")
        dirs, hwcaps, legacy, platform = env.system_dirs, env.hwcaps, env.legacy_subdirs, env.platform
        legacy_ok = env.legacy_cache_ok
    except (PathError, OSError):
        dirs = _fallback_dirs(elfclass)
        hwcaps, legacy, legacy_ok = (), (), None
    subdirs = tuple(f"glibc-hwcaps/{h}" for h in hwcaps) + tuple(legacy) + ("",)
    # $LIB/$PLATFORM expand as in ld.so; $ORIGIN (the main program's dir) is unknown here: dropped
    dst = loaderenv.LoaderEnv(lib_token=dirs[0].lstrip("/") if dirs else "lib", platform=platform)
    llp = searchpath.fillin(searchpath.split_search_path(ld_library_path), None, dst) if ld_library_path else ()
    return SearchSetup(elfclass, machine, llp, cache, tuple(dirs), subdirs, tuple(hwcaps), legacy_ok)


def _candidates(setup: SearchSetup, name: str):
    """The search order (`searchpath.search_order`) for a name a program without RPATH/RUNPATH dlopens."""
    from pyxis_hook.loader import cachelookup, searchpath

    def cached() -> str | None:
        hit = cachelookup.lookup(setup.cache, name, cachelookup.accepted_flags(setup.elfclass), hwcaps=setup.hwcaps,
                             legacy_ok=setup.legacy_cache_ok)
        return hit[0].value if hit else None

    return searchpath.search_order(name, ld_library_path=setup.ld_library_path,
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
