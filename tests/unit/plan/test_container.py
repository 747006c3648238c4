"""container.link_occupants: what an image holds where the hook puts a driver library's links.

Read through RootFS fds: a symlinked directory is followed inside the rootfs
(never out of it) and the name itself is never followed or opened.
"""

from __future__ import annotations

import os

from pyxis_hook.plan.container import container_facts, link_occupants
from pyxis_hook.host.inventory import DriverFile

LIB = "/usr/lib/x86_64-linux-gnu"


def test_each_kind_of_occupant(tmp_path):
    d = tmp_path / LIB.lstrip("/")
    d.mkdir(parents=True)
    (d / "libnvidia-ml.so.1").write_bytes(b"the image's copy")
    (d / "libcuda.so.1").symlink_to("libcuda.so.470.256.02")  # a link: the hook replaces it
    (d / "libcuda.so").mkdir()
    os.mkfifo(d / "libnvidia-cfg.so.1")  # never opened: a FIFO would block a reader
    paths = [f"{LIB}/{n}" for n in ("libnvidia-ml.so.1", "libcuda.so.1", "libcuda.so", "libnvidia-cfg.so.1",
                                    "libnvcuvid.so.1")] + ["/usr/lib/i386-linux-gnu/libcuda.so.1"]
    assert link_occupants(str(tmp_path), paths) == (
        (f"{LIB}/libnvidia-ml.so.1", "regular file"), (f"{LIB}/libcuda.so", "directory"),
        (f"{LIB}/libnvidia-cfg.so.1", "special file"))


def test_a_symlinked_lib_dir_is_followed_inside_the_rootfs(tmp_path):
    """`/usr/lib/x86_64-linux-gnu -> /opt/multiarch` (absolute) names the image's /opt, not the host's."""
    root = tmp_path / "rootfs"
    (root / "opt/multiarch").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    (root / LIB.lstrip("/")).symlink_to("/opt/multiarch")
    (root / "opt/multiarch/libnvidia-ml.so.1").write_bytes(b"the image's copy")
    # a link out of the rootfs is resolved inside it: here it names nothing
    (root / "usr/lib/i386-linux-gnu").symlink_to("../../../outside")
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside/libcuda.so.1").write_bytes(b"a host file")
    paths = (f"{LIB}/libnvidia-ml.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1")
    assert link_occupants(str(root), paths) == ((f"{LIB}/libnvidia-ml.so.1", "regular file"),)


def test_container_facts_look_at_the_links_of_the_files_given(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/debian_version").write_text("12\n")
    (tmp_path / LIB.lstrip("/")).mkdir(parents=True)
    (tmp_path / LIB.lstrip("/") / "libnvidia-ml.so.1").write_bytes(b"the image's copy")
    nvml = DriverFile("lib", "utility", "/d/libnvidia-ml.so.535.1", "/d/libnvidia-ml.so.535.1",
                      "libnvidia-ml.so.535.1", "libnvidia-ml.so.1", 64,
                      links=(("libnvidia-ml.so.1", "libnvidia-ml.so.535.1"), ("libnvidia-ml.so", "libnvidia-ml.so.1")))
    assert container_facts(str(tmp_path)).link_occupants == ()
    facts = container_facts(str(tmp_path), files=(nvml,))
    assert facts.link_occupants == ((f"{LIB}/libnvidia-ml.so.1", "regular file"),)


def test_the_compat_reader_is_loaded_only_for_an_image_with_a_compat_dir(tmp_path):
    """A start for an image without /usr/local/cuda/compat does not execute the ELF reader's module."""
    import subprocess
    import sys

    (tmp_path / "plain/etc").mkdir(parents=True)
    (tmp_path / "cuda/usr/local/cuda/compat").mkdir(parents=True)
    code = ("import sys; from pyxis_hook.plan.container import container_facts; "
            "facts = container_facts(sys.argv[1]); "
            "print(facts.compat_problem == '', 'pyxis_hook.plan.compat' in sys.modules)")
    out = [subprocess.run([sys.executable, "-c", code, str(tmp_path / name)], capture_output=True, text=True,
                          check=True).stdout.split() for name in ("plain", "cuda")]
    assert out == [["True", "False"], ["True", "True"]]
