"""The CUDA forward-compat driver an image carries: /usr/local/cuda/compat as glibc's ldconfig would index it.

Why a module of its own: only an image with that directory needs it (a
CUDA base image), and a start for any other image should not load its
ELF reader.  The files are read through `rootfs.RootFS` fds (a link in the
image never leads out of it) with a small ELF reader of its own:
pyelftools is not on the hook's path.  `plan.container.container_facts`
asks `compat_facts`; `diag.cudacheck` reads a library's note with
`read_elf_facts`.
"""

from __future__ import annotations

import errno
import posix
import stat
import struct
import sys

from pyxis_hook import pathnames
from pyxis_hook.errors import ElfError, PathError
from pyxis_hook.loader import machines
from pyxis_hook.plan.build import COMPAT_DIR

#: bounds on what is read from an image's file (a compat dir holds ~10 libraries)
MAX_ENTRIES = 256
MAX_HEADERS = 4096
NOTE_SECTION = b".note.cuda.fwd_compatibility"
NOTE_OWNER = b"NVIDIA Corporation"
NOTE_LIMIT = 1 << 16


class ElfFactsError(ElfError):
    """`read_elf_facts` cannot make sense of a file, or it is ELF the cache model does not cover.

    Not an ELF file, big-endian, another machine, or headers that point
    outside the file: the image chooses these bytes, so this is the reader's
    only exception.  The message says what is wrong but not which file (the
    reader only has an fd): callers add the name.  `compat_facts` turns it
    into a `compat_problem` (the plan then runs ldconfig, which indexes the
    dir itself); ldcheck treats the library as one without a note.
    """


def compat_facts(rootfs: str, machine: str | None = None):
    """(compat libcuda file name, note driver majors or None, indexed libs, problem) for `rootfs`.

    The libcuda is NVIDIA's: exactly one regular `libcuda.so.<x>.<y>...`
    in COMPAT_DIR (none, or several: "" and nothing is used).  The indexed
    libs are what ldconfig's search_dir keeps: `lib*`/`ld-*` names with
    `.so` that open (inside the root) as regular ELF shared objects, one
    row per SONAME (no DT_SONAME: the file name; a `libfoo.so` link to a
    `libfoo.so.N`: its own name, as search_dir keys ld(1)'s links), named
    by the greatest file name in ldconfig's order.  `problem` is set for anything the merge
    cannot model (a subdirectory, a non-ELF, a big-endian or foreign-machine
    file): the plan then runs ldconfig instead.  Never raises on what the
    image holds: an unreadable dir is a problem string.
    """
    from pyxis_hook.rootfs import HIDDEN, RootFS

    try:
        with RootFS(rootfs, hidden=HIDDEN) as rfs:  # /proc and /sys missing, as for the other facts
            return _compat_facts(rfs, machine or posix.uname().machine)
    except (PathError, OSError) as e:
        return "", None, (), f"cannot be read ({getattr(e, 'strerror', None) or e})"


def _compat_facts(rfs, machine: str):
    from pyxis_hook.loader.ldcache import libcmp
    from pyxis_hook.loader.ldcache import written_flags
    from pyxis_hook.loader.ldmerge import indexed_by_ldconfig

    dfd = rfs.open(COMPAT_DIR, posix.O_RDONLY | posix.O_DIRECTORY)
    try:
        names = []
        with posix.scandir(dfd) as it:  # stops at the bound: a million entries are never all read
            for entry in it:
                names.append(entry.name)
                if len(names) > MAX_ENTRIES:
                    return "", None, (), f"more than {MAX_ENTRIES} entries"
        names.sort()
        modes = {n: posix.lstat(n, dir_fd=dfd).st_mode for n in names}
    finally:
        posix.close(dfd)
    links = {n for n, m in modes.items() if stat.S_ISLNK(m)}
    subdirs = [n for n, m in modes.items() if stat.S_ISDIR(m)]
    # NVIDIA's hook globs libcuda.so.*.* and keeps regular files only (a link is neither counted nor used)
    libcuda = [n for n in names if n.startswith("libcuda.so.") and n.count(".") >= 3 and stat.S_ISREG(modes[n])]
    # ldconfig scans glibc-hwcaps (and, before 2.37, legacy hwcap) subdirectories: not modelled
    problem = f"has a subdirectory {subdirs[0]}" if subdirs else ""
    found: dict[str, tuple[str, int]] = {}  # soname -> (file name, flags)
    chosen = ""
    drivers = None
    for name in names:
        want_note = name in libcuda
        if not (want_note or indexed_by_ldconfig(name)):
            continue
        try:
            fd = rfs.open_regular(f"{COMPAT_DIR}/{name}")  # a device node is never opened for reading
        except PathError as e:
            if getattr(e, "errno", 0) == errno.EISDIR:  # a link to a directory
                problem = problem or f"has a subdirectory {name}"
            continue  # dangling, a loop, a FIFO or a device: ldconfig skips it too
        try:
            st = posix.fstat(fd)
            try:
                cls, soname, needed, note = read_elf_facts(fd, st.st_size, machine, want_note)
            except ElfFactsError as e:
                problem = problem or f"{name}: {e}"
                continue
        finally:
            posix.close(fd)
        if want_note and len(libcuda) == 1 and _is_versioned(name) and cls == 64:
            chosen, drivers = name, note  # the native (64-bit) library: 64-bit programs are what it serves
        if cls == 0 or not indexed_by_ldconfig(name):
            continue  # an executable: ldconfig does not index it
        soname = soname or name
        if name in links and name != soname and name.endswith(".so") and soname.startswith(name):
            soname = name  # search_dir: the `libfoo.so` link for ld(1) gets its own entry
        flags = written_flags(cls, needed, machine)
        old = found.get(soname)
        if old is not None and old[1] != flags:
            problem = problem or f"{soname} with two ELF classes"
        if old is None or libcmp(old[0], name) < 0:
            found[soname] = (name, flags)
    libs = tuple((n, so, fl) for so, (n, fl) in sorted(found.items()))
    return chosen, drivers, libs, problem


def _is_versioned(name: str) -> bool:
    """`libcuda.so.570.86.15`: bounded ASCII digit runs (str.isdigit also takes '²', which int() refuses)."""
    from pyxis_hook.spec.require import is_dotted_number

    return is_dotted_number(name[len("libcuda.so."):])


_ET_DYN = 3


def read_elf_facts(fd: int, size: int, machine: str, want_note: bool = False):
    """(class or 0 for a non-library, DT_SONAME or "", DT_NEEDED, note drivers or None) of an open ELF.

    Bounded reads; raises ElfFactsError for what ldconfig would treat in
    ways the merge does not model (not ELF, another machine, the other byte
    order than this machine's) and for any file it cannot make sense of
    (the image chooses the bytes).
    """
    try:
        return _read_elf_facts(fd, size, machine, want_note)
    except (struct.error, ValueError, OverflowError, OSError, IndexError) as e:
        raise ElfFactsError(f"unreadable ELF file ({e})") from None


def _read_elf_facts(fd: int, size: int, machine: str, want_note: bool):
    from pyxis_hook.loader import elfhead  # only for an image's own ELF files (CUDA compat): off the common path

    try:
        h = elfhead.parse_header(posix.pread(fd, 64, 0), "")
    except ElfError as e:  # "<path>: what is wrong"; the reader has no path, callers add the name
        raise ElfFactsError(str(e).partition(": ")[2]) from None
    if h.elfclass == 0 or h.data == "invalid":
        raise ElfFactsError("not an ELF file")
    if h.data != sys.byteorder:  # ldconfig reads e_machine in its own byte order: the merge does not model it
        raise ElfFactsError(f"a {h.data}-endian ELF file on a {sys.byteorder}-endian machine")
    cls, end, emach, etype = h.elfclass, h.endian, h.machine, h.etype
    phoff, phentsize, phnum = h.phoff, h.phentsize, h.phnum
    row = machines.machine(machine)  # the machines whose ldconfig flags the merge models (`merge32`)
    m64, m32 = (row.em, row.em32 if row.merge32 else None) if row is not None else (None, None)
    if emach != (m64 if cls == 64 else m32):
        raise ElfFactsError(f"ELF machine {emach} ({cls}-bit)")
    if etype != _ET_DYN:
        return 0, "", (), None
    ph = struct.Struct(end + ("IIQQQQQQ" if cls == 64 else "IIIIIIII"))
    dyn = struct.Struct(end + ("qQ" if cls == 64 else "iI"))
    loads, dynamic = [], None
    if phnum > MAX_HEADERS or (phnum and phentsize != ph.size):
        raise ElfFactsError("bad program headers")
    raw = posix.pread(fd, phnum * phentsize, phoff)
    for i in range(phnum):
        if (i + 1) * phentsize > len(raw):
            raise ElfFactsError("truncated program headers")
        f = ph.unpack_from(raw, i * phentsize)
        # (type, offset, vaddr, filesz) in both layouts
        p_type, off, vaddr, filesz = (f[0], f[2], f[3], f[5]) if cls == 64 else (f[0], f[1], f[2], f[4])
        if p_type == 1:
            loads.append((vaddr, off, filesz))
        elif p_type == 2:
            dynamic = (off, min(filesz, MAX_HEADERS * dyn.size))
    soname_off, needed_offs, strtab = None, [], None
    if dynamic is not None:
        data = posix.pread(fd, dynamic[1], dynamic[0])
        for i in range(len(data) // dyn.size):
            tag, val = dyn.unpack_from(data, i * dyn.size)
            if tag == 0:
                break
            if tag == 1:
                needed_offs.append(val)
            elif tag == 5:
                strtab = next((off + val - va for va, off, sz in loads if va <= val < va + sz), None)
            elif tag == 14:
                soname_off = val
    if (soname_off is not None or needed_offs) and strtab is None:
        raise ElfFactsError("dynamic string table not in a loaded segment")

    def string(rel: int) -> str:
        s = posix.pread(fd, 4096, strtab + rel)
        end = s.find(b"\0")
        if end < 0:
            raise ElfFactsError("unterminated dynamic string")
        return pathnames.fsdecode(s[:end])

    soname = string(soname_off) if soname_off is not None else ""
    needed = tuple(string(o) for o in needed_offs[:64])
    note = _note_drivers(fd, size, h) if want_note else None
    return cls, soname, needed, note


def _note_drivers(fd, size, h) -> tuple[int, ...] | None:
    """The "Driver" majors of the `.note.cuda.fwd_compatibility` section; None without one (or unreadable)."""
    shoff, shentsize, shnum, shstrndx = h.shoff, h.shentsize, h.shnum, h.shstrndx
    sh = struct.Struct(h.endian + ("IIQQQQIIQQ" if h.elfclass == 64 else "IIIIIIIIII"))
    if not shoff or shnum > MAX_HEADERS or shentsize != sh.size or shstrndx >= shnum:
        return None
    raw = posix.pread(fd, shnum * shentsize, shoff)
    if len(raw) < shnum * shentsize:
        return None
    secs = [sh.unpack_from(raw, i * shentsize) for i in range(shnum)]
    # (name, offset, size, alignment) in both layouts
    secs = [(s[0], s[4], s[5], s[8]) for s in secs]
    _n, str_off, str_size, _a = secs[shstrndx]
    names = posix.pread(fd, min(str_size, NOTE_LIMIT), str_off)
    for name_off, off, sz, align in secs:
        if names[name_off:name_off + len(NOTE_SECTION) + 1] != NOTE_SECTION + b"\0":
            continue
        if sz > NOTE_LIMIT or off + sz > size:
            return None
        return _parse_note(posix.pread(fd, sz, off), align if align in (4, 8) else 4, h.endian)
    return None


def _parse_note(data: bytes, align: int = 4, endian: str = "<") -> tuple[int, ...] | None:
    """NVIDIA's note: owner "NVIDIA Corporation", a JSON description with "Driver" majors.

    Read as NVIDIA's hook reads it (cudacompat/cuda-elf-header.go): name
    and description padded to the section's alignment (4 or 8; anything
    else as the ELF spec's 4), NULs trimmed from both ends.  No NVIDIA note,
    or one whose description is not JSON, gives None: NVIDIA's hook then
    warns and falls back to the major-version rule (when it knows the host
    driver version, as this hook does).
    """
    from pyxis_hook import fastjson

    from pyxis_hook.loader import elfhead  # only for an image's own ELF files (CUDA compat): off the common path
    for raw_name, _type, desc in elfhead.iter_notes(data, endian, align):
        name = raw_name.strip(b"\0")
        if name != NOTE_OWNER:
            continue
        try:
            value = fastjson.loads(desc.strip(b"\0")).get("Driver")
        except (ValueError, AttributeError, RecursionError):
            return None
        if not isinstance(value, list):
            value = [value]
        majors = []
        for v in value:
            text = str(v).split(".")[0]
            if text.isascii() and text.isdigit():
                majors.append(int(text))
        return tuple(majors)
    return None
