"""The ELF header and ELF notes, read with `struct` only: the one reader of both, in either byte order.

The hook's path reads ELF in two places: the resolver's `open_verify`
model (`loader/resolve.py`, through `loader/elf.py`) and the image's
forward-compat dir (`plan/compat.py`).  Both need the same 64 bytes
decoded the same way, and `loader/elf.py` (pyelftools, a large import:
docs/decisions/2026-12-07-start-costs.md) must stay off the per-container
path, so the header and the note walk live here, stdlib-only.  Byte order
is the file's (`EI_DATA`): judging whether that order suits the machine is
the caller's business, as glibc's `open_verify` and ldconfig judge it
themselves.
"""

from __future__ import annotations

import struct

from pyxis_hook.errors import ElfError
from pyxis_hook.record import record

ELFMAG = b"\x7fELF"
#: e_ehsize of each class: the bytes a header needs
EHDR_SIZE = {32: 52, 64: 64}

#: e_type .. e_shstrndx after e_ident, per class (the byte-order character is prepended)
_EHDR = {64: "HHIQQQIHHHHHH", 32: "HHIIIIIHHHHHH"}


@record
class ElfHeader:
    """The ELF header's fields, raw (not judged): what glibc's `open_verify` and ldconfig look at.

    `elfclass` is 0 and `data` "invalid" for an EI_CLASS/EI_DATA that is
    neither; the fields after e_ident are then 0 (their layout is unknown).
    `endian` is the `struct` byte-order character ("<" or ">").
    """

    path: str
    elfclass: int  # 32 or 64; 0 when EI_CLASS is neither
    data: str  # "little", "big" or "invalid"
    ident_version: int
    osabi: int
    abiversion: int
    pad_zero: bool
    etype: int
    machine: int
    version: int
    phoff: int
    phentsize: int
    phnum: int
    shoff: int = 0
    shentsize: int = 0
    shnum: int = 0
    shstrndx: int = 0

    @property
    def endian(self) -> str:
        return ">" if self.data == "big" else "<"


def parse_header(raw: bytes, path: str) -> ElfHeader:
    """Decode an ELF header from the first bytes of a file.

    Raises ElfError for a missing magic number or fewer bytes than the header
    of its class needs ("file too short", glibc's wording).
    """
    if len(raw) < 16:  # glibc checks the length before the magic: a 7-byte file is "too short"
        raise ElfError(f"{path}: file too short ({len(raw)} bytes)")
    if raw[:4] != ELFMAG:
        raise ElfError(f"{path}: not an ELF file (invalid ELF header)")
    cls = {1: 32, 2: 64}.get(raw[4], 0)
    data = {1: "little", 2: "big"}.get(raw[5], "invalid")
    need = EHDR_SIZE.get(cls, 64)
    if len(raw) < need:
        raise ElfError(f"{path}: file too short ({len(raw)} bytes, the ELF header needs {need})")
    if cls == 0 or data == "invalid":
        return ElfHeader(path, cls, data, raw[6], raw[7], raw[8], not any(raw[9:16]), 0, 0, 0, 0, 0, 0)
    (etype, machine, version, _entry, phoff, shoff, _flags, _ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = struct.unpack_from(("<" if data == "little" else ">") + _EHDR[cls], raw, 16)
    return ElfHeader(path, cls, data, raw[6], raw[7], raw[8], not any(raw[9:16]), etype, machine, version,
                     phoff, phentsize, phnum, shoff, shentsize, shnum, shstrndx)


def iter_notes(raw: bytes, endian: str = "<", align: int = 4):
    """(name, type, description) of each note in a PT_NOTE segment's or SHT_NOTE section's bytes.

    The ELF spec's layout (namesz, descsz, type, then name and description
    each padded to `align`: 4, or 8 for a segment or section aligned so;
    anything else is read as 4).  `name` is as written, NULs included (callers
    compare as their own reader does); the walk stops at a note whose name
    or description would run past the end.
    """
    step = 8 if align == 8 else 4
    pos = 0
    while pos + 12 <= len(raw):
        namesz, descsz, ntype = struct.unpack_from(endian + "III", raw, pos)
        name_off = pos + 12
        desc_off = name_off + -(-namesz // step) * step
        if name_off + namesz > len(raw) or desc_off + descsz > len(raw):
            return
        yield raw[name_off:name_off + namesz], ntype, raw[desc_off:desc_off + descsz]
        pos = desc_off + -(-descsz // step) * step
