"""Root tests: host/cgroup.py: layout detection, devices path, v1 rules, Slurm step detection.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/host/test_cgroup.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
import pytest
from pyxis_hook.host.cgroup import gpu_minors_allowed, read_devices_cgroup
from unit.host.test_cgroup import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _v1_devices_mount,
)


@pytest.mark.root
def test_real_v1_devices_cgroup(tmp_path):
    mount = _v1_devices_mount()
    if mount is None:
        from fixtures.realdriver import in_ci

        if in_ci():  # CI's machines have the hybrid v1 layout: its absence is a failure
            pytest.fail("no v1 devices hierarchy on this machine")
        pytest.skip("no v1 devices hierarchy on this machine")
    cg = Path(mount) / f"pyxis-hook-test-{os.getpid()}"
    cg.mkdir()
    child = None
    try:
        (cg / "devices.deny").write_text("a")
        (cg / "devices.allow").write_text("c 195:1 rw")
        (cg / "devices.allow").write_text("c 195:3 r")
        child = subprocess.Popen(["sleep", "60"])
        (cg / "cgroup.procs").write_text(str(child.pid))
        assert gpu_minors_allowed("/proc", child.pid, range(4)) == frozenset({1})
        dc = read_devices_cgroup("/proc", child.pid)
        assert dc.controller == "v1" and dc.fs_path == str(cg)
        # the kernel agrees: opening an allowed node without a driver gives ENXIO, a denied one EPERM
        for minor in range(4):
            os.mknod(tmp_path / f"nvidia{minor}", 0o666 | stat.S_IFCHR, os.makedev(195, minor))
        probe = ("import errno, os, sys\n"
                 "for m in range(4):\n"
                 "    try:\n"
                 "        os.close(os.open(sys.argv[1] + f'/nvidia{m}', os.O_RDWR))\n"
                 "        print(m, 'OK')\n"
                 "    except OSError as e:\n"
                 "        print(m, errno.errorcode[e.errno])\n")
        out = subprocess.run(["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$0" -c "$1" "$2"',
                              sys.executable, probe, str(tmp_path)],
                             capture_output=True, text=True, check=True).stdout.split("\n")
        kernel_allowed = {int(line.split()[0]) for line in out if line.endswith("ENXIO")}
        assert kernel_allowed == {1}
        assert {int(line.split()[0]) for line in out if line.endswith("EPERM")} == {0, 2, 3}
    finally:
        if child is not None:
            child.kill()
            child.wait()
        cg.rmdir()
