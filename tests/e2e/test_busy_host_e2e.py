"""Container starts with real runc while the host mounts and unmounts: none fails.

The load case of many starts on one node: every start's lookups through
`..` (here the image's multiarch lib dir is the relative link `../lib64`)
race the mounts of other starts; openat2 then answers EAGAIN and the hook
retries (lookup.OPENAT2_TRIES).  Before, some starts failed with "Resource
temporarily unavailable" (7 of 60 in a mount storm).
"""

from __future__ import annotations

import os
import subprocess

import pytest

from e2e.conftest import bundle_for, make_host, run_container
from fixtures.storm import require_raced, storm
from pyxis_hook.rootfs import RootFS

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow]

STARTS = 20


def test_runc_starts_on_a_busy_host(tmp_path):
    host = make_host(tmp_path)
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    rootfs = bundle / "rootfs"
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    libdir.rename(rootfs / "usr/lib64")
    libdir.symlink_to("../lib64")
    subprocess.run(["ldconfig", "-r", str(rootfs)], check=True)
    with storm("mount", tmp_path / "storm"):
        results = [run_container("runc", bundle, f"pyxis-busy-{os.getpid()}-{i}") for i in range(STARTS)]
        with RootFS(str(rootfs)) as rfs:
            require_raced(rfs.fd, "usr/lib/x86_64-linux-gnu/../../../../etc/ld.so.conf")
    failed = [r for r in results if r.rc != 0 or "cuDriverGetVersion=12020" not in r.stdout]
    assert not failed, f"{len(failed)} of {STARTS} starts failed; first: {failed[0].stderr}"
