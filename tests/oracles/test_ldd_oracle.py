"""`pyxis-hook ldd` against glibc's own loader (`LD_TRACE_LOADED_OBJECTS=1 ld.so FILE`, i.e. ldd).

(a) hundreds of this machine's libraries and executables, resolved with the host's cache;
(b) synthetic trees under /tmp with absolute RPATH/RUNPATH, so glibc's ld.so can run
    on them directly with root '/': RPATH chain vs RUNPATH, --library-path, --inhibit-cache,
    $ORIGIN/$LIB/$PLATFORM, hwcaps and legacy platform dir shadowing, a wrong-class lib
    skipped, a 7-byte lib that makes the load fail;
(c) as root: a tiny rootfs with its own ld.so.cache built by `ldconfig -r`, compared with
    `chroot ROOT ld.so --list`, for cache-only behaviour (missing SONAME link after
    `ldconfig -X`, glibc-hwcaps cache entries, DF_1_NODEFLIB) and in-root symlinks.

Addresses and the vDSO line are ignored; everything else (order, names, paths, `not found`,
the interpreter line, the error line and exit status) must be identical.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.elfpatch import or_flags_1
from fixtures.glibcroot import make_glibc_root
from fixtures.synth import build_exe, build_lib
from pyxis_hook.commands import ldd
from pyxis_hook.loader.elf import DF_1_NODEFLIB
from pyxis_hook.loader.loaderenv import detect_hwcaps, loader_env_for_root

LDSO = "/lib64/ld-linux-x86-64.so.2"
ADDR = re.compile(r" \(0x[0-9a-f]+\)$")

pytestmark = pytest.mark.skipif(not os.path.exists(LDSO), reason="needs glibc's x86-64 ld.so")


def glibc(file: str, *, library_path: str | None = None, inhibit: bool = False,
          chroot: str | None = None) -> tuple[int, list[str], str]:
    cmd = [LDSO]
    if library_path is not None:
        cmd += ["--library-path", library_path]
    if inhibit:
        cmd.append("--inhibit-cache")
    cmd.append(file)

    def enter_root() -> None:  # not chroot(1): it would inherit LD_TRACE_LOADED_OBJECTS and trace itself
        os.chroot(chroot)
        os.chdir("/")

    r = subprocess.run(cmd, env={"LD_TRACE_LOADED_OBJECTS": "1"}, capture_output=True, text=True, timeout=60,
                       preexec_fn=enter_root if chroot else None)
    lines = [ADDR.sub("", line) for line in r.stdout.splitlines() if "linux-vdso.so" not in line]
    return r.returncode, lines, r.stderr


def ours(file: str, *, library_path: str | None = None, inhibit: bool = False,
         root: str = "/") -> tuple[int, list[str], str]:
    args = argparse.Namespace(root=root, library_path=library_path or "", inhibit_cache=inhibit, json=False,
                              files=[file])
    result, out = ldd._one(args, file)
    err = ldd.error_text(result)
    return (ldd.LOAD_FAILED_EXIT if result["error"] else 0), out.splitlines(), err


def assert_same(file: str, **kw) -> list[str]:
    root = kw.pop("chroot", None)
    expected = glibc(file, chroot=root, **kw)
    got = ours(file, root=root or "/", **kw)
    assert got[0] == expected[0], (file, expected, got)
    assert got[1] == expected[1], file
    if expected[0]:
        assert got[2].strip() == expected[2].strip()
    return got[1]


# ----------------------------------------------------------------- (a) the host

def _host_files() -> list[str]:
    libs = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/*.so*"))
    bins = sorted(glob.glob("/usr/bin/*"))
    files = libs[::4] + bins[::8]
    out = []
    for f in files:
        try:
            with open(f, "rb") as fh:
                if fh.read(4) == b"\x7fELF":
                    out.append(f)
        except OSError:
            pass
    return out


def test_host_libraries_and_executables():
    files = _host_files()
    compared = 0
    mismatches = []
    for f in files:
        expected = glibc(f)
        if expected[0] != 0:
            continue  # not loadable by this ld.so at all (e.g. a 32-bit file); not what we compare here
        got = ours(f)
        compared += 1
        if got[1] != expected[1]:
            mismatches.append((f, expected[1], got[1]))
    assert compared >= 200
    assert not mismatches, mismatches[:3]


# ----------------------------------------------------------------- (b) synthetic trees, root '/'

@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    t = tmp_path_factory.mktemp("ldd-oracle")
    T = str(t)
    # RPATH chain vs RUNPATH
    build_lib(t / "r1", "libb.so.1")
    build_lib(t / "lib", "liba.so.1", needed=("libb.so.1",))
    build_exe(t / "bin", "exe-rpath", needed=("liba.so.1",), rpath=f"{T}/lib:{T}/r1")
    build_exe(t / "bin", "exe-runpath", needed=("liba.so.1",), runpath=f"{T}/lib:{T}/r1")
    # RPATH of a grandparent library, under an executable with RUNPATH (its RPATH is not in the chain)
    build_lib(t / "r2", "libe.so.1")
    build_lib(t / "r2", "libd.so.1", needed=("libe.so.1",))
    build_lib(t / "lib", "libc1.so.1", needed=("libd.so.1",), rpath=f"{T}/r2")
    build_exe(t / "bin", "exe-mixed", needed=("libc1.so.1",), runpath=f"{T}/lib")
    # LD_LIBRARY_PATH copies
    build_lib(t / "llp", "libb.so.1")
    build_lib(t / "llp", "liba.so.1", needed=("libb.so.1",))
    # $ORIGIN, ${ORIGIN}, $ORIGINAL (literal), $LIB, $PLATFORM
    build_lib(t / "olib", "libo.so.1")
    build_lib(t / "lib/x86_64-linux-gnu", "libl.so.1")
    for platform in ("x86_64", "haswell", "xeon_phi"):  # the kernel's and glibc's Intel platforms
        build_lib(t / "plat" / platform, "libp.so.1")
    build_exe(t / "bin", "exe-dst", needed=("libo.so.1", "libl.so.1", "libp.so.1"),
              runpath=f"$ORIGINAL/x:${{ORIGIN}}/../olib:$ORIGIN/../$LIB:{T}/plat/$PLATFORM")
    # hwcaps shadowing: glibc-hwcaps/x86-64-v2 and the legacy tls/ dir before the dir itself
    build_lib(t / "hw", "libh.so.1")
    build_lib(t / "hw/glibc-hwcaps/x86-64-v2", "libh.so.1")
    build_lib(t / "hw2", "libh2.so.1")
    build_lib(t / "hw2/tls", "libh2.so.1")
    # legacy platform and hwcap subdirs (glibc < 2.37): which one wins depends on the CPU
    for sub in ("", "x86_64", "haswell", "xeon_phi", "avx512_1/x86_64"):
        build_lib(t / "hw3" / sub, "libh3.so.1")
    build_exe(t / "bin", "exe-hw", needed=("libh.so.1", "libh2.so.1", "libh3.so.1"),
              runpath=f"{T}/hw:{T}/hw2:{T}/hw3")
    # wrong class earlier in the path: skipped
    build_lib(t / "m32", "libw.so.1", m32=True)
    build_lib(t / "m64", "libw.so.1")
    build_exe(t / "bin", "exe-class", needed=("libw.so.1",), runpath=f"{T}/m32:{T}/m64")
    # 7-byte file earlier in the path: the load fails although a good copy follows
    (t / "bad").mkdir()
    (t / "bad/libk.so.1").write_bytes(b"\x7fELF\x02\x01\x01")
    build_lib(t / "good", "libk.so.1")
    build_exe(t / "bin", "exe-corrupt", needed=("libk.so.1",), runpath=f"{T}/bad:{T}/good")
    # a missing library asked for twice, SONAME dedupe, a NEEDED path with '/', NODEFLIB
    build_lib(t / "lib", "libm1.so.1", needed=("libmissing.so.9", "liba.so.1"))
    noso = build_lib(t / "r1", None, filename="libnosoname.so")  # linked by path: DT_NEEDED holds the path
    build_lib(t / "lib", "libm2.so.1", needed=("libmissing.so.9",), extra_flags=("-Wl,--no-as-needed", str(noso)))
    build_exe(t / "bin", "exe-missing", needed=("libm1.so.1", "libm2.so.1"), runpath=f"{T}/lib:{T}/r1")
    build_exe(t / "bin", "exe-nodeflib", needed=("liba.so.1",), runpath=f"{T}/lib:{T}/r1")
    or_flags_1(t / "bin/exe-nodeflib", DF_1_NODEFLIB)
    return t


@pytest.mark.parametrize("exe", ["exe-rpath", "exe-runpath", "exe-mixed", "exe-dst", "exe-hw", "exe-class",
                                 "exe-corrupt", "exe-missing", "exe-nodeflib"])
def test_synthetic_tree(tree, exe):
    assert_same(str(tree / "bin" / exe))


def test_rules_the_oracle_confirms(tree):
    """Spell out what the comparisons above mean, so a wrong oracle cannot pass silently."""
    T = str(tree)
    assert f"\tlibb.so.1 => {T}/r1/libb.so.1" in assert_same(f"{T}/bin/exe-rpath")
    assert "\tlibb.so.1 => not found" in assert_same(f"{T}/bin/exe-runpath")
    assert f"\tlibe.so.1 => {T}/r2/libe.so.1" in assert_same(f"{T}/bin/exe-mixed")
    assert f"\tlibw.so.1 => {T}/m64/libw.so.1" in assert_same(f"{T}/bin/exe-class")
    lines = assert_same(f"{T}/bin/exe-dst")
    assert f"\tlibl.so.1 => {T}/bin/../lib/x86_64-linux-gnu/libl.so.1" in lines
    host = loader_env_for_root("/")  # $PLATFORM: "haswell" on Intel CPUs with AVX2, "x86_64" on AMD
    assert f"\tlibp.so.1 => {T}/plat/{host.platform}/libp.so.1" in lines
    hw = assert_same(f"{T}/bin/exe-hw")
    if "x86-64-v2" in detect_hwcaps():
        assert f"\tlibh.so.1 => {T}/hw/glibc-hwcaps/x86-64-v2/libh.so.1" in hw
    if host.glibc_version < (2, 37):
        assert f"\tlibh2.so.1 => {T}/hw2/tls/libh2.so.1" in hw
        assert f"\tlibh3.so.1 => {T}/hw3/{host.platform}/libh3.so.1" in hw
    else:
        assert f"\tlibh3.so.1 => {T}/hw3/libh3.so.1" in hw
    rc, _, err = ours(f"{T}/bin/exe-corrupt")
    assert rc == 127 and f"{T}/bad/libk.so.1: file too short" in err
    assert assert_same(f"{T}/bin/exe-missing").count("\tlibmissing.so.9 => not found") == 2
    assert "\tliba.so.1 => not found" not in assert_same(f"{T}/bin/exe-nodeflib")


@pytest.mark.parametrize("exe,path", [
    ("exe-rpath", "{T}/llp"),  # RPATH beats LD_LIBRARY_PATH
    ("exe-runpath", "{T}/llp"),  # LD_LIBRARY_PATH beats RUNPATH, for every level
    ("exe-runpath", "{T}/nothere;{T}/llp:"),  # ';' separates too; empty element = cwd
    ("exe-mixed", "{T}/llp"),
])
def test_library_path(tree, exe, path):
    lines = assert_same(str(tree / "bin" / exe), library_path=path.format(T=tree))
    if exe == "exe-runpath":
        assert f"\tliba.so.1 => {tree}/llp/liba.so.1" in lines


def test_inhibit_cache(tree):
    """A library reachable only through /etc/ld.so.cache disappears with --inhibit-cache."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    system = ("/lib/x86_64-linux-gnu/", "/usr/lib/x86_64-linux-gnu/", "/lib/", "/usr/lib/")
    only_cached = [m.group(1) for m in re.finditer(r"^\t(\S+) \(libc6,x86-64\) => (\S+)$", out, re.M)
                   if not m.group(2).startswith(system) and os.path.exists(m.group(2))]
    names = tuple(dict.fromkeys(only_cached))[:2] + ("libz.so.1",)
    exe = build_exe(tree / "bin", "exe-cache", needed=names)
    with_cache = assert_same(str(exe))
    without = assert_same(str(exe), inhibit=True)
    if len(names) > 1:
        assert with_cache != without
        assert f"\t{names[0]} => not found" in without


# ----------------------------------------------------------------- (c) a rootfs with its own cache, via chroot

@pytest.fixture(scope="module")
def rootfs(tmp_path_factory) -> Path:
    if shutil.which("ldconfig") is None and not os.path.exists("/sbin/ldconfig"):
        pytest.skip("needs ldconfig")
    r = tmp_path_factory.mktemp("ldd-root")
    lib = make_glibc_root(r)
    (r / "etc/ld.so.conf").write_text("/opt/foo/lib\n/opt/hw/lib\n/opt/link\n/opt/leg/lib\n/opt/leg2/lib\n")
    # libfoo: only the versioned file, SONAME link removed after ldconfig -X (cache points at a missing file)
    build_lib(r / "opt/foo/lib", "libfoo.so.1", filename="libfoo.so.1.0")
    build_lib(r / "opt/foo/lib", "libbar.so.1")
    # a fallback copy of libfoo in a system dir
    build_lib(lib, "libfoo.so.1")
    # glibc-hwcaps entries in the cache
    build_lib(r / "opt/hw/lib", "libq.so.1")
    build_lib(r / "opt/hw/lib/glibc-hwcaps/x86-64-v2", "libq.so.1")
    # a directory reached through an absolute symlink that must stay inside the root
    (r / "opt/real").mkdir(parents=True)
    build_lib(r / "opt/real", "libsym.so.1")
    os.symlink("/opt/real", r / "opt/link")
    # legacy hwcap cache entries (ldconfig < 2.37 indexes platform/hwcap/tls subdirs): a loader before 2.37
    # takes the first one its CPU allows; the platform and avx512_1 ones depend on the CPU (loadercpu)
    for sub in ("", "x86_64", "haswell", "xeon_phi", "avx512_1", "i686"):
        build_lib(r / "opt/leg/lib" / sub, "libleg.so.1")
    for sub in ("", "tls"):
        build_lib(r / "opt/leg2/lib" / sub, "libleg2.so.1")
    build_exe(r / "bin", "app", needed=("libfoo.so.1", "libbar.so.1", "libq.so.1", "libsym.so.1", "libleg.so.1",
                                        "libleg2.so.1"))
    shutil.copy2(r / "bin/app", r / "bin/app-nodeflib")
    or_flags_1(r / "bin/app-nodeflib", DF_1_NODEFLIB)
    subprocess.run([shutil.which("ldconfig") or "/sbin/ldconfig", "-r", str(r), "-X"], check=True, capture_output=True)
    return r


@pytest.mark.root
@pytest.mark.parametrize("exe", ["/bin/app", "/bin/app-nodeflib"])
@pytest.mark.parametrize("inhibit", [False, True])
def test_rootfs_against_chroot(rootfs, exe, inhibit):
    lines = assert_same(exe, chroot=str(rootfs), inhibit=inhibit)
    if exe == "/bin/app" and not inhibit:
        # the cache says /opt/foo/lib/libfoo.so.1, which -X never created: fall through to the system dir
        assert "\tlibfoo.so.1 => /lib/x86_64-linux-gnu/libfoo.so.1" in lines
        assert "\tlibsym.so.1 => /opt/link/libsym.so.1" in lines
        if loader_env_for_root(str(rootfs)).glibc_version < (2, 37):
            assert "\tlibleg2.so.1 => /opt/leg2/lib/tls/libleg2.so.1" in lines
    if exe == "/bin/app-nodeflib" and not inhibit:
        assert "\tlibc.so.6 => not found" in lines  # cache hit in a system dir dropped, system dirs skipped


# ----------------------------------------------------------------- a 32-bit executable, glibc's i386 loader

LDSO32 = "/lib/ld-linux.so.2"


@pytest.mark.skipif(not os.path.exists(LDSO32), reason="needs glibc's i386 ld.so (libc6-i386)")
def test_32_bit_executable_with_i386_loader(tree):
    T = str(tree)
    build_lib(tree / "w64", "libw32.so.1")
    build_lib(tree / "w32", "libw32.so.1", m32=True)
    exe = build_exe(tree / "bin", "exe32", needed=("libw32.so.1", "libz.so.1"), runpath=f"{T}/w64:{T}/w32", m32=True)
    r = subprocess.run([LDSO32, str(exe)], env={"LD_TRACE_LOADED_OBJECTS": "1"}, capture_output=True, text=True)
    expected = [ADDR.sub("", line) for line in r.stdout.splitlines() if "linux-gate.so" not in line
                and "linux-vdso" not in line]
    rc, got, _ = ours(str(exe))
    assert (rc, got) == (r.returncode, expected)
    assert f"\tlibw32.so.1 => {T}/w32/libw32.so.1" in got
