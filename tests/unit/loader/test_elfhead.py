"""loader/elfhead.py: the one ELF header and note reader, both byte orders, against pyelftools and tiny files.

The tiny files are written at run time by `fixtures.tinyelf` (a few hundred
bytes each; `readelf -h -n -d` reads them too).
"""

from __future__ import annotations

import io
import os
import struct
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.enums import ENUM_E_MACHINE, ENUM_E_TYPE, ENUM_E_VERSION
from elftools.elf.structs import ELFStructs
from hypothesis import given, settings, strategies as st

from fixtures import tinyelf
from pyxis_hook.errors import ElfError
from pyxis_hook.loader import elf, elfhead
from pyxis_hook.plan import compat

VALID = {"le64.so": (64, "little", 62), "le32.so": (32, "little", 3), "be64.so": (64, "big", 22),
         "be32.so": (32, "big", 20)}



@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The tiny valid and broken ELF files, written once for this module."""
    return tinyelf.write_all(tmp_path_factory.mktemp("elf"))


u16, u32 = st.integers(0, 0xFFFF), st.integers(0, 0xFFFFFFFF)


@st.composite
def headers(draw):
    cls = draw(st.sampled_from((32, 64)))
    end = draw(st.sampled_from(("<", ">")))
    word = st.integers(0, 2**64 - 1) if cls == 64 else u32
    ident = (b"\x7fELF" + bytes([1 if cls == 32 else 2, 1 if end == "<" else 2, draw(st.integers(0, 255)),
                                 draw(st.integers(0, 255)), draw(st.integers(0, 255))]) + draw(st.binary(min_size=7, max_size=7)))
    fields = [draw(u16), draw(u16), draw(u32), draw(word), draw(word), draw(word), draw(u32)] + [draw(u16) for _ in range(6)]
    raw = ident + struct.pack(end + ("HHIQQQIHHHHHH" if cls == 64 else "HHIIIIIHHHHHH"), *fields)
    return cls, end, raw


@settings(max_examples=300, deadline=None)
@given(headers())
def test_header_fields_match_pyelftools(h):
    cls, end, raw = h
    structs = ELFStructs(little_endian=end == "<", elfclass=cls)
    structs.create_basic_structs()
    want = structs.Elf_Ehdr.parse(raw)
    got = elfhead.parse_header(raw, "x")
    assert (got.elfclass, got.data, got.endian) == (cls, "little" if end == "<" else "big", end)
    assert (got.ident_version, got.osabi, got.abiversion, got.pad_zero) == (raw[6], raw[7], raw[8], not any(raw[9:16]))
    ours = (got.etype, got.machine, got.version, got.phoff, got.shoff, got.phentsize, got.phnum, got.shentsize,
            got.shnum, got.shstrndx)
    theirs = [want[k] for k in ("e_type", "e_machine", "e_version", "e_phoff", "e_shoff", "e_phentsize",
                                "e_phnum", "e_shentsize", "e_shnum", "e_shstrndx")]
    # pyelftools names the values it knows: back to numbers through its own tables
    for i, table in enumerate((ENUM_E_TYPE, ENUM_E_MACHINE, ENUM_E_VERSION)):
        if isinstance(theirs[i], str):
            theirs[i] = table[theirs[i]]
    assert ours == tuple(theirs)


@st.composite
def note_lists(draw):
    return draw(st.lists(st.tuples(st.binary(max_size=24), u32, st.binary(max_size=40)), max_size=5))


def _encode(notes, end: str, align: int) -> bytes:
    def pad(b: bytes) -> bytes:
        return b + b"\0" * (-len(b) % align)

    return b"".join(struct.pack(end + "III", len(n), len(d), t) + pad(n) + pad(d) for n, t, d in notes)


@settings(max_examples=300, deadline=None)
@given(note_lists(), st.sampled_from(("<", ">")), st.sampled_from((4, 8)))
def test_notes_read_back_in_either_order_and_alignment(notes, end, align):
    assert list(elfhead.iter_notes(_encode(notes, end, align), end, align)) == notes


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(("<", ">")), st.sampled_from((0, 4, 8, 3)))
def test_notes_never_read_past_the_end(raw, end, align):
    for name, _t, desc in elfhead.iter_notes(raw, end, align):
        assert len(name) + len(desc) + 12 <= len(raw)


@pytest.mark.parametrize("name", sorted(VALID))
def test_tiny_files_header_as_pyelftools_reads_it(data, name):
    raw = (data / name).read_bytes()
    cls, order, machine = VALID[name]
    h = elfhead.parse_header(raw[:64], name)
    e = ELFFile(io.BytesIO(raw))
    assert (h.elfclass, h.data, h.machine, h.etype) == (e.elfclass, order, machine, 3)
    assert e.little_endian == (order == "little")
    assert (h.phoff, h.phnum, h.shoff, h.shnum, h.shstrndx) == (e["e_phoff"], e["e_phnum"], e["e_shoff"],
                                                                e["e_shnum"], e["e_shstrndx"])
    section = e.get_section_by_name(".note.cuda.fwd_compatibility")
    ours = list(elfhead.iter_notes(section.data(), h.endian, section["sh_addralign"]))
    theirs = [(n["n_name"].encode() + b"\0", n["n_descsz"]) for n in section.iter_notes()]
    assert [(nm, len(desc)) for nm, _t, desc in ours] == theirs
    assert compat._parse_note(section.data(), 4, h.endian) == (550,)


@pytest.mark.parametrize("name", sorted(VALID))
def test_tiny_files_abi_note_and_soname_in_both_orders(data, name):
    info = elf.read_elf(str(data / name))
    assert (info.elfclass, info.byteorder, info.soname, info.abi_note) == (
        VALID[name][0], VALID[name][1], "libtiny.so.1", (0, 3, 2, 0))


@pytest.mark.parametrize("name, machine", [("le64.so", "x86_64"), ("le32.so", "x86_64"), ("be64.so", "s390x")])
def test_hot_path_reader_on_tiny_files(data, name, machine):
    """The compat-dir reader: the file's facts in this machine's byte order, a problem in the other."""
    path = data / name
    fd = os.open(path, os.O_RDONLY)
    try:
        if VALID[name][1] == sys.byteorder:
            assert compat.read_elf_facts(fd, path.stat().st_size, machine, True) == (
                VALID[name][0], "libtiny.so.1", (), (550,))
        else:
            with pytest.raises(compat.ElfFactsError, match=f"a big-endian ELF file on a {sys.byteorder}-endian"):
                compat.read_elf_facts(fd, path.stat().st_size, machine, True)
    finally:
        os.close(fd)


@pytest.mark.parametrize("name, message", [("truncated.so", "file too short (40 bytes, the ELF header needs 64)"),
                                           ("badmagic.so", "not an ELF file (invalid ELF header)")])
def test_broken_tiny_files_are_one_error(data, name, message):
    raw = (data / name).read_bytes()
    with pytest.raises(ElfError, match=rf"^{name}: {message.replace('(', '[(]').replace(')', '[)]')}$"):
        elfhead.parse_header(raw[:64], name)
    fd = os.open(data / name, os.O_RDONLY)
    try:
        with pytest.raises(compat.ElfFactsError, match=message.split(" (")[0]):
            compat.read_elf_facts(fd, len(raw), "x86_64", True)
    finally:
        os.close(fd)


def test_bad_class_is_reported_not_guessed(data):
    raw = (data / "badclass.so").read_bytes()
    h = elfhead.parse_header(raw[:64], "badclass.so")
    assert (h.elfclass, h.machine, h.phnum) == (0, 0, 0)
    with pytest.raises(ElfError, match="bad EI_CLASS"):
        elf.read_elf(str(data / "badclass.so"))
    fd = os.open(data / "badclass.so", os.O_RDONLY)
    try:
        with pytest.raises(compat.ElfFactsError, match="not an ELF file"):
            compat.read_elf_facts(fd, len(raw), "x86_64", True)
    finally:
        os.close(fd)
