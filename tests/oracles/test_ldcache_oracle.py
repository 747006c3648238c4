"""pyxis_hook.loader.ldcache/ldconf against glibc's own ldconfig and ld.so.

Caches are built by `ldconfig -r ROOT` over fixture trees of gcc-built
libraries; our `ldcache` output must be byte-for-byte `ldconfig -p -C FILE`,
our writer must reproduce ldconfig's bytes, our lookup must agree with the
loader's choice (`ld.so --list` in a chroot), our ld.so.conf parser with the
directories `ldconfig -v` scans.  `ldconfig -r` chroots when run as root, so
every -C/-f path is inside ROOT.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fixtures.synth import build_exe, build_lib, m32_toolchain
from pyxis_hook.loader import cachewrite as W
from pyxis_hook.loader import ldcache as L
from pyxis_hook.loader import cachelookup as LK
from pyxis_hook.loader import cacheprint as LP
from pyxis_hook.loader.ldconf import existing_dirs, read_ld_so_conf

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
LD64 = "/lib64/ld-linux-x86-64.so.2"
LD32 = "/lib/ld-linux.so.2"
MULTIARCH = "/usr/lib/x86_64-linux-gnu"

pytestmark = pytest.mark.skipif(not os.path.exists(LDCONFIG), reason="glibc ldconfig not installed")


def ldconfig(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([LDCONFIG, *args], capture_output=True, check=True)


def ldconfig_p(cache_file: str) -> bytes:
    return ldconfig("-p", "-C", cache_file).stdout


def ours_p(cache_file: str, shown: str | None = None) -> bytes:
    return os.fsencode(LP.format_ldconfig_p(L.read_cache(cache_file), shown or cache_file))


def build_root(root: Path, *, many: int = 0, m32: bool = True, hwcaps: bool = True) -> Path:
    """A small distribution-like tree: multiarch libs, hwcaps variants, 32-bit libs, an include dir."""
    lib = root / MULTIARCH.lstrip("/")
    build_lib(lib, "libfoo.so.1", filename="libfoo.so.1.2.3")
    build_lib(lib, "libbar.so.2", filename="libbar.so.2.0", needed=("libfoo.so.1",))
    build_lib(lib, "libnvidia-ml.so.1", filename="libnvidia-ml.so.550.54.14")
    build_lib(lib, "libcuda.so.1", filename="libcuda.so.550.54.14")
    build_lib(lib, None, filename="libnosoname.so.3")
    os.symlink("libcuda.so.1", lib / "libcuda.so")
    if hwcaps:
        for level in ("x86-64-v2", "x86-64-v3"):
            build_lib(lib / "glibc-hwcaps" / level, "libfoo.so.1", filename="libfoo.so.1.2.3")
        build_lib(lib / "glibc-hwcaps" / "x86-64-v4", "libbar.so.2", filename="libbar.so.2.0")
    conf_d = root / "etc/ld.so.conf.d"
    conf_d.mkdir(parents=True, exist_ok=True)
    (root / "etc/ld.so.conf").write_text("# test\ninclude /etc/ld.so.conf.d/*.conf\n")
    (conf_d / "opt.conf").write_text("/opt/vendor/lib\n")
    build_lib(root / "opt/vendor/lib", "libvendor.so.7", filename="libvendor.so.7.1")
    build_lib(root / "opt/vendor/lib", "libfoo.so.1", filename="libfoo.so.1.0.0")  # shadowed by order
    if m32:
        (conf_d / "zz_i386.conf").write_text("/usr/lib32\n")
        build_lib(root / "usr/lib32", "libfoo.so.1", filename="libfoo.so.1.2.3", m32=True)
        build_lib(root / "usr/lib32", "libcuda.so.1", filename="libcuda.so.550.54.14", m32=True)
    if many:
        (conf_d / "many.conf").write_text("/opt/many\n")
        proto = build_lib(root / "tmp", None, filename="libproto.so")
        d = root / "opt/many"
        d.mkdir(parents=True)
        rng = random.Random(many)
        stems = ["a", "b", "z", "gl", "X11", "nvidia-", "foo_", "c++", "9p"]
        for i in range(many):
            name = f"lib{rng.choice(stems)}{i % 37}.so.{rng.randint(0, 12)}"
            if rng.random() < 0.5:
                name += f".{rng.randint(0, 200)}"
            shutil.copyfile(proto, d / name)
        os.unlink(proto)
    return root


def make_cache(root: Path, fmt: str = "new") -> str:
    ldconfig("-r", str(root), "-c", fmt)
    return str(root / "etc/ld.so.cache")


# --- the host's own cache --------------------------------------------------------


@pytest.mark.skipif(not os.path.exists("/etc/ld.so.cache"), reason="no host cache")
def test_host_cache_prints_like_ldconfig(tmp_path):
    assert ours_p("/etc/ld.so.cache") == ldconfig_p("/etc/ld.so.cache")
    c = L.read_cache("/etc/ld.so.cache")
    again = tmp_path / "again.cache"
    again.write_bytes(W.serialize_cache(c.entries, c.generator, c.fmt if c.fmt != "empty" else "new"))
    assert ldconfig_p(str(again)).replace(str(again).encode(), b"X") == \
        ldconfig_p("/etc/ld.so.cache").replace(b"/etc/ld.so.cache", b"X")


def test_command_matches_ldconfig_r_p(tmp_path):
    """`pyxis-hook ldcache --root DIR` == `ldconfig -r DIR -p` (shown as /etc/ld.so.cache)."""
    root = build_root(tmp_path / "root", m32=m32_toolchain())
    make_cache(root)
    out = subprocess.run(["pyxis-hook", "ldcache", "--root", str(root)], capture_output=True, check=True).stdout
    assert out == ldconfig("-r", str(root), "-p").stdout
    assert out.startswith(b"1") and b'hwcap: "x86-64-v3"' in out


# --- caches ldconfig builds over fixture trees --------------------------------------


@pytest.mark.parametrize("fmt", ["new", "compat", "old"])
def test_fixture_caches_print_and_serialize_like_ldconfig(tmp_path, fmt):
    root = build_root(tmp_path / "root", many=40, m32=m32_toolchain())
    cache_file = make_cache(root, fmt)
    assert ours_p(cache_file) == ldconfig_p(cache_file)
    c = L.read_cache(cache_file)
    assert c.fmt == fmt
    original = Path(cache_file).read_bytes()
    # ldconfig interns the glibc-hwcaps subdirectory names even where the format cannot use them
    extra = ("x86-64-v2", "x86-64-v3", "x86-64-v4") if fmt == "old" else ()
    ours = W.serialize_cache(c.entries, c.generator, fmt, extra_hwcaps_names=extra)
    assert ours == original
    written = tmp_path / "ours.cache"
    written.write_bytes(ours)
    assert ldconfig_p(str(written)).replace(str(written).encode(), b"X") == \
        ldconfig_p(cache_file).replace(cache_file.encode(), b"X")


@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_hundreds_of_libs(tmp_path, fmt):
    root = build_root(tmp_path / "root", many=600, m32=m32_toolchain())
    cache_file = make_cache(root, fmt)
    assert ours_p(cache_file) == ldconfig_p(cache_file)
    c = L.read_cache(cache_file)
    assert len(c.entries) > 500
    assert W.serialize_cache(c.entries, c.generator, fmt) == Path(cache_file).read_bytes()
    shuffled = list(c.entries)
    random.Random(1).shuffle(shuffled)
    assert [e.key for e in W.sort_entries(shuffled)] == [e.key for e in c.entries]


@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_header_flags_byte_accepted_exactly_as_ldconfig_accepts_it(tmp_path, fmt):
    """Every value of the new header's flags byte: we print a cache exactly when `ldconfig -p` does."""
    data = bytearray(W.serialize_cache(L.read_cache(make_cache(build_root(tmp_path / "root", m32=False), fmt)).entries,
                                       "gen", fmt))
    at = data.find(L.CACHEMAGIC_VERSION_NEW) + 28
    cache_file = tmp_path / "flags.cache"
    for flags in range(256):
        data[at] = flags
        cache_file.write_bytes(data)
        glibc = subprocess.run([LDCONFIG, "-p", "-C", str(cache_file)], capture_output=True)
        try:
            ours = os.fsencode(LP.format_ldconfig_p(L.read_cache(str(cache_file)), str(cache_file)))
        except L.LdCacheError:
            ours = None
        assert (glibc.returncode == 0) == (ours is not None), flags
        assert ours is None or ours == glibc.stdout, flags


def test_merge_then_ldconfig_reads_it(tmp_path):
    """A merged cache (the `ldcache = "merge"` path) is one glibc's ldconfig prints like its own."""
    root = build_root(tmp_path / "root", m32=False)
    cache_file = make_cache(root)
    c = L.read_cache(cache_file)
    added = (L.CacheEntry("libnvidia-ptxjitcompiler.so.1", f"{MULTIARCH}/libnvidia-ptxjitcompiler.so.1",
                          L.FLAG_X8664_LIB64_LIBC6),
             L.CacheEntry("libcuda.so.1", "/usr/local/nvidia/lib64/libcuda.so.1", L.FLAG_X8664_LIB64_LIBC6))
    merged = tmp_path / "merged.cache"
    merged.write_bytes(W.serialize_cache(W.merge_entries(c.entries, added), c.generator))
    text = ldconfig_p(str(merged)).decode()
    assert "\tlibcuda.so.1 (libc6,x86-64) => /usr/local/nvidia/lib64/libcuda.so.1\n" in text
    assert f"{MULTIARCH}/libcuda.so.1\n" not in text
    assert text.startswith(f"{len(c.entries) + 1} libs found")
    assert os.fsencode(LP.format_ldconfig_p(L.read_cache(str(merged)), str(merged))) == ldconfig_p(str(merged))


lib_names = st.from_regex(r"lib[a-zA-Z0-9_+-]{0,6}(\.[0-9]{1,3}|[0-9]{0,2})?\.so(\.[0-9]{1,4}){0,3}", fullmatch=True)


def _libcmp_identity(name: str) -> str:
    """Names libcmp cannot tell apart (lib0.so, lib00.so: digit runs compare as numbers) map together.

    glibc treats such keys as one name in lookups too, so the property below is
    about names libcmp distinguishes."""
    return re.sub(r"[0-9]+", lambda m: str(int(m.group())), name)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names=st.lists(lib_names, min_size=1, max_size=25, unique_by=_libcmp_identity))
def test_ldconfig_order_is_libcmp_order(tmp_path_factory, names):
    """ldconfig sorts keys descending by _dl_cache_libcmp; our sort reproduces its order exactly."""
    root = tmp_path_factory.mktemp("order")
    proto = build_lib(root / "proto", None, filename="libproto.so")
    d = root / "usr/lib/x86_64-linux-gnu"
    d.mkdir(parents=True)
    for n in names:
        shutil.copyfile(proto, d / n)
    (root / "etc").mkdir()
    cache_file = make_cache(root)
    c = L.read_cache(cache_file)
    keys = [e.key for e in c.entries]
    assert sorted(keys) == sorted(names)
    for a, b in zip(keys, keys[1:]):
        assert L.libcmp(a, b) >= 0 and L.libcmp(b, a) <= 0
    assert [e.key for e in W.sort_entries(reversed(c.entries))] == keys
    assert W.serialize_cache(c.entries, c.generator) == Path(cache_file).read_bytes()
    for n in names:
        assert LK.search_cache(c, n).value == f"{MULTIARCH}/{n}"


# --- ld.so.conf against ldconfig -v ----------------------------------------------------------


def ldconfig_scanned_dirs(root: Path) -> list[str]:
    """The non-builtin directories `ldconfig -v` says it scans, in order."""
    out = subprocess.run([LDCONFIG, "-r", str(root), "-v", "-N", "-X"], capture_output=True, text=True,
                         check=True).stdout
    dirs = []
    for line in out.splitlines():
        m = re.match(r"^(/\S*): (?:\(hwcap: \S+\) )?\(from (.*):(\d+)\)$", line)
        if m and m.group(2) != "<builtin>" and "(hwcap:" not in line:
            dirs.append(m.group(1))
    return dirs


def test_ld_so_conf_matches_ldconfig(tmp_path):
    root = tmp_path / "root"
    for d in ("opt/a", "opt/B", "opt/c d", "opt/multi1", "opt/multi2", "opt/tab", "opt/x", "usr/local/lib",
              "opt/rel", "opt/typed", "opt/slash", "etc/ld.so.conf.d", "etc/more.d", "etc/sub/conf.d"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.symlink("/opt/a", root / "opt/alias")  # same inode as /opt/a: ldconfig keeps the first
    (root / "etc/ld.so.conf").write_text(
        "# comment line\n"
        "include /etc/ld.so.conf.d/*.conf\t/etc/more.d/*.conf /etc/none/*.conf\n"
        "   /usr/local/lib   # trailing\n"
        "hwcap 1 foo\n"
        "\t/opt/tab\n"
        "/opt/typed=libc6\n"
        "/opt/slash//\n"
        "/opt/missing\n"
        "/opt/alias\n"
        "include /etc/sub/conf.d/s.conf\n")
    (root / "etc/ld.so.conf.d/b.conf").write_text("/opt/B\n")
    (root / "etc/ld.so.conf.d/a.conf").write_text("/opt/a\n/opt/x\n")
    (root / "etc/ld.so.conf.d/A_.conf").write_text("/opt/multi1\n")
    (root / "etc/ld.so.conf.d/.hidden.conf").write_text("/opt/hidden\n")
    (root / "etc/more.d/m.conf").write_text("/opt/multi2\n")
    (root / "etc/sub/conf.d/s.conf").write_text("/opt/rel\n")
    conf = read_ld_so_conf(str(root))
    indexed = existing_dirs(str(root), conf.dirs)
    assert list(indexed) == ldconfig_scanned_dirs(root)
    assert "/opt/missing" in conf.dirs and "/opt/missing" not in indexed
    assert conf.unmatched_includes == (("/etc/ld.so.conf", 2, "/etc/none/*.conf"),)


def test_relative_includes_through_dotdot_and_links_match_ldconfig(tmp_path):
    """`..` above the root, a relative include in a linked file (relative to the link's directory, as glibc
    joins it to the globbed name), a linked directory: the reader indexes what ldconfig indexes."""
    root = tmp_path / "root"
    for d in ("opt/a", "opt/b", "opt/c", "opt/d", "opt/wrong", "etc/ld.so.conf.d", "opt/real", "srv/conf"):
        (root / d).mkdir(parents=True, exist_ok=True)
    files = {"etc/ld.so.conf": "include ../../../../etc/ld.so.conf.d/*.conf\ninclude ../../../etc/linked/*\n",
             "etc/ld.so.conf.d/1.conf": "/opt/a\ninclude ../../../../../srv/conf/x.conf\n",
             "etc/ld.so.conf.d/sub.conf": "/opt/c\n",  # what the linked file's `include sub.conf` reads
             "opt/real/r.conf": "include sub.conf\n", "opt/real/sub.conf": "/opt/wrong\n",
             "srv/conf/x.conf": "/opt/b\n", "srv/conf/y": "/opt/d\n"}
    for name, text in files.items():
        (root / name).write_text(text)
    os.symlink("/opt/real/r.conf", root / "etc/ld.so.conf.d/2-link.conf")
    os.symlink("../srv/conf", root / "etc/linked")
    conf = read_ld_so_conf(str(root))
    assert not conf.truncated
    assert list(existing_dirs(str(root), conf.dirs)) == ldconfig_scanned_dirs(root) == \
        ["/opt/a", "/opt/b", "/opt/c", "/opt/d"]


# --- lookup against the real loader -------------------------------------------------------------


def supported_hwcaps(ld_so: str) -> list[str]:
    out = subprocess.run([ld_so, "--help"], capture_output=True, text=True).stdout
    section = out.split("Subdirectories of glibc-hwcaps directories, in priority order:\n", 1)[1]
    names = []
    for line in section.splitlines():
        if not line.startswith("  "):
            break
        if "(supported, searched)" in line:
            names.append(line.split()[0])
    return names


def loader_choice(root: Path, ld_so: str, exe: str, soname: str, mask: str | None) -> str | None:
    args = ["chroot", str(root), ld_so]
    if mask is not None:
        args += ["--glibc-hwcaps-mask", mask]
    out = subprocess.run(args + ["--list", exe], capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == soname and len(parts) >= 3:
            return None if parts[2] == "not" else parts[2]
    return None


def copy_runtime(root: Path, ld_so: str, libdir: str) -> None:
    """The loader and libc into the root so `chroot ROOT ld.so --list` works."""
    for src in (ld_so, f"{libdir}/libc.so.6", f"{libdir}/libdl.so.2"):
        dest = root / os.path.realpath(src).lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(src), dest)
        link = root / src.lstrip("/")
        if not link.exists():
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.realpath(src), link)


@pytest.mark.root
@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_lookup_agrees_with_ld_so(tmp_path, fmt):
    root = build_root(tmp_path / "root", m32=False)
    copy_runtime(root, LD64, "/lib/x86_64-linux-gnu")
    build_exe(root / "bin", "app", needed=("libfoo.so.1", "libbar.so.2", "libcuda.so.1", "libvendor.so.7"))
    cache_file = make_cache(root, fmt)
    c = L.read_cache(cache_file)
    supported = supported_hwcaps(LD64)
    for mask in (None, "x86-64-v2", "x86-64-v3:x86-64-v2", "x86-64-v4", "none"):
        hw = supported if mask is None else [h for h in supported if h in mask.split(":")]
        for soname in ("libfoo.so.1", "libbar.so.2", "libcuda.so.1", "libvendor.so.7"):
            expect = loader_choice(root, LD64, "/bin/app", soname, mask)
            got = LK.search_cache(c, soname, LK.LOADER_FLAGS["x86_64"], hwcaps=hw)
            assert got is not None and expect is not None
            assert got.value == expect, (fmt, mask, soname)
    # the loader really used glibc-hwcaps in the new format and could not in compat (docs/loader.md)
    foo = loader_choice(root, LD64, "/bin/app", "libfoo.so.1", None)
    if "x86-64-v3" in supported:
        assert ("/glibc-hwcaps/" in foo) == (fmt == "new")


@pytest.mark.root
def test_lookup_agrees_with_ld_so_i386(tmp_path):
    if not m32_toolchain() or not os.path.exists(LD32):
        pytest.skip("no 32-bit toolchain/loader")
    root = build_root(tmp_path / "root", m32=True)
    copy_runtime(root, LD32, "/lib32")
    (root / "etc/ld.so.conf.d/zz_i386.conf").write_text("/usr/lib32\n/lib32\n")
    build_exe(root / "bin", "app32", needed=("libfoo.so.1", "libcuda.so.1"), m32=True)
    c = L.read_cache(make_cache(root))
    for soname in ("libfoo.so.1", "libcuda.so.1"):
        expect = loader_choice(root, LD32, "/bin/app32", soname, None)
        got = LK.search_cache(c, soname, LK.LOADER_FLAGS["i386"])
        assert got is not None and got.value == expect == f"/usr/lib32/{soname}"
