"""ldmerge against glibc: our merged cache == the cache glibc's ldconfig writes after the injection.

For each image (small, 1,000 and 5,000 synthetic libraries, 32-bit entries,
glibc-hwcaps subdirs, a compat old+new cache) the injection is done as the
hook does it (library file + SONAME link in the container's lib dir), then:

* ours: `cacheupdate.update_container_cache` on the image's existing cache;
* glibc: `ldconfig -r ROOT -C /etc/ld.so.cache.glibc` over the same tree;
* `ldconfig -p -C` of both must be equal line for line, and glibc's ld.so
  (`ld.so --list` chrooted into the tree) must resolve every injected SONAME
  to the same path with either cache.

The trees exercise the rules the merge models: directory precedence
(an image lib in a dir scanned earlier keeps winning, one scanned later
loses), a dir reached under two names (/lib -> usr/lib: the first
configured name is the one in the cache), an entry already present in the
same dir, a glibc-hwcaps variant of an injected SONAME, 32-bit libraries
with and without libc in DT_NEEDED.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.container import make_rootfs
from fixtures.synth import build_exe, build_lib, m32_toolchain
from pyxis_hook.loader import ldcache as L
from pyxis_hook.apply import cacheupdate
from pyxis_hook.loader import ldmerge
from pyxis_hook.rootfs import RootFS

LDCONFIG = shutil.which("ldconfig") or "/sbin/ldconfig"
MULTIARCH = "/usr/lib/x86_64-linux-gnu"
I386 = "/usr/lib/i386-linux-gnu"
REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.root, pytest.mark.skipif(not os.path.exists(LDCONFIG), reason="no glibc ldconfig")]


def _mkimage():
    spec = importlib.util.spec_from_file_location("bench_mkimage", REPO / "bench/mkimage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def p(cache_file: Path) -> list[str]:
    out = subprocess.run([LDCONFIG, "-p", "-C", str(cache_file)], capture_output=True, check=True, text=True).stdout
    lines = out.splitlines()
    return [re.sub(r"`.*'", "`CACHE'", lines[0])] + lines[1:]


def build_image(root: Path, *, many: int = 0, m32: bool = False, hwcaps: bool = True, fmt: str = "new") -> Path:
    """A Debian-like image whose cache glibc's ldconfig built (as after a package install)."""
    make_rootfs(root, gputest=False)
    conf_d = root / "etc/ld.so.conf.d"
    (conf_d / "libc.conf").write_text("/usr/local/lib\n")
    (conf_d / "x86_64-linux-gnu.conf").write_text(
        "# Multiarch support\n/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n")
    lib = root / MULTIARCH.lstrip("/")
    build_lib(lib, "libimage.so.3", filename="libimage.so.3.1")
    # precedence: a dir scanned before the injected one (wins), one scanned after (loses)
    build_lib(root / "usr/local/lib/x86_64-linux-gnu", "libshadow.so.1", filename="libshadow.so.1.0")
    build_lib(root / "usr/lib", "libunder.so.1", filename="libunder.so.1.0")
    # already listed in the same dir (the hook re-points the SONAME link)
    build_lib(lib, "libsame.so.1", filename="libsame.so.1.0")
    os.symlink("libsame.so.1.0", lib / "libsame.so.1")
    if hwcaps:
        build_lib(lib / "glibc-hwcaps/x86-64-v2", "libhwinj.so.1", filename="libhwinj.so.1.0")
        build_lib(lib / "glibc-hwcaps/x86-64-v3", "libimage.so.3", filename="libimage.so.3.1")
    if m32:
        (conf_d / "i386-linux-gnu.conf").write_text("/lib/i386-linux-gnu\n/usr/lib/i386-linux-gnu\n")
        build_lib(root / I386.lstrip("/"), "libimage32.so.1", filename="libimage32.so.1.0", m32=True)
    if many:
        _mkimage().write_libs(root, many, lib_dir=MULTIARCH)
    subprocess.run([LDCONFIG, "-c", fmt, "-r", str(root)], check=True, capture_output=True)
    return root


def inject(root: Path, *, m32: bool = False) -> tuple[ldmerge.InjectedLib, ...]:
    """Place driver-like libraries as the hook's plan does: the file, then its SONAME link."""
    specs = [
        (MULTIARCH, "libcuda.so.535.104.05", "libcuda.so.1", 64, ()),
        (MULTIARCH, "libnvidia-ml.so.535.104.05", "libnvidia-ml.so.1", 64, ()),
        (MULTIARCH, "libshadow.so.535.104.05", "libshadow.so.1", 64, ()),
        (MULTIARCH, "libunder.so.535.104.05", "libunder.so.1", 64, ()),
        (MULTIARCH, "libsame.so.535.104.05", "libsame.so.1", 64, ()),
        (MULTIARCH, "libhwinj.so.535.104.05", "libhwinj.so.1", 64, ()),
        (MULTIARCH, "nvidia_drv.so", "nvidia_drv.so", 64, ()),  # not lib*: ldconfig ignores it
    ]
    if m32:
        specs += [(I386, "libcuda.so.535.104.05", "libcuda.so.1", 32, ("libc.so.6",)),
                  (I386, "libnvidia-ml.so.535.104.05", "libnvidia-ml.so.1", 32, ())]
    libs = []
    for d, name, soname, cls, needed in specs:
        host_dir = root / d.lstrip("/")
        build_lib(host_dir, soname, filename=name, m32=cls == 32, needed=needed)
        link = host_dir / soname
        if link.is_symlink():
            link.unlink()
        if not link.exists() and soname != name:
            os.symlink(name, link)
        libs.append(ldmerge.InjectedLib(d, name, soname, L.written_flags(cls, needed, "x86_64")))
    return tuple(libs)


def ld_list(root: Path, prog: str) -> dict[str, str]:
    out = subprocess.run(["chroot", str(root), "/lib64/ld-linux-x86-64.so.2", "--list", prog],
                         capture_output=True, text=True, check=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def check_against_glibc(root: Path, libs, fmt: str, sonames: tuple[str, ...]) -> str:
    with RootFS(str(root)) as rfs:
        msg = cacheupdate.update_container_cache(rfs, libs)
    ours = root / "etc/ld.so.cache"
    assert L.read_cache(str(ours)).fmt == fmt
    subprocess.run([LDCONFIG, "-c", fmt, "-r", str(root), "-C", "/etc/ld.so.cache.glibc"], check=True,
                   capture_output=True)
    theirs = root / "etc/ld.so.cache.glibc"
    assert p(ours) == p(theirs)
    # the loader's view: every injected SONAME resolves to the same path with either cache
    build_exe(root / "usr/bin", "needs-injected", needed=sonames)
    with_ours = ld_list(root, "/usr/bin/needs-injected")
    os.rename(ours, root / "etc/ld.so.cache.ours")
    os.rename(theirs, ours)
    with_theirs = ld_list(root, "/usr/bin/needs-injected")
    for s in sonames:
        assert with_ours.get(s) == with_theirs.get(s), s
        assert with_ours.get(s, "not found") != "not found", s
    return msg


SONAMES = ("libcuda.so.1", "libnvidia-ml.so.1", "libshadow.so.1", "libunder.so.1", "libsame.so.1", "libhwinj.so.1")


@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_small_image(tmp_path, fmt):
    m32 = m32_toolchain()
    root = build_image(tmp_path / "root", m32=m32, hwcaps=fmt == "new", fmt=fmt)
    libs = inject(root, m32=m32)
    msg = check_against_glibc(root, libs, fmt, SONAMES)
    assert f"({fmt} format, 1 already listed)" in msg  # libsame.so.1
    lines = p(root / "etc/ld.so.cache.ours")
    # precedence kept: the image's earlier dir wins, our dir beats a later one; /lib is the first name
    assert lines.index("\tlibshadow.so.1 (libc6,x86-64) => /usr/local/lib/x86_64-linux-gnu/libshadow.so.1") < \
        lines.index("\tlibshadow.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libshadow.so.1")
    assert lines.index("\tlibunder.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libunder.so.1") < \
        lines.index("\tlibunder.so.1 (libc6,x86-64) => /lib/libunder.so.1")  # /usr/lib is reached first as /lib
    if m32:
        assert "\tlibcuda.so.1 (libc6) => /lib/i386-linux-gnu/libcuda.so.1" in lines
        assert "\tlibnvidia-ml.so.1 (ELF) => /lib/i386-linux-gnu/libnvidia-ml.so.1" in lines
    resolved = ld_list(root, "/usr/bin/needs-injected")
    assert resolved["libcuda.so.1"] == "/lib/x86_64-linux-gnu/libcuda.so.1"
    assert resolved["libshadow.so.1"] == "/usr/local/lib/x86_64-linux-gnu/libshadow.so.1"


@pytest.mark.parametrize("many", [1000, 5000])
def test_large_image(tmp_path, many):
    root = build_image(tmp_path / "root", many=many)
    libs = inject(root)
    msg = check_against_glibc(root, libs, "new", SONAMES + ("libbench00001.so.1", f"libbench{many:05d}.so.1"))
    assert "merged 5 entries" in msg
    assert len(L.read_cache(str(root / "etc/ld.so.cache.ours")).entries) == \
        len(L.read_cache(str(root / "etc/ld.so.cache")).entries)


def test_injection_already_in_cache_leaves_it_untouched(tmp_path):
    root = build_image(tmp_path / "root", hwcaps=False)
    libs = inject(root)
    subprocess.run([LDCONFIG, "-r", str(root)], check=True, capture_output=True)
    before = (root / "etc/ld.so.cache").read_bytes()
    st = os.stat(root / "etc/ld.so.cache")
    with RootFS(str(root)) as rfs:
        msg = cacheupdate.update_container_cache(rfs, libs)
    assert "merged 0 entries" in msg
    assert (root / "etc/ld.so.cache").read_bytes() == before
    assert os.stat(root / "etc/ld.so.cache").st_ino == st.st_ino


# --- what the merge refuses to model (the hook then runs ldconfig) ------------------------


def _refused(root: Path, libs) -> str:
    with RootFS(str(root)) as rfs:
        with pytest.raises(ldmerge.CannotMerge) as e:
            cacheupdate.update_container_cache(rfs, libs)
    return str(e.value)


def test_refuses_no_cache_no_conf_old_format_and_garbage(tmp_path):
    root = build_image(tmp_path / "root", hwcaps=False)
    libs = inject(root)
    cache = root / "etc/ld.so.cache"
    good = cache.read_bytes()
    cache.unlink()
    assert "no ld.so.cache" in _refused(root, libs)
    cache.write_bytes(b"not a cache at all, just bytes")
    assert "unknown cache format" in _refused(root, libs)
    cache.write_bytes(b"")
    assert "empty" in _refused(root, libs)
    subprocess.run([LDCONFIG, "-c", "old", "-r", str(root)], check=True, capture_output=True)
    assert "old-format" in _refused(root, libs)
    cache.write_bytes(good)
    conf = root / "etc/ld.so.conf"
    os.rename(conf, root / "etc/ld.so.conf.off")
    assert "no /etc/ld.so.conf" in _refused(root, libs)


def test_refuses_a_dir_ldconfig_does_not_scan(tmp_path):
    root = build_image(tmp_path / "root", hwcaps=False)
    build_lib(root / "usr/lib64", "libcuda.so.1", filename="libcuda.so.535.104.05")
    lib = ldmerge.InjectedLib("/usr/lib64", "libcuda.so.535.104.05", "libcuda.so.1", 0x0303)
    assert "/usr/lib64" in _refused(root, (lib,))


def test_refuses_compat_cache_with_hwcaps(tmp_path):
    root = build_image(tmp_path / "root", hwcaps=True, fmt="compat")
    assert "glibc-hwcaps" in _refused(root, inject(root))


def test_cache_symlink_to_host_file_is_replaced_not_followed(tmp_path):
    """A hostile image's /etc/ld.so.cache -> a host file: read inside the root, replaced by rename."""
    root = build_image(tmp_path / "root", hwcaps=False)
    libs = inject(root)
    victim = tmp_path / "host-file"
    victim.write_bytes((root / "etc/ld.so.cache").read_bytes())
    before = victim.read_bytes()
    os.rename(root / "etc/ld.so.cache", root / "etc/real.cache")
    os.symlink(str(victim), root / "etc/ld.so.cache")  # absolute: inside the root it names /tmp/..., missing
    assert "no ld.so.cache" in _refused(root, libs)
    os.unlink(root / "etc/ld.so.cache")
    os.symlink("real.cache", root / "etc/ld.so.cache")
    with RootFS(str(root)) as rfs:
        cacheupdate.update_container_cache(rfs, libs)
    assert not (root / "etc/ld.so.cache").is_symlink()
    assert victim.read_bytes() == before


def test_preview_tells_plan_whether_merge_applies(tmp_path):
    from pyxis_hook.plan.build import LdcacheUpdate

    root = build_image(tmp_path / "root", hwcaps=False)
    libs = inject(root)
    update = LdcacheUpdate("merge", libs=tuple((x.dir, x.name, x.soname, x.flags) for x in libs))
    before = (root / "etc/ld.so.cache").read_bytes()
    assert cacheupdate.preview(str(root), update) is None
    assert (root / "etc/ld.so.cache").read_bytes() == before  # a look, nothing written
    (root / "etc/ld.so.cache").unlink()
    assert "no ld.so.cache" in cacheupdate.preview(str(root), update)


# --- what the image holds is a CannotMerge (apply then runs ldconfig), or a refusal of ldconfig too ---


@pytest.mark.parametrize("hostile", ["fifo", "device", "include-loop", "loop", "conf-loop"])
def test_hostile_ld_so_conf_is_cannot_merge_or_refused(tmp_path, no_hang, hostile):
    """A looping link ldconfig skips is a CannotMerge; what it would block, spin or open a device on is refused."""
    import stat

    from pyxis_hook.loader.ldconf import UnsafeLoaderConfig

    root = build_image(tmp_path / "root", hwcaps=False)
    libs = inject(root)
    before = (root / "etc/ld.so.cache").read_bytes()
    bad = root / "etc/ld.so.conf.d/zz.conf"
    if hostile == "fifo":
        os.mkfifo(bad)
    elif hostile == "device":
        os.mknod(bad, stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero
    elif hostile == "include-loop":
        bad.write_text("include /etc/ld.so.conf\n")
    elif hostile == "loop":
        bad.symlink_to("zz.conf")
    else:
        (root / "etc/ld.so.conf").unlink()
        (root / "etc/ld.so.conf").symlink_to("ld.so.conf")
    if hostile in ("loop", "conf-loop"):
        msg = _refused(root, libs)
    else:
        with RootFS(str(root)) as rfs, pytest.raises(UnsafeLoaderConfig) as e:
            cacheupdate.update_container_cache(rfs, libs)
        msg = str(e.value)
    assert "\n" not in msg and ("zz.conf" in msg or "ld.so.conf" in msg)
    assert (root / "etc/ld.so.cache").read_bytes() == before


@pytest.mark.parametrize("where", ["key", "value"])
def test_corrupt_new_format_cache_is_cannot_merge(tmp_path, where):
    import struct

    root = build_image(tmp_path / "root", hwcaps=False)
    libs = inject(root)
    data = bytearray((root / "etc/ld.so.cache").read_bytes())
    n = struct.unpack_from("<I", data, 20)[0]
    for i in range(n):  # every string offset past the end of the file
        off = L.NEW_HEADER_SIZE + i * L.NEW_ENTRY_SIZE + (4 if where == "key" else 8)
        struct.pack_into("<I", data, off, len(data) + 100)
    with pytest.raises(ldmerge.CannotMerge):
        ldmerge.merge_cache(bytes(data), (MULTIARCH,), libs, "/etc/ld.so.cache")
    (root / "etc/ld.so.cache").write_bytes(data)
    _refused(root, libs)
