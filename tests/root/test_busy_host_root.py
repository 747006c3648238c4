"""Root tests: Lookups through `..` while the host mounts, unmounts or renames: no open, read or start fails.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/apply/test_busy_host.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import pytest
from fixtures.storm import require_raced, storm
from fixtures.synth import build_lib
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.loader.ldconf import dirs_by_inode, read_ld_so_conf
from pyxis_hook.rootfs import RootFS
from root.test_apply import _container
from root.test_apply_writes import LIBDIR, plan_for
from unit.apply.test_busy_host import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    DEEP,
    KINDS,
    dotdot_image,
)


@pytest.mark.root
@pytest.mark.parametrize("kind", KINDS)
def test_open_through_dotdot_never_fails(tmp_path, dotdot_image, kind):
    paths = ("usr/lib/x86_64-linux-gnu/libimage.so.1", "etc/../etc/ld.so.conf", "etc/ld.so.conf.d/a.conf", DEEP)
    with RootFS(str(dotdot_image), use_openat2=True) as rfs, storm(kind, tmp_path / "storm"):
        for _ in range(2500):
            for p in paths:
                os.close(rfs.open(p, os.O_RDONLY))
        require_raced(rfs.fd, DEEP)


@pytest.mark.root
@pytest.mark.parametrize("kind", KINDS)
def test_ld_so_conf_reads_the_same_image_on_a_busy_host(tmp_path, dotdot_image, kind):
    """The merge's model of the image (includes, dirs by inode) does not depend on the host's activity."""
    with RootFS(str(dotdot_image), use_openat2=True) as rfs:
        quiet = read_ld_so_conf(rfs.path, rfs=rfs)
        assert quiet.dirs == ("/opt/a", "/opt/b", LIBDIR) and not quiet.truncated
        ids = dirs_by_inode(rfs, quiet.dirs)
        with storm(kind, tmp_path / "storm"):
            for _ in range(200):
                assert read_ld_so_conf(rfs.path, rfs=rfs) == quiet
                assert dirs_by_inode(rfs, quiet.dirs) == ids
            require_raced(rfs.fd, DEEP)


@pytest.mark.root
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_starts_on_a_busy_host(tmp_path, dotdot_image, kind):
    """Container starts (binds, links, the cache merge) into an image whose lib dir is `../lib64`."""
    host = tmp_path / "host"
    for name, soname in (("libcuda.so.535.104.05", "libcuda.so.1"),
                         ("libnvidia-ml.so.535.104.05", "libnvidia-ml.so.1")):
        build_lib(host, soname, filename=name)
    plan = plan_for(host, dotdot_image, "merge")
    with storm(kind, tmp_path / "storm"):
        for _ in range(20):
            p = _container(dotdot_image)
            try:
                res = apply_plan(plan, p.pid)
            finally:
                p.kill()
                p.wait()
            assert any("ld.so.cache: merged" in m for m in res.messages), res.messages
        with RootFS(str(dotdot_image)) as rfs:
            require_raced(rfs.fd, DEEP)
