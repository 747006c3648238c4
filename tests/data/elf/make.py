"""Writes the tiny ELF files beside this script: `python3 tests/data/elf/make.py` (committed; rerun to change them).

Each valid file is a shared object of a few hundred bytes in one byte order
and class: one PT_LOAD over the whole file, PT_DYNAMIC with DT_SONAME, a
PT_NOTE with the GNU ABI tag, and section headers naming NVIDIA's
`.note.cuda.fwd_compatibility` (owner "NVIDIA Corporation", a JSON
description with "Driver" majors).  The broken ones are what an image may
hold instead: a truncated header, a bad magic number, a bad EI_CLASS.
"""

from __future__ import annotations

import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent

SONAME = b"libtiny.so.1"
ABI_TAG = (0, 3, 2, 0)  # GNU/Linux, kernel 3.2.0
CUDA_NOTE = b'{"Driver":[550]}'

#: file name -> (class, byte order character, e_machine)
VALID = {
    "le64.so": (64, "<", 62),  # x86-64
    "le32.so": (32, "<", 3),  # i386
    "be64.so": (64, ">", 22),  # s390x
    "be32.so": (32, ">", 20),  # ppc
}


def _pad(b: bytes, n: int = 4) -> bytes:
    return b + b"\0" * (-len(b) % n)


def _note(end: str, name: bytes, ntype: int, desc: bytes) -> bytes:
    return struct.pack(end + "III", len(name), len(desc), ntype) + _pad(name) + _pad(desc)


def build(cls: int, end: str, machine: int) -> bytes:
    ehsize, phentsize, shentsize = (64, 56, 64) if cls == 64 else (52, 32, 40)
    addr, dyn_fmt = ("Q", "qQ") if cls == 64 else ("I", "iI")
    dynstr = b"\0" + SONAME + b"\0"
    abi = _note(end, b"GNU\0", 1, struct.pack(end + "IIII", *ABI_TAG))
    cuda = _note(end, b"NVIDIA Corporation\0", 1, CUDA_NOTE + b"\0")
    shstr = b"\0.shstrtab\0.note.cuda.fwd_compatibility\0"
    phoff = ehsize
    off = phoff + 3 * phentsize
    dynstr_off = off
    off += len(_pad(dynstr, 8))
    dyn_off = off
    dyn = b"".join(struct.pack(end + dyn_fmt, t, v) for t, v in ((14, 1), (5, dynstr_off), (10, len(dynstr)), (0, 0)))
    off += len(dyn)
    abi_off = off
    off += len(abi)
    cuda_off = off
    off += len(cuda)
    shstr_off = off
    off += len(_pad(shstr, 8))
    shoff = off
    size = shoff + 3 * shentsize

    def phdr(ptype: int, offset: int, filesz: int, align: int) -> bytes:
        if cls == 64:  # type, flags, offset, vaddr, paddr, filesz, memsz, align
            return struct.pack(end + "IIQQQQQQ", ptype, 4, offset, offset, offset, filesz, filesz, align)
        return struct.pack(end + "IIIIIIII", ptype, offset, offset, offset, filesz, filesz, 4, align)

    def shdr(name: int, stype: int, offset: int, sz: int, align: int) -> bytes:
        if cls == 64:  # name, type, flags, addr, offset, size, link, info, addralign, entsize
            return struct.pack(end + "IIQQQQIIQQ", name, stype, 0, 0, offset, sz, 0, 0, align, 0)
        return struct.pack(end + "IIIIIIIIII", name, stype, 0, 0, offset, sz, 0, 0, align, 0)

    ident = b"\x7fELF" + bytes([1 if cls == 32 else 2, 1 if end == "<" else 2, 1, 0]) + b"\0" * 8
    ehdr = ident + struct.pack(end + "HHI" + addr * 3 + "IHHHHHH", 3, machine, 1, 0, phoff, shoff, 0, ehsize,
                               phentsize, 3, shentsize, 3, 1)
    out = bytearray(size)
    out[0:ehsize] = ehdr
    phdrs = phdr(1, 0, size, 0x1000) + phdr(2, dyn_off, len(dyn), 8) + phdr(4, abi_off, len(abi), 4)
    out[phoff:phoff + len(phdrs)] = phdrs
    out[dynstr_off:dynstr_off + len(dynstr)] = dynstr
    out[dyn_off:dyn_off + len(dyn)] = dyn
    out[abi_off:abi_off + len(abi)] = abi
    out[cuda_off:cuda_off + len(cuda)] = cuda
    out[shstr_off:shstr_off + len(shstr)] = shstr
    shdrs = shdr(0, 0, 0, 0, 0) + shdr(1, 3, shstr_off, len(shstr), 1) + shdr(11, 7, cuda_off, len(cuda), 4)
    out[shoff:shoff + len(shdrs)] = shdrs
    return bytes(out)


def main() -> None:
    for name, (cls, end, machine) in VALID.items():
        (HERE / name).write_bytes(build(cls, end, machine))
    le64 = build(64, "<", 62)
    (HERE / "truncated.so").write_bytes(le64[:40])  # the magic and part of a 64-byte header
    (HERE / "badmagic.so").write_bytes(b"\x7fELG" + le64[4:])
    (HERE / "badclass.so").write_bytes(le64[:4] + b"\x03" + le64[5:])


if __name__ == "__main__":
    main()
