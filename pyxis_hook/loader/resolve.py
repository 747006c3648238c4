"""Where glibc's ld.so would find each DT_NEEDED library of an object, inside a root.

This follows `elf/dl-load.c` (`_dl_map_object`, `open_path`, `open_verify`)
and `elf/dl-deps.c`:

* breadth-first over DT_NEEDED, deduplicated by name / SONAME / file identity
  (the interpreter counts as loaded);
* per name: a '/' means no search; else DT_RPATH of the loader chain (only when
  the loader has no DT_RUNPATH), then the executable's DT_RPATH,
  LD_LIBRARY_PATH, the loader's own DT_RUNPATH, ld.so.cache, the system dirs
  (the last two filtered by DF_1_NODEFLIB);
* every search dir is tried through its glibc-hwcaps (and, before glibc 2.37,
  legacy hwcap) subdirectories first; which ones, and what $PLATFORM is,
  depends on the CPU as glibc sees it (`loadercpu`);
* a candidate of the wrong class or machine is skipped, one with a bad header
  or too short makes the whole load fail (what `ldcheck` calls fatal shadowing).

All paths are root-relative strings, printed the way ld.so prints them
(search dir + subdir + name, not normalised); they are opened through
`rootfs.resolve_in_root` so symlinks never leave the root.  The result mirrors
`LD_TRACE_LOADED_OBJECTS=1 ld.so FILE` (what `ldd` prints): missing libraries
are "not found" entries, not errors.
"""

from __future__ import annotations

import os
import re
import stat
import struct
from typing import Callable, Iterable, Iterator

from pyxis_hook.loader import cpu as loadercpu
from pyxis_hook.loader.elf import ET_DYN, ET_EXEC, PHDR_SIZE, ElfInfo, read_elf
from pyxis_hook.loader.elfhead import EHDR_SIZE, parse_header
from pyxis_hook.errors import ElfError, InternalSignal, LdCacheError, PathError
from pyxis_hook.record import record
from pyxis_hook.rootfs import resolve_in_root

#: (name, elfclass, e_machine) -> root-relative paths; ld.so uses only the first (`_dl_load_cache_lookup`)
CacheLookup = Callable[[str, int, int], "tuple[str, ...]"]

EM_386, EM_X86_64, EM_AARCH64 = 3, 62, 183

#: the loader path compiled into glibc per (class, machine), used when the object has no PT_INTERP
DEFAULT_RTLD = {(64, EM_X86_64): "/lib64/ld-linux-x86-64.so.2", (32, EM_386): "/lib/ld-linux.so.2",
                (64, EM_AARCH64): "/lib/ld-linux-aarch64.so.1", (32, EM_X86_64): "/libx32/ld-linux-x32.so.2"}

#: which loader's ld.so.cache flags (`ldcache.LOADER_FLAGS` key: the one table of them) an object of
#: (class, machine) is looked up with; a class/machine not here finds nothing in the cache
CACHE_LOADER = {(64, EM_X86_64): "x86_64", (32, EM_386): "i386", (64, EM_AARCH64): "aarch64",
                (32, EM_X86_64): "x32"}

#: the kernel's AT_PLATFORM per machine (x86-64 reports "x86_64", i386 "i686"); glibc overrides it on
#: some x86 CPUs (`loadercpu`)
DEFAULT_PLATFORM = {EM_X86_64: "x86_64", EM_386: "i686", EM_AARCH64: "aarch64"}

#: LIBC_ABI_MAX for ELFOSABI_GNU objects (glibc abi-tags: DEFAULT, UNIQUE, IFUNC, ABSOLUTE)
_LIBC_ABI_MAX = 4


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


@record
class Dependency:
    """One object the loader maps, in load order (what one `ldd` line shows).

    `name` is the DT_NEEDED string that first asked for it, `path` the
    root-relative path opened (None: not found), `how` the rule that found it,
    `needed_by` the path of the object whose DT_NEEDED named it.  `error` is
    set on the last entry when the load fails there (the path is the culprit).
    """

    name: str
    path: str | None
    how: str
    needed_by: str
    error: str | None = None
    soname: str | None = None
    interpreter: bool = False


class LoadFailed(InternalSignal):
    """The loader would stop: a candidate file is unusable (glibc's 'error while loading shared libraries')."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason


# --------------------------------------------------------------------- DSTs

_DST_RE = re.compile(r"\$(?:\{(ORIGIN|PLATFORM|LIB)\}|(ORIGIN|PLATFORM|LIB)(?![A-Za-z0-9_]))")


def expand_dst(text: str, origin: str | None, lib: str | None, platform: str | None) -> str | None:
    """Expand $ORIGIN/$LIB/$PLATFORM (and ${...}) as `_dl_dst_substitute` does.

    `$ORIGINAL` and unknown `$FOO` stay literal; a known token without a value
    makes the whole element unusable, which the caller drops (None).
    """
    values = {"ORIGIN": origin, "LIB": lib, "PLATFORM": platform}
    missing = False

    def sub(m: re.Match) -> str:
        nonlocal missing
        value = values[m.group(1) or m.group(2)]
        if value is None:
            missing = True
            return ""
        return value

    out = _DST_RE.sub(sub, text)
    return None if missing else out


def split_search_path(value: str) -> tuple[str, ...]:
    """LD_LIBRARY_PATH / --library-path elements: glibc splits on both ':' and ';'."""
    return tuple(re.split(r"[:;]", value))


def fillin(elements: tuple[str, ...], origin: str | None, env: LoaderEnv) -> tuple[str, ...]:
    """`fillin_rpath`: expand DSTs, drop unexpandable ones, '' -> './', strip trailing '/', drop repeats."""
    out: list[str] = []
    for el in elements:
        d = expand_dst(el, origin, env.lib_token, env.platform) if "$" in el else el
        if d is None:
            continue
        if d == "":
            d = "."
        while len(d) > 1 and d.endswith("/"):
            d = d[:-1]
        if d not in out:
            out.append(d)
    return tuple(out)


def search_order(name: str, *, rpath: Iterable[tuple[tuple[str, ...], str]] = (),
                 ld_library_path: tuple[str, ...] = (), runpath: tuple[tuple[str, ...], str] | None = None,
                 cached: Callable[[], str | None] | None = None, system_dirs: tuple[str, ...] = (),
                 subdirs: tuple[str, ...] = ("",), nodeflib: bool = False) -> Iterator[tuple[str, str]]:
    """(path, how) in the order ld.so tries them for a name without '/' (glibc elf/dl-load.c `_dl_map_object`).

    The RPATH groups of the loading chain (given only when the loader has no
    RUNPATH), LD_LIBRARY_PATH, the loader's RUNPATH, the ld.so.cache's first
    hit (`cached`, asked only when reached; not one in a system dir under
    DF_1_NODEFLIB), then the system dirs (none under DF_1_NODEFLIB).  Every
    dir is tried with each of `subdirs` (glibc-hwcaps, legacy hwcap subdirs,
    "" for the dir itself).  The one model of the order: the resolver and
    ldcheck walk it, each with its own test of a candidate.
    """
    for dirs, how in rpath:
        yield from _in_dirs(name, dirs, subdirs, how)
    yield from _in_dirs(name, ld_library_path, subdirs, "LD_LIBRARY_PATH")
    if runpath is not None:
        yield from _in_dirs(name, runpath[0], subdirs, runpath[1])
    path = cached() if cached is not None else None
    if path is not None and not (nodeflib and any(path.startswith(d.rstrip("/") + "/") for d in system_dirs)):
        yield path, "ld.so.cache"
    if not nodeflib:
        yield from _in_dirs(name, system_dirs, subdirs, "default dir")


def _in_dirs(name: str, dirs: Iterable[str], subdirs: tuple[str, ...], how: str) -> Iterator[tuple[str, str]]:
    for d in dirs:
        base = d if d.endswith("/") else d + "/"
        for sub in subdirs:
            yield base + (sub + "/" if sub else "") + name, how


# --------------------------------------------------------------------- per-root defaults

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
    from pyxis_hook.loader import cachelookup, ldcache

    flags_by_arch = {arch: ldcache.LOADER_FLAGS[name] for arch, name in CACHE_LOADER.items()}

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


# --------------------------------------------------------------------- the search

@record(frozen=False)
class _Obj:
    names: list[str]
    path: str
    info: ElfInfo | None
    loader: "_Obj | None"
    file_id: tuple[int, int] | None
    how: str = ""
    faked: bool = False
    interpreter: bool = False
    placed: bool = True
    rpath_dirs: tuple[str, ...] | None = None
    runpath_dirs: tuple[str, ...] | None = None

    @property
    def origin(self) -> str:
        return os.path.dirname(self.path) or "/"

    def matches(self, name: str) -> bool:
        if self.faked:
            return False
        if name == self.path or name in self.names:
            return True
        if self.info is not None and self.info.soname == name:
            self.names.append(name)
            return True
        return False


@record(frozen=False)
class _Want:
    elfclass: int
    machine: int
    data: str


def verify_candidate(root: str, path: str, elfclass: int, machine: int, name: str = "",
                     data: str = "little") -> str:
    """Judge one candidate file the way glibc's `open_verify` does, inside `root`.

    Returns "ok", "missing" or "skip" (wrong class or machine: the search goes
    on); raises LoadFailed where the loader would fail the whole load (short
    file, bad header).  For tools that build their own candidate lists (ldcheck).
    """
    checker = _Resolver(LoaderEnv(root=root, cwd="/"))
    status, _, _ = checker.open_verify(path, _Want(elfclass, machine, data), name or os.path.basename(path))
    return status


class _Resolver:
    def __init__(self, env: LoaderEnv) -> None:
        self.env = env
        self.chain: list[_Obj] = []
        self.order: list[_Obj] = []  # load order, without the interpreter
        self.searchlist: list[_Obj] = []  # breadth-first, found objects only

    # -- files

    def host(self, path: str) -> str:
        if not path.startswith("/"):
            path = os.path.join(self.env.cwd, path)
        return resolve_in_root(self.env.root, path)

    def open_verify(self, path: str, want: _Want, name: str) -> tuple[str, ElfInfo | None, tuple[int, int] | None]:
        """('ok'|'missing'|'skip', info, file id) for one candidate; raise LoadFailed like `open_verify` does."""
        try:
            host = self.host(path)
            st = os.stat(host)
        except PathError:
            return "missing", None, None
        except OSError:
            return "missing", None, None
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return "skip", None, None  # a FIFO or device under a library's name: never opened here
        try:
            fd = os.open(host, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
        except OSError:
            return "skip", None, None  # EACCES and friends: glibc notes it and keeps searching
        try:
            try:
                raw = os.pread(fd, 64 + 56 * 16, 0)
            except OSError as e:
                raise LoadFailed(path, f"cannot read file data: Error {e.errno}") from None
        finally:
            os.close(fd)
        if len(raw) < EHDR_SIZE[64 if want.elfclass == 64 else 32]:
            raise LoadFailed(path, "file too short")
        try:
            h = parse_header(raw, path)
        except ElfError:
            raise LoadFailed(path, "invalid ELF header") from None
        if h.elfclass != want.elfclass:
            return "skip", None, None
        if h.data != want.data:
            raise LoadFailed(path, f"ELF file data encoding not {want.data}-endian")
        if h.ident_version != 1:
            raise LoadFailed(path, "ELF file version ident does not match current one")
        if h.osabi not in (0, 3):
            raise LoadFailed(path, "ELF file OS ABI invalid")
        if (h.osabi == 0 and h.abiversion != 0) or (h.osabi == 3 and h.abiversion >= _LIBC_ABI_MAX):
            raise LoadFailed(path, "ELF file ABI version invalid")
        if not h.pad_zero:
            raise LoadFailed(path, "nonzero padding in e_ident")
        if h.version != 1:
            raise LoadFailed(path, "ELF file version does not match current one")
        if h.machine != want.machine:
            return "skip", None, None
        if h.etype not in (ET_DYN, ET_EXEC):
            raise LoadFailed(path, "only ET_DYN and ET_EXEC can be loaded")
        if h.phentsize != PHDR_SIZE[h.elfclass]:
            raise LoadFailed(path, "ELF file's phentsize not the expected size")
        if stat.S_ISDIR(st.st_mode):
            raise LoadFailed(path, "cannot read file data: Error 21")
        try:
            info = read_elf(host)
        except ElfError as e:
            raise LoadFailed(path, f"cannot read file data ({e})") from None
        if info.abi_note is not None and info.abi_note[0] != 0:
            return "skip", None, None  # ABI tag for another OS: glibc skips it
        return "ok", info, (st.st_dev, st.st_ino)

    def subdirs(self) -> tuple[str, ...]:
        return tuple(f"glibc-hwcaps/{h}" for h in self.env.hwcaps) + self.env.legacy_subdirs + ("",)

    # -- one DT_NEEDED name

    def search(self, name: str, loader: _Obj, want: _Want):
        env = self.env
        main = self.chain[0]
        if "/" in name:
            status, info, fid = self.open_verify(name, want, name)
            return (name, info, fid, "path in DT_NEEDED") if status == "ok" else None
        loader_info = loader.info
        runpath = None
        if loader_info is not None and loader_info.runpath is not None:
            if loader.runpath_dirs is None:
                loader.runpath_dirs = fillin(loader_info.runpath, loader.origin, env)
            runpath = (loader.runpath_dirs, f"RUNPATH of {loader.path}")
        llp = fillin(split_search_path(env.ld_library_path), main.origin, env) if env.ld_library_path else ()
        lookup = env.cache

        def cached() -> str | None:
            return next(iter(lookup(name, want.elfclass, want.machine)), None) if lookup is not None else None

        for path, how in search_order(name, rpath=self.rpath_groups(loader) if runpath is None else (),
                                      ld_library_path=llp, runpath=runpath, cached=cached,
                                      system_dirs=env.system_dirs, subdirs=self.subdirs(),
                                      nodeflib=loader_info is not None and loader_info.nodeflib):
            status, info, fid = self.open_verify(path, want, name)
            if status == "ok":
                return path, info, fid, how
        return None

    def rpath_groups(self, loader: _Obj) -> Iterator[tuple[tuple[str, ...], str]]:
        """The RPATHs ld.so searches for `loader`'s needs: up its loading chain, then the main object's."""
        main = self.chain[0]
        did_main = False
        l: _Obj | None = loader
        while l is not None:
            dirs = self.rpath_of(l)
            if dirs is not None:
                yield dirs, f"RPATH of {l.path}"
                did_main |= l is main
            l = l.loader
        if not did_main:
            dirs = self.rpath_of(main)
            if dirs is not None:
                yield dirs, f"RPATH of {main.path}"

    def rpath_of(self, obj: _Obj) -> tuple[str, ...] | None:
        info = obj.info
        if info is None or info.rpath is None or info.runpath is not None:
            return None
        if obj.rpath_dirs is None:
            obj.rpath_dirs = fillin(info.rpath, obj.origin, self.env)
        return obj.rpath_dirs

    def map_name(self, name: str, loader: _Obj, want: _Want) -> _Obj | None:
        if "$" in name:
            expanded = expand_dst(name, loader.origin, self.env.lib_token, self.env.platform)
            if expanded is None:
                raise LoadFailed(name, "empty dynamic string token substitution")
            name = expanded
        for o in self.chain:
            if o.matches(name):
                self.place(o)
                return None
        hit = self.search(name, loader, want)
        if hit is None:
            obj = _Obj([name], "", None, loader, None, how="not found", faked=True)
            self.order.append(obj)
            return None
        path, info, fid, how = hit
        for o in self.chain:
            if not o.faked and fid is not None and o.file_id == fid:
                o.names.append(name)
                self.place(o)
                return None
        obj = _Obj([name], path, info, loader, fid, how=how)
        self.chain.append(obj)
        self.order.append(obj)
        self.searchlist.append(obj)
        return obj

    def place(self, o: _Obj) -> None:
        """The interpreter joins the search list when first named (it is in the chain from the start)."""
        if not o.placed:
            o.placed = True
            self.searchlist.append(o)

    def load_order(self) -> list[_Obj]:
        """The link-map chain ld.so prints: load order, with the interpreter put back right after its
        predecessor in the search list (rtld.c); not-found ("faked") objects are in the chain only."""
        order = list(self.order)
        for i, o in enumerate(self.searchlist):
            if o.interpreter:
                pred = self.searchlist[i - 1]
                at = 0 if pred is self.chain[0] else order.index(pred) + 1
                order.insert(at, o)
        return order

    # -- the whole tree

    def run(self, path: str) -> tuple[Dependency, ...]:
        env = self.env
        host = self.host(path)
        try:
            st = os.stat(host)
        except OSError as e:
            raise LoadFailed(path, f"cannot open shared object file: {e.strerror}") from None
        info = read_elf(host)
        main = _Obj([path], path, info, None, (st.st_dev, st.st_ino), how="main")
        self.chain.append(main)
        self.searchlist.append(main)
        want = _Want(info.elfclass, info.machine, info.byteorder)
        rtld_path = env.rtld or info.interp or DEFAULT_RTLD.get((info.elfclass, info.machine))
        if rtld_path:
            rtld_name = info.interp or rtld_path
            rinfo = None
            rfid = None
            try:
                rhost = self.host(rtld_path)
                rinfo = read_elf(rhost)
                rst = os.stat(rhost)
                rfid = (rst.st_dev, rst.st_ino)
            except (ElfError, OSError, PathError):
                pass
            rtld = _Obj([rtld_name], rtld_path, rinfo, None, rfid, how="interpreter", interpreter=True, placed=False)
            if rinfo is None or rinfo.soname is None:
                rtld.names.append(os.path.basename(rtld_path))
            self.chain.append(rtld)
        queue = [main]
        failed: LoadFailed | None = None
        i = 0
        try:
            while i < len(queue):
                obj = queue[i]
                i += 1
                for name in obj.info.needed if obj.info else ():
                    new = self.map_name(name, obj, want)
                    if new is not None:
                        queue.append(new)
        except LoadFailed as e:
            failed = e
        deps = [Dependency(name=o.names[0], path=None if o.faked else o.path, how=o.how,
                           needed_by=o.loader.path if o.loader else "",
                           soname=o.info.soname if o.info else None, interpreter=o.interpreter)
                for o in self.load_order()]
        if failed is not None:
            deps.append(Dependency(name=failed.name, path=failed.name, how="load fails",
                                   needed_by="", error=failed.reason))
        return tuple(deps)


def resolve_tree(env: LoaderEnv, path: str) -> tuple[Dependency, ...]:
    """All objects ld.so maps for the root-relative `path`, in load order (main object excluded).

    Raises ElfError when `path` itself is unusable (missing, not ELF).  A
    failure while loading a dependency ends the list with an entry whose
    `error` says why (the loader stops there).
    """
    return _Resolver(env).run(path)


def format_ldd(deps: tuple[Dependency, ...], *, main_is_dynamic: bool = True) -> str:
    """`ldd`-style lines (addresses omitted): '\\tNAME => PATH', '\\tPATH', '\\tNAME => not found'."""
    if not main_is_dynamic or not deps:
        return "\tstatically linked\n"
    lines = []
    for d in deps:
        if d.error is not None:
            continue
        if d.path is None:
            lines.append(f"\t{d.name} => not found")
        elif d.name == d.path:
            lines.append(f"\t{d.name}")
        else:
            lines.append(f"\t{d.name} => {d.path}")
    return "".join(line + "\n" for line in lines)
