#!/usr/bin/env python3
"""Build large test images in seconds: thousands of small ELF libraries with distinct SONAMEs.

Why not gcc per library: 5,000 gcc runs take minutes.  One tiny library is
built once with the SONAME `libbench00000.so.1`; every other one is a byte
copy with that string patched in place (same length, so no ELF offset
moves: `libbench00001.so.1`, ...).  The file is named after its SONAME, so
ldconfig needs no link.  Then `ldconfig -r ROOT` builds the image's cache,
as an image build would.

    python bench/mkimage.py ROOT --libs 5000 [--dir /usr/lib/x86_64-linux-gnu] [--m32 N] [--format new|compat]

ROOT must already be a rootfs (see tests/fixtures/container.py make_rootfs);
only the libraries and the cache are added.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PLACEHOLDER = b"libbench00000.so.1"
_SRC = "int bench_fn(void) { return 42; }\n"


def template(m32: bool = False, prefix: str = "libbench") -> bytes:
    """The bytes of one tiny shared library whose SONAME is the placeholder (with `prefix`)."""
    name = PLACEHOLDER.replace(b"libbench", prefix.encode()).decode()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "b.c"
        src.write_text(_SRC)
        out = Path(tmp) / name
        cmd = ["gcc", "-shared", "-fPIC", "-O2", "-s", "-Wl,-z,noseparate-code", f"-Wl,-soname,{name}",
               "-o", str(out), str(src)]
        if m32:
            cmd.insert(1, "-m32")
        subprocess.run(cmd, check=True, capture_output=True)
        data = out.read_bytes()
    if data.count(name.encode()) != 1:
        raise RuntimeError(f"expected the SONAME {name} once in the template library")
    return data


def soname(i: int, prefix: str = "libbench") -> str:
    return f"{prefix}{i:05d}.so.1"


def write_libs(root: Path | str, count: int, *, lib_dir: str = "/usr/lib/x86_64-linux-gnu", start: int = 1,
               m32: bool = False, prefix: str = "libbench") -> list[str]:
    """Write `count` libraries `<prefix>NNNNN.so.1` into ROOT/lib_dir; return their SONAMEs."""
    data = template(m32, prefix)
    old = PLACEHOLDER.replace(b"libbench", prefix.encode())
    d = Path(root) / lib_dir.lstrip("/")
    d.mkdir(parents=True, exist_ok=True)
    names = []
    for i in range(start, start + count):
        name = soname(i, prefix)
        (d / name).write_bytes(data.replace(old, name.encode()))
        names.append(name)
    return names


def ldconfig(root: Path | str, fmt: str = "new", ldconfig_bin: str | None = None) -> None:
    """Build ROOT/etc/ld.so.cache with glibc's ldconfig, as the image build would."""
    exe = ldconfig_bin or shutil.which("ldconfig") or "/sbin/ldconfig"
    subprocess.run([exe, "-c", fmt, "-r", str(root)], check=True, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="an existing rootfs directory")
    p.add_argument("--libs", type=int, default=1000, help="number of 64-bit libraries (default 1000)")
    p.add_argument("--m32", type=int, default=0, help="number of 32-bit libraries (in --dir32)")
    p.add_argument("--dir", default="/usr/lib/x86_64-linux-gnu")
    p.add_argument("--dir32", default="/usr/lib/i386-linux-gnu")
    p.add_argument("--format", default="new", choices=("new", "compat"))
    args = p.parse_args(argv)
    if not os.path.isdir(args.root):
        p.error(f"{args.root}: not a directory")
    write_libs(args.root, args.libs, lib_dir=args.dir)
    if args.m32:
        write_libs(args.root, args.m32, lib_dir=args.dir32, m32=True, prefix="libbenck")
    ldconfig(args.root, args.format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
