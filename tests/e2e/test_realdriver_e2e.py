"""The hook with the REAL NVIDIA user-space driver (Debian's 535 and tesla-470 packages), with runc.

Inside the container the real libraries answer as on a GPU node whose
kernel module is not loaded: cuDriverGetVersion = 12020 (535) / 11040 (470),
cuInit = 100, nvmlInit_v2 = 9, nvidia-smi exits 9.
"""

from __future__ import annotations

import os
import re

import pytest

from e2e.conftest import bundle_for, make_host, mount_table, run_container
from fixtures.realdriver import BIN_DIRS, driver_version, require_driver_root

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver]

SCRIPT = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; /usr/bin/gputest; "
          "ldconfig -p | grep -E 'libcuda.so.1|libnvidia-ml.so.1' | sort; "
          "nvidia-smi; echo smi-rc=$?")


@pytest.mark.parametrize("line, layout, cuda", [
    ("535", "debian", 12020),
    ("535", "installer", 12020),
    ("535", "rhel", 12020),
    ("535", "prefix", 12020),
    ("470", "debian", 11040),
])
def test_real_driver_in_runc(tmp_path, line, layout, cuda):
    root = require_driver_root(line, layout)
    host = make_host(tmp_path, driver_root=root)
    host.write_conf(path=list(BIN_DIRS[layout]))  # a site with a prefix install names its bin dir
    # the fake host's procfs must report the same driver as the files
    version = driver_version(line)
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n"
                "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=1",), SCRIPT)
    before = mount_table()
    r = run_container("runc", bundle, f"pyxis-real-{line}-{layout}-{os.getpid()}")
    assert mount_table() == before
    assert r.rc == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"]
    assert f"cuDriverGetVersion={cuda} rc=0" in r.stdout, r.stdout
    assert "cuInit=100" in r.stdout
    assert "nvmlInit_v2=9" in r.stdout
    # /lib is a link to usr/lib in the image: glibc's ldconfig records the first name it scans
    assert re.search(r"\tlibcuda\.so\.1 \(libc6,x86-64\) => (/usr)?/lib/x86_64-linux-gnu/libcuda\.so\.1\n", r.stdout)
    assert "couldn't communicate with the NVIDIA driver" in r.stdout and "smi-rc=9" in r.stdout


def test_real_driver_all_capabilities(tmp_path):
    """`all`: graphics (GLX/EGL and the internal libraries only DT_NEEDED names), video, compat32 i386 libs."""
    root = require_driver_root("535", "debian")
    host = make_host(tmp_path, driver_root=root)
    version = driver_version("535")
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n")
    script = "ldconfig -p | sort; ls /usr/lib/i386-linux-gnu; ls /dev | grep nvidia | tr '\\n' ' '"
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=all"), script)
    r = run_container("runc", bundle, f"pyxis-real-all-{os.getpid()}")
    assert r.rc == 0, r.stderr
    out = r.stdout
    for soname in ("libGLX_nvidia.so.0", "libEGL_nvidia.so.0", "libnvcuvid.so.1", "libnvidia-encode.so.1",
                   "libcuda.so.1", "libnvidia-ml.so.1"):
        assert f"\t{soname} (libc6,x86-64)" in out, soname
    # internal libraries reached only through DT_NEEDED of libGLX_nvidia
    for stem in ("libnvidia-glcore.so", "libnvidia-tls.so", "libnvidia-glsi.so"):
        assert f"\t{stem}.{version} (libc6,x86-64)" in out, stem
    # compat32: the i386 libraries land in the Debian i386 dir
    assert f"\nlibcuda.so.{version}\n" in out  # `ls /usr/lib/i386-linux-gnu`
    assert "\tlibcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1" in out
    assert "nvidia-modeset" in out  # display


def test_real_driver_unpacked_without_ld_so_cache(tmp_path):
    """driver-root = `dpkg -x` of the 535 packages (no ld.so.cache, no alternatives): the container still works."""
    from fixtures.realdriver import extract

    root = extract("535")
    host = make_host(tmp_path, driver_root=root)
    version = driver_version("535")
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n")
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest; nvidia-smi; echo smi-rc=$?")
    r = run_container("runc", bundle, f"pyxis-real-unpacked-{os.getpid()}")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout and "nvmlInit_v2=9" in r.stdout
    assert "smi-rc=9" in r.stdout  # found in /usr/lib/nvidia/current, mounted at /usr/bin
