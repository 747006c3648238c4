"""The hook with the REAL NVIDIA user-space driver (Debian 12's 535 and tesla-470, Debian 13's 550), with runc.

Inside the container the real libraries answer as on a GPU node whose
kernel module is not loaded: cuDriverGetVersion = 12020 (535) / 11040 (470) /
12040 (550), cuInit = 100, nvmlInit_v2 = 9, nvidia-smi exits 9.
"""

from __future__ import annotations

import os
import re

import pytest

from e2e.conftest import bundle_for, make_host, mount_table, run_container
from fixtures.realdriver import CUDA_VERSION, driver_version, require_driver_root
from fixtures.synth import build_exe

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver]

SCRIPT = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; /usr/bin/gputest; "
          "ldconfig -p | grep -E 'libcuda.so.1|libnvidia-ml.so.1' | sort; "
          "command -v nvidia-smi; nvidia-smi; echo smi-rc=$?")


@pytest.mark.parametrize("line, layout, cuda", [
    ("535", "debian", 12020),
    ("535", "installer", 12020),
    ("535", "rhel", 12020),
    ("535", "prefix", 12020),
    ("470", "debian", 11040),
    ("470", "prefix", 11040),
    ("550", "debian", 12040),
    ("550", "installer", 12040),
    ("550", "rhel", 12040),
    ("550", "prefix", 12040),
])
def test_real_driver_in_runc(tmp_path, line, layout, cuda):
    root = require_driver_root(line, layout)
    host = make_host(tmp_path, driver_root=root)  # default `path`: a prefix install's bin dir is not on it
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
    # whatever the host dir (/usr/local/nvidia/bin for a prefix), nvidia-smi is on the container's PATH
    assert "\n/usr/bin/nvidia-smi\n" in r.stdout, r.stdout
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


@pytest.mark.parametrize("line", ["535", "550"])
def test_real_driver_unpacked_without_ld_so_cache(tmp_path, line):
    """driver-root = `dpkg -x` of the packages (no ld.so.cache, no alternatives, 550: no /lib link): still works."""
    from fixtures.realdriver import extract

    require_driver_root(line, "debian")  # downloads, or fails in CI / skips elsewhere
    root = extract(line)
    host = make_host(tmp_path, driver_root=root)
    version = driver_version(line)
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n")
    script = f"/usr/bin/gputest; nvidia-smi; echo smi-rc=$?; ls /usr/lib/firmware/nvidia/{version} /lib/firmware/nvidia/{version}"
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), script)
    r = run_container("runc", bundle, f"pyxis-real-unpacked-{line}-{os.getpid()}")
    assert r.rc == 0, r.stderr
    assert f"cuDriverGetVersion={CUDA_VERSION[line]} rc=0" in r.stdout and "nvmlInit_v2=9" in r.stdout
    assert "smi-rc=9" in r.stdout  # found in /usr/lib/nvidia/current, mounted at /usr/bin
    assert "gsp_ga10x.bin" in r.stdout  # the image's /lib is a link to usr/lib: both names show it


DLOPEN_C = r"""
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        void *h = dlopen(argv[i], RTLD_NOW);
        if (h) printf("dlopen %s: ok\n", argv[i]); else printf("dlopen %s: %s\n", argv[i], dlerror());
    }
    return 0;
}
"""


@pytest.mark.parametrize("layout", ["debian", "installer"])
def test_550_graphics_only_loads_glcore_and_eglcore(tmp_path, layout):
    """NVIDIA_DRIVER_CAPABILITIES=graphics: libnvidia-glcore/-eglcore load, so libnvidia-gpucomp (a compute-list
    library they need since 545) came with graphics; libcuda did not."""
    root = require_driver_root("550", layout)
    host = make_host(tmp_path, driver_root=root)
    version = driver_version("550")
    with open(os.path.join(host.proc_root, "driver/nvidia/version"), "w") as f:
        f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n")
    libs = " ".join(f"{stem}.{version}" for stem in ("libnvidia-glcore.so", "libnvidia-eglcore.so"))
    script = f"/usr/bin/dlopentest {libs} libcuda.so.1; ldconfig -p | grep -c gpucomp"
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DRIVER_CAPABILITIES=graphics"), script)
    build_exe(bundle / "rootfs/usr/bin", "dlopentest", source=DLOPEN_C)
    r = run_container("runc", bundle, f"pyxis-real-550-graphics-{layout}-{os.getpid()}")
    assert r.rc == 0, r.stderr
    for lib in libs.split():
        assert f"dlopen {lib}: ok" in r.stdout, r.stdout
    assert "dlopen libcuda.so.1: libcuda.so.1: cannot open shared object file" in r.stdout, r.stdout
