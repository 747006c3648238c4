"""compat.compat_facts (through container_facts): the image's /usr/local/cuda/compat as glibc's ldconfig would index it.

Libraries are gcc-built; the `.note.cuda.fwd_compatibility` section is added
with objcopy and its parse compared with pyelftools' (the oracle); the
SONAME/class reading is compared with `ldconfig -p` over the same dir.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.container import make_rootfs
from fixtures.synth import build_exe, build_lib, m32_toolchain
from pyxis_hook.plan import compat
from pyxis_hook.plan.container import container_facts
from pyxis_hook.plan.build import COMPAT_DIR

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
X8664 = 0x0303


def note_bytes(desc: dict | bytes, owner: bytes = b"NVIDIA Corporation", align: int = 4) -> bytes:
    desc = desc if isinstance(desc, bytes) else json.dumps(desc).encode()
    name = owner + b"\0"

    def pad(b: bytes) -> bytes:
        return b + b"\0" * (-len(b) % align)

    return struct.pack("<III", len(name), len(desc), 1) + pad(name) + pad(desc)


def add_note(lib: Path, note: bytes, tmp: Path, align: int = 4) -> None:
    raw = tmp / f"note-{lib.name}.bin"
    raw.write_bytes(note)
    subprocess.run(["objcopy", "--add-section", f".note.cuda.fwd_compatibility={raw}", str(lib)], check=True,
                   capture_output=True)
    # objcopy gives an added section alignment 1; a real note section has its padding's
    subprocess.run(["objcopy", "--set-section-alignment", f".note.cuda.fwd_compatibility={align}", str(lib)],
                   check=True, capture_output=True)


def compat_image(root: Path, version: str = "550.54.15", *, note: bytes | None = None, tmp: Path | None = None,
                 links: bool = True) -> Path:
    """A Debian-like rootfs with a CUDA-image-like compat dir (libcuda, ptxjitcompiler, dev link)."""
    make_rootfs(root, gputest=False)
    d = root / COMPAT_DIR.lstrip("/")
    lib = build_lib(d, "libcuda.so.1", filename=f"libcuda.so.{version}")
    build_lib(d, "libnvidia-ptxjitcompiler.so.1", filename=f"libnvidia-ptxjitcompiler.so.{version}")
    if note is not None:
        add_note(lib, note, tmp or root.parent)
    if links:
        os.symlink(f"libcuda.so.{version}", d / "libcuda.so.1")
        os.symlink("libcuda.so.1", d / "libcuda.so")
        os.symlink(f"libnvidia-ptxjitcompiler.so.{version}", d / "libnvidia-ptxjitcompiler.so.1")
    return root


def test_cuda_image_compat_dir(tmp_path):
    root = compat_image(tmp_path / "root")
    facts = container_facts(str(root), machine="x86_64")
    assert facts.compat_libcuda == "libcuda.so.550.54.15"
    assert facts.compat_drivers is None  # no note
    assert facts.compat_libs == (("libcuda.so", "libcuda.so", X8664),  # ld(1)'s link: its own key
                                 ("libcuda.so.550.54.15", "libcuda.so.1", X8664),
                                 ("libnvidia-ptxjitcompiler.so.550.54.15", "libnvidia-ptxjitcompiler.so.1", X8664))
    assert facts.compat_problem == ""


def test_rows_equal_what_glibc_ldconfig_indexes(tmp_path):
    """One row per SONAME, the flags ldconfig gives: `ldconfig -p` over the compat dir alone."""
    root = compat_image(tmp_path / "root")
    d = root / COMPAT_DIR.lstrip("/")
    build_lib(d, None, filename="libnosoname.so")  # no DT_SONAME: the file name is the key
    build_exe(d, "libnotalib.so.1")  # an executable named like a library: not indexed
    if m32_toolchain():
        build_lib(d, "libthirtytwo.so.1", filename="libthirtytwo.so.1", m32=True, needed=("libc.so.6",))
    (root / "etc/ld.so.conf").write_text("")
    subprocess.run([LDCONFIG, "-r", str(root), "-C", "/etc/c", COMPAT_DIR], check=True, capture_output=True)
    out = subprocess.run([LDCONFIG, "-p", "-C", str(root / "etc/c")], capture_output=True, text=True).stdout
    theirs = set()
    for line in out.splitlines()[1:]:
        m = re.match(r"\s*(\S+) \((.*)\) => (\S+)", line)
        if m and m.group(3).startswith(COMPAT_DIR + "/"):
            theirs.add((m.group(1), m.group(2)))
    facts = container_facts(str(root), machine="x86_64")
    flag_names = {X8664: "libc6,x86-64", 0x0003: "libc6", 0x0001: "ELF"}
    ours = {(soname, flag_names[flags]) for _name, soname, flags in facts.compat_libs}
    assert ours == theirs


def test_note_parsed_like_pyelftools(tmp_path):
    from elftools.elf.elffile import ELFFile

    note = note_bytes({"CUDA Version": "12.4", "Driver": [470, 535, 550]})
    root = compat_image(tmp_path / "root", note=note, tmp=tmp_path)
    facts = container_facts(str(root), machine="x86_64")
    assert facts.compat_drivers == (470, 535, 550)
    with open(root / COMPAT_DIR.lstrip("/") / "libcuda.so.550.54.15", "rb") as f:
        sec = ELFFile(f).get_section_by_name(".note.cuda.fwd_compatibility")
        (n,) = list(sec.iter_notes())
    assert n["n_name"] == "NVIDIA Corporation"
    assert tuple(json.loads(n["n_desc"] if isinstance(n["n_desc"], str) else n["n_desc"].decode())["Driver"]) \
        == facts.compat_drivers


@pytest.mark.parametrize("note,expect", [
    (note_bytes({"CUDA Version": "12.4", "Driver": ["535", "550.54"]}), (535, 550)),
    (note_bytes({"CUDA Version": "12.4", "Driver": 550}), (550,)),
    (note_bytes({"Driver": [550]}, owner=b"Someone Else"), None),
    (note_bytes(b"{not json"), None),  # unreadable: NVIDIA's hook warns and falls back to the majors rule
])
def test_note_variants(tmp_path, note, expect):
    root = compat_image(tmp_path / "root", note=note, tmp=tmp_path)
    assert container_facts(str(root), machine="x86_64").compat_drivers == expect


def test_no_compat_dir_or_two_libcudas(tmp_path):
    root = make_rootfs(tmp_path / "plain", gputest=False)
    facts = container_facts(str(root))
    assert (facts.compat_libcuda, facts.compat_libs, facts.compat_problem) == ("", (), "")
    root = compat_image(tmp_path / "two")
    build_lib(root / COMPAT_DIR.lstrip("/"), "libcuda.so.1", filename="libcuda.so.545.23.08")
    facts = container_facts(str(root), machine="x86_64")
    assert facts.compat_libcuda == ""  # NVIDIA's hook wants exactly one
    # ldconfig's pick for the SONAME link is the greatest name
    assert ("libcuda.so.550.54.15", "libcuda.so.1", X8664) in facts.compat_libs


def test_a_link_out_of_the_rootfs_is_never_followed(tmp_path):
    """compat/libcuda.so.999.1 -> /<host path>: inside the root that path does not exist."""
    outside = tmp_path / "host"
    real = build_lib(outside, "libcuda.so.1", filename="libcuda.so.999.1")
    root = make_rootfs(tmp_path / "root", gputest=False)
    d = root / COMPAT_DIR.lstrip("/")
    d.mkdir(parents=True)
    os.symlink(str(real), d / "libcuda.so.999.1")
    os.symlink("../../../../" + str(real).lstrip("/"), d / "libcuda.so.1")  # climbs past / : stays inside
    facts = container_facts(str(root), machine="x86_64")
    assert (facts.compat_libcuda, facts.compat_libs) == ("", ())
    # the compat dir itself a link out of the root: as if absent
    shutil.rmtree(root / "usr/local")
    (root / "usr/local/cuda").mkdir(parents=True)
    os.symlink(str(outside), root / COMPAT_DIR.lstrip("/"))
    facts = container_facts(str(root), machine="x86_64")
    assert (facts.compat_libcuda, facts.compat_libs) == ("", ())


def test_what_the_merge_cannot_model_is_a_problem(tmp_path):
    root = compat_image(tmp_path / "root")
    d = root / COMPAT_DIR.lstrip("/")
    (d / "libjunk.so.1").write_bytes(b"not an elf, long enough for a header " * 2)
    facts = container_facts(str(root), machine="x86_64")
    assert facts.compat_libcuda == "libcuda.so.550.54.15"  # still found
    assert "libjunk.so.1" in facts.compat_problem and "not an ELF" in facts.compat_problem
    (d / "libjunk.so.1").unlink()
    (d / "glibc-hwcaps").mkdir()
    assert "subdirectory" in container_facts(str(root), machine="x86_64").compat_problem
    (d / "glibc-hwcaps").rmdir()
    os.mkfifo(d / "libfifo.so.1")  # not a regular file: skipped, never blocks
    assert container_facts(str(root), machine="x86_64").compat_problem == ""


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=0, max_size=400), st.booleans())
def test_elf_reader_on_garbage_raises_only_odd(tmp_path_factory, data, want_note):
    """Whatever the image's file holds: a result or `ElfFactsError`, never another exception."""
    path = tmp_path_factory.mktemp("g") / "f"
    for blob in (data, b"\x7fELF\x02\x01" + data, _valid_header_then(data)):
        path.write_bytes(blob)
        fd = os.open(path, os.O_RDONLY)
        try:
            compat.read_elf_facts(fd, len(blob), "x86_64", want_note)
        except compat.ElfFactsError:
            pass
        finally:
            os.close(fd)


def _valid_header_then(data: bytes) -> bytes:
    head = bytearray(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    struct.pack_into("<HHIQQQIHHHHHH", head, 16, 3, 62, 1, 0, 64, 64, 0, 64, 56, 4, 64, 3, 1)
    return bytes(head) + data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_note_parser_on_garbage(data):
    r = compat._parse_note(data)
    assert r is None or all(isinstance(x, int) for x in r)


def test_hook_path_imports_no_elf_library(tmp_path):
    """Indexing the compat dir (note included) loads neither pyelftools nor pyxis_hook.loader.elf nor dataclasses."""
    root = compat_image(tmp_path / "root", note=note_bytes({"Driver": [535]}), tmp=tmp_path)
    code = ("import sys; from pyxis_hook.plan.container import container_facts; "
            f"f = container_facts({str(root)!r}); assert f.compat_drivers == (535,), f; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('elftools', 'dataclasses', 'jsonschema')"
            " or m == 'pyxis_hook.loader.elf'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_note_padded_to_its_sections_8_byte_alignment_is_read(tmp_path):
    """NVIDIA's hook pads name and description to the section's alignment: read the same way."""
    root = compat_image(tmp_path / "root", links=False)
    lib = root / COMPAT_DIR.lstrip("/") / "libcuda.so.550.54.15"
    add_note(lib, note_bytes({"CUDA Version": "12.4", "Driver": [550, 560]}, align=8), tmp_path, align=8)
    assert container_facts(str(root), machine="x86_64").compat_drivers == (550, 560)


def test_only_a_regular_native_libcuda_with_ascii_version_digits_is_chosen(tmp_path):
    d_of = lambda root: root / COMPAT_DIR.lstrip("/")  # noqa: E731
    # a dangling link beside the regular file: not counted (NVIDIA globs regular files only)
    root = compat_image(tmp_path / "dangling", links=False)
    os.symlink("nowhere", d_of(root) / "libcuda.so.575.1.1")
    assert container_facts(str(root), machine="x86_64").compat_libcuda == "libcuda.so.550.54.15"
    # the versioned name itself a link to a regular file: not used
    root = compat_image(tmp_path / "linked", links=False)
    d = d_of(root)
    os.rename(d / "libcuda.so.550.54.15", d / "real.bin")
    os.symlink("real.bin", d / "libcuda.so.550.54.15")
    assert container_facts(str(root), machine="x86_64").compat_libcuda == ""
    # a 32-bit libcuda only: 64-bit programs would get the host's libcuda with the compat dir's other libs
    root = make_rootfs(tmp_path / "m32", gputest=False)
    build_lib(d_of(root), "libcuda.so.1", filename="libcuda.so.570.86.15", m32=True)
    assert container_facts(str(root), machine="x86_64").compat_libcuda == ""
    # digits that are not ASCII: no version (and no crash in int())
    root = make_rootfs(tmp_path / "odd", gputest=False)
    build_lib(d_of(root), "libcuda.so.1", filename="libcuda.so.5\u00b270.1")
    facts = container_facts(str(root), machine="x86_64")
    assert facts.compat_libcuda == ""
