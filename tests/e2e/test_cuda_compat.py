"""CUDA forward compat end to end with runc: an image with a newer compat libcuda loads it.

The fake driver's libcuda answers cuDriverGetVersion=12020; the image's
/usr/local/cuda/compat carries a fake forward-compat libcuda of driver
999.10.01 that answers 12080.  After the hook, the image's own `gputest`
(linked against libcuda.so.1) must print 12080 in both ldcache modes, and
12020 with `cuda-compat = "disabled"` or without the compute capability.
"""

from __future__ import annotations

import os
import shutil

import pytest

from e2e.conftest import bundle_for, mount_table, run_container
from fixtures.fakedriver import CUDA_C, _lib

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(not shutil.which("runc"), reason="no runc")]

COMPAT = "usr/local/cuda/compat"
PROBE = "/usr/bin/gputest; ldconfig -p | grep 'libcuda.so.1 '"


def _with_compat(tmp_path, host, env, *, link: bool = True):
    bundle = bundle_for(tmp_path, host, env, PROBE)
    d = bundle / "rootfs" / COMPAT
    d.mkdir(parents=True)
    built = _lib(CUDA_C % {"cuda": 12080}, "libcuda.so.1", "libcuda.so.999.10.01")
    (d / "libcuda.so.999.10.01").write_bytes(built.read_bytes())
    if link:
        os.symlink("libcuda.so.999.10.01", d / "libcuda.so.1")
    return bundle


def _run(bundle, tmp_path):
    before = mount_table()
    r = run_container("runc", bundle, f"pyxis-compat-{os.getpid()}-{tmp_path.name[-12:]}")
    assert mount_table() == before
    return r


@pytest.mark.parametrize("ldcache,link", [("merge", True), ("merge", False), ("ldconfig", True)])
def test_newer_compat_libcuda_is_loaded(tmp_path, host, ldcache, link):
    """merge without the SONAME link: the merge refuses, the confined ldconfig makes it (logged)."""
    host.write_conf(ldcache=ldcache)
    r = _run(_with_compat(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), link=link), tmp_path)
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12080" in r.stdout, r.stdout
    lines = [x for x in r.stdout.splitlines() if "libcuda.so.1 " in x]
    assert lines[0].endswith("=> /usr/local/cuda/compat/libcuda.so.1"), lines
    assert any("/usr/lib/x86_64-linux-gnu/libcuda.so.1" in x or "/lib/x86_64-linux-gnu/libcuda.so.1" in x
               for x in lines[1:]), lines
    log = (host.base / "hook.log").read_text()
    if ldcache == "merge" and not link:
        assert "merge cannot model this image" in log and "libcuda.so.1" in log


@pytest.mark.parametrize("how", ["disabled", "no-compute"])
def test_compat_left_out(tmp_path, host, how):
    env = ("NVIDIA_VISIBLE_DEVICES=0",)
    if how == "disabled":
        host.write_conf(cuda_compat="disabled")
    else:
        env += ("NVIDIA_DRIVER_CAPABILITIES=utility",)
    r = _run(_with_compat(tmp_path, host, env), tmp_path)
    assert "/usr/local/cuda/compat" not in r.stdout, r.stdout
    if how == "disabled":
        assert r.rc == 0, r.stderr
        assert "cuDriverGetVersion=12020" in r.stdout, r.stdout
    else:  # no libcuda injected, and the image's compat copy not put in the cache either
        assert "libcuda.so.1: cannot open shared object file" in r.stdout, r.stdout
