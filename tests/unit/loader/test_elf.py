"""pyxis_hook.loader.elf: facts from gcc-built and system ELF files, checked against binutils' readelf."""

from __future__ import annotations

import glob
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.elfpatch import or_flags_1
from fixtures.synth import build_exe, build_lib
from pyxis_hook.loader.elf import DF_1_NODEFLIB, elf_header, elf_ident, read_elf, read_header
from pyxis_hook.errors import ElfError, PyxisHookError

LIBZ = "/lib/x86_64-linux-gnu/libz.so.1"


def readelf_dynamic(path: str) -> dict[str, list[str]]:
    """NEEDED/SONAME/RPATH/RUNPATH as binutils prints them (the oracle)."""
    out = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True, check=True).stdout
    facts: dict[str, list[str]] = {}
    for m in re.finditer(r"\((NEEDED|SONAME|RPATH|RUNPATH)\)\s+[^\[]*\[(.*)\]$", out, re.M):
        facts.setdefault(m.group(1), []).append(m.group(2))
    return facts


@pytest.fixture(scope="module")
def libdir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    build_lib(d, "libsyn.so.1", filename="libsyn.so.1.2.3", needed=("libdep.so.7", "libother.so"),
              runpath="$ORIGIN/../lib:/opt/x")
    build_lib(d, "librp.so.2", rpath="/a:/b/:")
    build_lib(d, "lib32.so.1", m32=True)
    build_exe(d, "prog", needed=("libsyn.so.1",))
    shutil.copy(d / "prog", d / "prog-nodeflib")
    or_flags_1(d / "prog-nodeflib", DF_1_NODEFLIB)
    return d


def test_synthetic_library(libdir):
    info = read_elf(str(libdir / "libsyn.so.1.2.3"))
    assert (info.elfclass, info.byteorder, info.machine, info.machine_name) == (64, "little", 62, "EM_X86_64")
    assert info.soname == "libsyn.so.1"
    assert info.needed[:2] == ("libdep.so.7", "libother.so")  # gcc adds libc.so.6
    assert info.runpath == ("$ORIGIN/../lib", "/opt/x")
    assert info.rpath is None
    assert info.interp is None
    assert info.etype == 3 and info.dynamic


def test_rpath_elements_kept_raw(libdir):
    info = read_elf(str(libdir / "librp.so.2"))
    assert info.rpath == ("/a", "/b/", "")
    assert info.runpath is None


def test_m32_and_header_only_readers(libdir):
    p = str(libdir / "lib32.so.1")
    info = read_elf(p)
    assert (info.elfclass, info.machine, info.machine_name, info.soname) == (32, 3, "EM_386", "lib32.so.1")
    assert elf_ident(p) == (32, 3, "little")
    assert elf_header(p) == (32, 3)
    assert elf_header(LIBZ) == (64, 62)


def test_nodeflib_flag(libdir):
    assert read_elf(str(libdir / "prog-nodeflib")).nodeflib
    assert read_elf(str(libdir / "prog-nodeflib")).flags_1 == read_elf(str(libdir / "prog")).flags_1 | DF_1_NODEFLIB
    assert not read_elf(str(libdir / "prog")).nodeflib


def test_executable_interp_and_abi_note(libdir):
    info = read_elf(str(libdir / "prog"))
    assert info.interp == "/lib64/ld-linux-x86-64.so.2"
    assert info.needed[0] == "libsyn.so.1"
    assert info.abi_note is not None and info.abi_note[0] == 0 and info.abi_note[1] >= 2


def test_without_section_headers(libdir, tmp_path):
    """Stripped-to-the-bone libraries (no section header table at all) still give their dynamic facts."""
    src = libdir / "libsyn.so.1.2.3"
    dst = tmp_path / "libnosh.so"
    data = bytearray(src.read_bytes())
    struct.pack_into("<Q", data, 0x28, 0xFFFFFFF0)  # e_shoff: garbage
    struct.pack_into("<HH", data, 0x3C, 0, 0)  # e_shnum, e_shstrndx
    dst.write_bytes(bytes(data))
    info = read_elf(str(dst))
    assert info.soname == "libsyn.so.1" and info.needed[:2] == ("libdep.so.7", "libother.so")


@pytest.mark.parametrize("content,words", [
    (b"", "too short"),
    (b"\x7fEL", "too short"),
    (b"\x7fELF\x02\x01\x01", "too short"),
    (b"#!/bin/sh\necho hi\n" * 8, "not an ELF file"),
    (b"\x7fELF\x07\x01\x01" + b"\0" * 60, "EI_CLASS"),
])
def test_bad_files_name_file_and_reason(tmp_path, content, words):
    p = tmp_path / "libbad.so"
    p.write_bytes(content)
    with pytest.raises(ElfError) as e:
        read_elf(str(p))
    assert str(p) in str(e.value) and words in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(ElfError, match="cannot open"):
        read_elf(str(tmp_path / "nope.so"))
    with pytest.raises(ElfError, match="cannot open"):
        read_header(str(tmp_path / "nope.so"))


def test_agrees_with_readelf_on_system_files():
    files = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so*"))[::15] + sorted(glob.glob("/usr/bin/*"))[::40]
    checked = 0
    for f in files:
        if not os.path.isfile(f) or open(f, "rb").read(4) != b"\x7fELF":
            continue
        info = read_elf(f)
        facts = readelf_dynamic(f)
        assert list(info.needed) == facts.get("NEEDED", []), f
        assert info.soname == (facts["SONAME"][-1] if "SONAME" in facts else None), f
        for tag, value in (("RPATH", info.rpath), ("RUNPATH", info.runpath)):
            assert value == (tuple(facts[tag][-1].split(":")) if tag in facts else None), f
        checked += 1
    assert checked >= 50


def _samples() -> list[bytes]:
    here = Path(os.environ.get("TMPDIR", "/tmp")) / f"pyxis-elf-samples-{os.getuid()}"
    lib = build_lib(here, "libfz.so.1", needed=("libc.so.6",), runpath="$ORIGIN")
    return [Path(LIBZ).read_bytes(), lib.read_bytes()]


SAMPLES = _samples()


def _only_elf_error(data: bytes, tmp_path: Path) -> None:
    p = tmp_path / "fuzz.so"
    p.write_bytes(data)
    try:
        read_elf(str(p))
    except ElfError as e:
        assert str(p) in str(e)
    # any other exception type fails the test


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, len(SAMPLES) - 1), cut=st.integers(0, 20000))
def test_truncated_real_libraries_only_raise_elferror(tmp_path, which, cut):
    data = SAMPLES[which]
    _only_elf_error(data[:min(cut, len(data))], tmp_path)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, len(SAMPLES) - 1),
       edits=st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), min_size=1, max_size=12))
def test_fuzzed_headers_only_raise_elferror(tmp_path, which, edits):
    data = bytearray(SAMPLES[which])
    for pos, value in edits:
        data[pos] = value
    _only_elf_error(bytes(data), tmp_path)


def test_elferror_is_a_user_error():
    assert issubclass(ElfError, PyxisHookError)


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils strip missing")
def test_stripped_library(libdir, tmp_path):
    dst = tmp_path / "libstripped.so"
    shutil.copy(libdir / "libsyn.so.1.2.3", dst)
    subprocess.run(["strip", "--strip-all", str(dst)], check=True)
    assert read_elf(str(dst)).needed == read_elf(str(libdir / "libsyn.so.1.2.3")).needed
