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

The order and its strings (DSTs, RPATH/RUNPATH elements) are `searchpath`,
what the root's loader brings to them (`LoaderEnv`) is `loaderenv`; this
module opens the candidates and walks the tree.

All paths are root-relative strings, printed the way ld.so prints them
(search dir + subdir + name, not normalised); they are opened through
`rootfs.resolve_in_root` so symlinks never leave the root.  The result mirrors
`LD_TRACE_LOADED_OBJECTS=1 ld.so FILE` (what `ldd` prints): missing libraries
are "not found" entries, not errors.
"""

from __future__ import annotations

import os
import stat
from typing import Iterator

from pyxis_hook.loader.elf import ET_DYN, ET_EXEC, PHDR_SIZE, ElfInfo, read_elf
from pyxis_hook.loader.elfhead import EHDR_SIZE, parse_header
from pyxis_hook.loader.loaderenv import DEFAULT_RTLD, LoaderEnv
from pyxis_hook.loader.searchpath import expand_dst, fillin, search_order, split_search_path
from pyxis_hook.errors import ElfError, InternalSignal, PathError
from pyxis_hook.record import record
from pyxis_hook.rootfs import resolve_in_root

#: LIBC_ABI_MAX for ELFOSABI_GNU objects (glibc abi-tags: DEFAULT, UNIQUE, IFUNC, ABSOLUTE)
_LIBC_ABI_MAX = 4


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
