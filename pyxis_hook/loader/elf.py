"""ELF facts the loader cares about: class, machine, SONAME, DT_NEEDED, RPATH/RUNPATH, PT_INTERP.

Two readers with different costs:

* `read_header` / `elf_ident` / `elf_header` read only the first 64 bytes with
  `os.pread`, decoded by `loader/elfhead.py` (stdlib only, both byte
  orders).  They are what the resolver uses to decide, as glibc's
  `open_verify` does, whether a candidate file is skipped (wrong class or
  machine) or makes the load fail (bad magic, short file, ...).
* `read_elf` uses pyelftools, a large import
  (docs/decisions/2026-12-07-start-costs.md), so this module is never
  imported on the hook's per-container path.  It reads the dynamic
  section through PT_DYNAMIC and maps DT_STRTAB through PT_LOAD, never through
  section headers, because stripped libraries may have none.

Whatever bytes a file holds, the only exception that leaves this module is
`ElfError`, whose message names the file and what is wrong with it.
"""

from __future__ import annotations

import os
import struct

from pyxis_hook.errors import ElfError
from pyxis_hook.loader.elfhead import ElfHeader, iter_notes, parse_header
from pyxis_hook.record import record

PHDR_SIZE = {32: 32, 64: 56}

ET_EXEC = 2
ET_DYN = 3

PT_LOAD = 1
PT_DYNAMIC = 2
PT_INTERP = 3
PT_NOTE = 4

DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_STRSZ = 10
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29
DT_FLAGS_1 = 0x6FFFFFFB

DF_1_NODEFLIB = 0x800

NT_GNU_ABI_TAG = 1

#: e_machine values we name ourselves (pyelftools names the rest)
MACHINE_NAMES = {3: "EM_386", 62: "EM_X86_64", 183: "EM_AARCH64", 40: "EM_ARM", 21: "EM_PPC64", 22: "EM_S390"}

#: a dynamic section larger than this is certainly garbage (real ones hold < 100 entries)
_MAX_DYN_ENTRIES = 1 << 16


@record
class ElfInfo:
    """What the loader needs to know about one ELF object.

    `rpath`/`runpath` are the raw ':'-separated elements (DSTs unexpanded,
    empty elements kept) or None when the tag is absent.  glibc ignores
    DT_RPATH when DT_RUNPATH is present; we report both as written and let the
    resolver apply that rule.
    """

    path: str
    elfclass: int
    byteorder: str
    machine: int
    machine_name: str
    osabi: int
    abiversion: int
    etype: int
    soname: str | None
    needed: tuple[str, ...]
    rpath: tuple[str, ...] | None
    runpath: tuple[str, ...] | None
    flags_1: int
    interp: str | None
    abi_note: tuple[int, int, int, int] | None
    dynamic: bool

    @property
    def nodeflib(self) -> bool:
        """DF_1_NODEFLIB: this object's dependencies skip the cache's system-dir hits and the system dirs."""
        return bool(self.flags_1 & DF_1_NODEFLIB)


def _pread(fd: int, size: int, offset: int) -> bytes:
    return os.pread(fd, size, offset)


def read_header(path: str) -> ElfHeader:
    """Read and decode the ELF header of `path` (one pread of 64 bytes)."""
    from pyxis_hook.rootfs import open_regular_path

    try:
        fd = open_regular_path(path)  # a FIFO or device named like a library: refused, never opened
    except OSError as e:
        raise ElfError(f"{path}: cannot open: {e.strerror}") from None
    try:
        raw = _pread(fd, 64, 0)
    except OSError as e:
        raise ElfError(f"{path}: cannot read: {e.strerror}") from None
    finally:
        os.close(fd)
    return parse_header(raw, path)


def elf_ident(path: str) -> tuple[int, int, str]:
    """(elfclass, e_machine, byte order) from the header only: cheap, for skipping wrong-class candidates."""
    h = read_header(path)
    return h.elfclass, h.machine, h.data


def elf_header(path: str) -> tuple[int, int]:
    """(elfclass, e_machine) — the name docs/design.md lists."""
    h = read_header(path)
    return h.elfclass, h.machine


def read_elf(path: str) -> ElfInfo:
    """Read the loader-relevant facts of `path` with pyelftools; raise ElfError naming the file and why."""
    header = read_header(path)
    if header.elfclass == 0:
        raise ElfError(f"{path}: not an ELF file (bad EI_CLASS value)")
    if header.data == "invalid":
        raise ElfError(f"{path}: not an ELF file (bad EI_DATA value)")
    try:
        with open(path, "rb") as f:
            return _read_with_pyelftools(f, path, header)
    except ElfError:
        raise
    except OSError as e:
        raise ElfError(f"{path}: cannot read: {e.strerror}") from None
    except Exception as e:  # pyelftools/construct raise many types on hostile input
        from elftools.common.exceptions import ELFError, ELFParseError
        from elftools.construct.core import ConstructError

        if isinstance(e, (ELFError, ELFParseError, ConstructError, struct.error, ValueError, IndexError,
                          KeyError, OverflowError, UnicodeDecodeError, EOFError, AssertionError)):
            raise ElfError(f"{path}: malformed ELF ({type(e).__name__}: {e})") from None
        raise


def _read_with_pyelftools(f, path: str, header: ElfHeader) -> ElfInfo:
    from elftools.common.utils import struct_parse
    from elftools.elf.elffile import ELFFile

    size = os.fstat(f.fileno()).st_size
    elf = ELFFile(f)
    structs = elf.structs
    phsize = PHDR_SIZE[header.elfclass]
    if header.phnum and header.phentsize != phsize:
        raise ElfError(f"{path}: bad program header size {header.phentsize}")
    if header.phoff + header.phnum * phsize > size:
        raise ElfError(f"{path}: truncated at the program headers (offset {header.phoff}, file size {size})")
    phdrs = [struct_parse(structs.Elf_Phdr, f, header.phoff + i * phsize) for i in range(header.phnum)]

    def ptype(p) -> int:
        t = p["p_type"]
        return t if isinstance(t, int) else _PT_BY_NAME.get(t, -1)

    loads = [p for p in phdrs if ptype(p) == PT_LOAD]

    def read_at(offset: int, length: int, what: str) -> bytes:
        if offset < 0 or length < 0 or offset + length > size:
            raise ElfError(f"{path}: truncated at {what} (offset {offset}+{length}, file size {size})")
        f.seek(offset)
        return f.read(length)

    interp = None
    abi_note = None
    dyn_phdr = None
    for p in phdrs:
        t = ptype(p)
        if t == PT_INTERP:
            raw = read_at(p["p_offset"], p["p_filesz"], "PT_INTERP")
            interp = os.fsdecode(raw.split(b"\0", 1)[0])
        elif t == PT_NOTE and abi_note is None:
            abi_note = _abi_note(read_at(p["p_offset"], p["p_filesz"], "PT_NOTE"), header.data, p["p_align"])
        elif t == PT_DYNAMIC and dyn_phdr is None:
            dyn_phdr = p

    soname = None
    needed: list[str] = []
    rpath = runpath = None
    flags_1 = 0
    if dyn_phdr is not None:
        entsize = structs.Elf_Dyn.sizeof()
        count = dyn_phdr["p_filesz"] // entsize
        if count > _MAX_DYN_ENTRIES:
            raise ElfError(f"{path}: bad dynamic section ({count} entries)")
        raw = read_at(dyn_phdr["p_offset"], count * entsize, "the dynamic section")
        tags: list[tuple[int, int]] = []
        fmt = ("<" if header.data == "little" else ">") + ("qQ" if header.elfclass == 64 else "iI")
        for tag, val in struct.iter_unpack(fmt, raw):
            if tag == DT_NULL:
                break
            tags.append((tag, val))
        strtab_addr = next((v for t, v in tags if t == DT_STRTAB), None)
        strsz = next((v for t, v in tags if t == DT_STRSZ), None)
        string_tags = [t for t, _ in tags if t in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)]
        strtab = b""
        if string_tags:
            if strtab_addr is None or strsz is None:
                raise ElfError(f"{path}: bad dynamic section (string tags without DT_STRTAB/DT_STRSZ)")
            off = _vaddr_to_offset(loads, strtab_addr)
            if off is None:
                raise ElfError(f"{path}: bad dynamic section (DT_STRTAB {strtab_addr:#x} not in any PT_LOAD)")
            strtab = read_at(off, strsz, "the dynamic string table")

        def string(val: int) -> str:
            if val >= len(strtab):
                raise ElfError(f"{path}: bad dynamic section (string offset {val} past DT_STRSZ {len(strtab)})")
            end = strtab.find(b"\0", val)
            if end < 0:
                raise ElfError(f"{path}: bad dynamic section (unterminated string at {val})")
            return os.fsdecode(strtab[val:end])

        for tag, val in tags:
            if tag == DT_NEEDED:
                needed.append(string(val))
            elif tag == DT_SONAME:
                soname = string(val)
            elif tag == DT_RPATH:
                rpath = tuple(string(val).split(":"))
            elif tag == DT_RUNPATH:
                runpath = tuple(string(val).split(":"))
            elif tag == DT_FLAGS_1:
                flags_1 = val
    return ElfInfo(
        path=path,
        elfclass=header.elfclass,
        byteorder=header.data,
        machine=header.machine,
        machine_name=_machine_name(elf, header.machine),
        osabi=header.osabi,
        abiversion=header.abiversion,
        etype=header.etype,
        soname=soname,
        needed=tuple(needed),
        rpath=rpath,
        runpath=runpath,
        flags_1=flags_1,
        interp=interp,
        abi_note=abi_note,
        dynamic=dyn_phdr is not None,
    )


_PT_BY_NAME = {"PT_LOAD": PT_LOAD, "PT_DYNAMIC": PT_DYNAMIC, "PT_INTERP": PT_INTERP, "PT_NOTE": PT_NOTE}


def _machine_name(elf, machine: int) -> str:
    name = elf["e_machine"]
    if isinstance(name, str):
        return name
    return MACHINE_NAMES.get(machine, f"EM_{machine}")


def _vaddr_to_offset(loads, addr: int) -> int | None:
    """Map a virtual address to a file offset through the PT_LOAD segments (as the mapped image would)."""
    for p in loads:
        if p["p_vaddr"] <= addr < p["p_vaddr"] + p["p_filesz"]:
            return addr - p["p_vaddr"] + p["p_offset"]
    return None


def _abi_note(raw: bytes, data: str, align: int) -> tuple[int, int, int, int] | None:
    """The GNU ABI tag (NT_GNU_ABI_TAG, name "GNU"): (os, major, minor, patch), or None."""
    end = "<" if data == "little" else ">"
    for name, ntype, desc in iter_notes(raw, end, align):
        if ntype == NT_GNU_ABI_TAG and name == b"GNU\0" and len(desc) >= 16:
            return struct.unpack_from(end + "IIII", desc)
    return None
