"""CUDA forward compat in the merged cache == glibc's ldconfig with `00-compat-*.conf` listing the dir first.

The image (test_ldmerge_oracle's Debian-like image, its cache built by
ldconfig) gets a CUDA-image-like /usr/local/cuda/compat with a newer
libcuda; the driver libraries are injected as the hook does.  The plan is
built by `plan.ldcache_update(..., compat=True)` from `container_facts`, the
merge runs through `cacheupdate.libs_from_plan` exactly as apply calls it, and:

* `ldconfig -p -C` of our cache equals glibc's over the same tree with
  `/etc/ld.so.conf.d/00-compat-<id>.conf` (NVIDIA's hook) — and equals the
  cache of glibc's ldconfig run with the plan's `lib_dirs` on its command
  line (`confined.ldconfig_argv`: the confined run);
* `ld.so --list` inside the rootfs resolves `libcuda.so.1` to the compat copy.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fixtures.synth import build_exe, build_lib
from oracles.test_ldmerge_oracle import LDCONFIG, MULTIARCH, SONAMES, build_image, inject, ld_list, p
from pyxis_hook.apply import confined
from pyxis_hook.apply import cacheupdate
from pyxis_hook.loader import ldmerge
from pyxis_hook.spec.config import Config
from pyxis_hook.plan.container import container_facts
from pyxis_hook.plan.build import COMPAT_DIR, ldcache_update
from pyxis_hook.rootfs import RootFS

pytestmark = [pytest.mark.root, pytest.mark.skipif(not os.path.exists(LDCONFIG), reason="no glibc ldconfig")]

VERSION = "999.10.01"


def add_compat(root: Path, *, link: bool = True) -> Path:
    d = root / COMPAT_DIR.lstrip("/")
    build_lib(d, "libcuda.so.1", filename=f"libcuda.so.{VERSION}")
    build_lib(d, "libnvidia-ptxjitcompiler.so.1", filename=f"libnvidia-ptxjitcompiler.so.{VERSION}")
    build_lib(d, "libnvidia-nvvm.so.4", filename=f"libnvidia-nvvm.so.{VERSION}")
    if link:
        os.symlink(f"libcuda.so.{VERSION}", d / "libcuda.so.1")
    os.symlink("libcuda.so.1", d / "libcuda.so")
    os.symlink(f"libnvidia-ptxjitcompiler.so.{VERSION}", d / "libnvidia-ptxjitcompiler.so.1")
    os.symlink(f"libnvidia-nvvm.so.{VERSION}", d / "libnvidia-nvvm.so.4")
    return d


def planned(root: Path, libs, fmt_config: str = "merge"):
    facts = container_facts(str(root), machine="x86_64")
    assert facts.compat_libcuda == f"libcuda.so.{VERSION}" and not facts.compat_problem
    rows = tuple((x.dir, x.name, x.soname, x.flags) for x in libs)
    update, problems = ldcache_update(Config(ldcache=fmt_config), facts, (MULTIARCH,), rows, compat=True)
    assert not problems
    return update


def glibc_cache(root: Path, name: str, *args: str, conf: bool = False, fmt: str = "new") -> Path:
    extra = root / "etc/ld.so.conf.d/00-compat-pyxis.conf"
    if conf:
        extra.write_text(COMPAT_DIR + "\n")
    try:
        subprocess.run([LDCONFIG, "-c", fmt, "-r", str(root), "-C", f"/etc/{name}", *args], check=True,
                       capture_output=True)
    finally:
        if conf:
            extra.unlink()
    return root / "etc" / name


@pytest.mark.parametrize("fmt", ["new", "compat"])
def test_compat_first_like_glibc(tmp_path, fmt):
    root = build_image(tmp_path / "root", hwcaps=fmt == "new", fmt=fmt)
    add_compat(root)
    libs = inject(root)
    update = planned(root, libs)
    assert update.mode == "merge" and update.first_dirs == (COMPAT_DIR,)
    assert update.lib_dirs == (COMPAT_DIR, MULTIARCH)
    with RootFS(str(root)) as rfs:
        msg = cacheupdate.update_container_cache(rfs, cacheupdate.libs_from_plan(update))  # apply's call, unchanged
    assert "merged" in msg
    ours = p(root / "etc/ld.so.cache")
    assert ours == p(glibc_cache(root, "c.conf", conf=True, fmt=fmt))
    # the compat dir first on ldconfig's command line is the same as the conf file
    assert ours == p(glibc_cache(root, "c.cmdline", COMPAT_DIR, fmt=fmt))
    # the confined run's command line (the plan's lib_dirs, in order) lists compat's libcuda first too
    # (the injected dir on a command line is named as given, not by its first ld.so.conf name: not compared)
    argv = confined.ldconfig_argv(update.lib_dirs)
    assert argv[-2:] == [COMPAT_DIR, MULTIARCH]
    confined_run = p(glibc_cache(root, "c.confined", *argv[5:], fmt=fmt))
    assert [x for x in confined_run if x.startswith("\tlibcuda.so.1 ")] == [
        "\tlibcuda.so.1 (libc6,x86-64) => /usr/local/cuda/compat/libcuda.so.1",
        "\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1"]
    cuda = [line for line in ours if line.startswith("\tlibcuda.so.1 ")]
    assert cuda == ["\tlibcuda.so.1 (libc6,x86-64) => /usr/local/cuda/compat/libcuda.so.1",
                    "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1"]
    # the loader, chrooted into the image: compat's libcuda, the driver's NVML
    build_exe(root / "usr/bin", "needs-injected", needed=SONAMES + ("libnvidia-ptxjitcompiler.so.1",))
    resolved = ld_list(root, "/usr/bin/needs-injected")
    assert resolved["libcuda.so.1"] == "/usr/local/cuda/compat/libcuda.so.1"
    assert resolved["libnvidia-ptxjitcompiler.so.1"] == "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.1"
    assert resolved["libnvidia-ml.so.1"] == "/lib/x86_64-linux-gnu/libnvidia-ml.so.1"


def test_without_compat_the_driver_wins(tmp_path):
    """The same image planned without compat (older compat, disabled...): the cache never lists the dir."""
    root = build_image(tmp_path / "root", hwcaps=False)
    add_compat(root)
    libs = inject(root)
    facts = container_facts(str(root), machine="x86_64")
    rows = tuple((x.dir, x.name, x.soname, x.flags) for x in libs)
    update, _ = ldcache_update(Config(), facts, (MULTIARCH,), rows, compat=False)
    assert update.first_dirs == () and update.lib_dirs == (MULTIARCH,)
    with RootFS(str(root)) as rfs:
        cacheupdate.update_container_cache(rfs, cacheupdate.libs_from_plan(update))
    assert not any(COMPAT_DIR in line for line in p(root / "etc/ld.so.cache"))
    build_exe(root / "usr/bin", "needs-injected", needed=SONAMES)
    assert ld_list(root, "/usr/bin/needs-injected")["libcuda.so.1"] == "/lib/x86_64-linux-gnu/libcuda.so.1"


def test_missing_soname_link_is_cannot_merge_and_ldconfig_makes_it(tmp_path):
    """ldconfig would create compat/libcuda.so.1; the merge does not write into the image's dir: fallback."""
    root = build_image(tmp_path / "root", hwcaps=False)
    add_compat(root, link=False)
    libs = inject(root)
    update = planned(root, libs)
    before = (root / "etc/ld.so.cache").read_bytes()
    with RootFS(str(root)) as rfs:
        with pytest.raises(ldmerge.CannotMerge, match="libcuda.so.1"):
            cacheupdate.update_container_cache(rfs, cacheupdate.libs_from_plan(update))
    assert (root / "etc/ld.so.cache").read_bytes() == before
    assert "libcuda.so.1" in cacheupdate.preview(str(root), update)
    # what the fallback runs: the plan's lib_dirs, compat first, make the link and the same order
    subprocess.run([LDCONFIG, "-r", str(root), *update.lib_dirs], check=True, capture_output=True)
    assert os.readlink(root / COMPAT_DIR.lstrip("/") / "libcuda.so.1") == f"libcuda.so.{VERSION}"
    build_exe(root / "usr/bin", "needs-injected", needed=SONAMES)
    assert ld_list(root, "/usr/bin/needs-injected")["libcuda.so.1"] == "/usr/local/cuda/compat/libcuda.so.1"


def test_compat_dir_already_configured_later_is_cannot_merge(tmp_path):
    """The image lists the compat dir after its lib dirs: its cache order contradicts compat-first."""
    root = build_image(tmp_path / "root", hwcaps=False)
    add_compat(root)
    (root / "etc/ld.so.conf.d/zz-cuda-compat.conf").write_text(COMPAT_DIR + "\n")
    build_lib(root / MULTIARCH.lstrip("/"), "libnvidia-nvvm.so.4", filename="libnvidia-nvvm.so.4.0")
    subprocess.run([LDCONFIG, "-r", str(root)], check=True, capture_output=True)
    libs = inject(root)
    update = planned(root, libs)
    with RootFS(str(root)) as rfs:
        with pytest.raises(ldmerge.CannotMerge, match="scan order"):
            cacheupdate.update_container_cache(rfs, cacheupdate.libs_from_plan(update))
