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


def _image_with_links_through_proc(root):
    """An image whose CUDA dir and Debian marker are links through /proc/self/root.

    The image's own /proc holds `self/root -> /` (as a layer could): read
    through /proc, both name real things of the image; the confined ldconfig,
    whose /proc is masked, sees neither.
    """
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/root").symlink_to("/")
    (root / "sys").mkdir()
    (root / "opt/compat/glibc-hwcaps").mkdir(parents=True)
    (root / "usr/local").mkdir(parents=True)
    (root / "usr/local/cuda").symlink_to("/proc/self/root/opt")
    (root / "etc").mkdir()
    (root / "etc/dv").write_text("12\n")
    (root / "etc/debian_version").symlink_to("/proc/self/root/etc/dv")
    (root / "etc/ld.so.conf").symlink_to("../sys/ld.so.conf")
    (root / "sys/ld.so.conf").write_text("/opt\n")


def test_facts_read_through_proc_or_sys_are_missing(tmp_path):
    """The image is read as the confined ldconfig sees it: what only /proc or /sys reach is not there."""
    from pyxis_hook.rootfs import RootFS

    _image_with_links_through_proc(tmp_path)
    with RootFS(str(tmp_path)) as r:  # without hiding, the links name real things
        assert r.exists("/usr/local/cuda/compat") and r.exists("/etc/debian_version") and r.exists("/etc/ld.so.conf")
    facts = container_facts(str(tmp_path))
    assert (facts.lib_dir, facts.has_ld_so_conf) == ("/usr/lib64", False)
    assert (facts.compat_libcuda, facts.compat_libs, facts.compat_problem) == ("", (), "")
    (tmp_path / "usr/lib/x86_64-linux-gnu").mkdir(parents=True)
    (tmp_path / "usr/lib/x86_64-linux-gnu/libcuda.so.1").write_bytes(b"the image's")
    (tmp_path / "usr/lib64").symlink_to("/proc/self/root/usr/lib/x86_64-linux-gnu")
    assert link_occupants(str(tmp_path), ["/usr/lib64/libcuda.so.1", f"{LIB}/libcuda.so.1"]) == (
        (f"{LIB}/libcuda.so.1", "regular file"),)


def test_a_link_through_another_namespaces_proc_self_is_no_internal_error(tmp_path, monkeypatch):
    """The container's procfs is mounted at the image's /proc: readlink of its `self` fails with ENOENT for
    the hook (another PID namespace).  The start ignores the link instead of ending in an OSError."""
    import errno
    import posix

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/self").symlink_to("1")
    (tmp_path / "opt/compat").mkdir(parents=True)
    (tmp_path / "usr/local").mkdir(parents=True)
    (tmp_path / "usr/local/cuda").symlink_to("/proc/self/root/opt")
    real = posix.readlink

    def readlink(path, *args, **kw):
        if os.fsdecode(path) == "self" or os.fsdecode(path).endswith("/proc/self"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return real(path, *args, **kw)

    monkeypatch.setattr(posix, "readlink", readlink)
    facts = container_facts(str(tmp_path))
    assert (facts.compat_libcuda, facts.compat_problem, facts.lib_dir) == ("", "", "/usr/lib64")


def test_lib32_goes_to_usr_lib_unless_lib64_is_the_same_dir(tmp_path):
    for name, build, want in (
        ("apart", lambda r: ((r / "usr/lib").mkdir(parents=True), (r / "usr/lib64").mkdir()), "/usr/lib"),
        ("linked", lambda r: ((r / "usr/lib").mkdir(parents=True), (r / "usr/lib64").symlink_to("lib")), ""),
        ("lib32", lambda r: ((r / "usr/lib32").mkdir(parents=True), (r / "usr/lib64").mkdir()), "/usr/lib32"),
        ("none", lambda r: r.mkdir(), "/usr/lib"),
    ):
        root = tmp_path / name
        build(root)
        assert container_facts(str(root)).lib32_dir == want, name


def test_a_missing_rootfs_holds_nothing(tmp_path):
    facts = container_facts(str(tmp_path / "gone"))
    assert (facts.lib_dir, facts.has_ld_so_conf, facts.compat_problem) == ("/usr/lib64", False, "")
