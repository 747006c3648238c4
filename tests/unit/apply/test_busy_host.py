"""Lookups through `..` while the host mounts, unmounts or renames: no open, read or start fails.

openat2(RESOLVE_IN_ROOT) answers EAGAIN when a mount, unmount or rename
anywhere on the system races a `..` step ("the caller may choose to
retry", openat2(2)); `lookup.openat2` retries, boundedly.  Images reach
`..` all the time: a lib dir that is a relative link (`usr/lib64 ->
../lib64`), an `include ../x` in ld.so.conf.  Each test shows that nothing
the hook does fails or sees a different image while the storm runs, and
that the storm was felt (a single openat2 call got EAGAIN); where it cannot
be (no CPU free to run it alongside), the test is skipped.
"""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
from pathlib import Path

import pytest

from fixtures.synth import build_lib
from pyxis_hook.kernel import lookup, syscall
from pyxis_hook.loader.ldconf import dirs_by_inode, read_ld_so_conf
from pyxis_hook.rootfs import RootFS, RootPathError
from root.test_apply_writes import LIBDIR

KINDS = ["mount", "rename"]
#: a path with a long walk before its last `..` steps: the one the storm check races
DEEP = "usr/lib/x86_64-linux-gnu/../../../../etc/ld.so.conf"


@pytest.fixture
def dotdot_image(tmp_path) -> Path:
    """An image whose paths cross `..`: its multiarch lib dir and conf dir are relative links, and
    ld.so.conf includes `../opt/more/*.conf`."""
    root = tmp_path / "image"
    for d in ("etc", "usr/lib64", "usr/share/ldconf", "opt/more", "opt/a", "opt/b"):
        (root / d).mkdir(parents=True)
    (root / "usr/lib").mkdir()
    os.symlink("../lib64", root / "usr/lib/x86_64-linux-gnu")
    os.symlink("../usr/share/ldconf", root / "etc/ld.so.conf.d")
    (root / "usr/share/ldconf/a.conf").write_text("/opt/a\n")
    (root / "opt/more/b.conf").write_text("/opt/b\n")
    (root / "etc/ld.so.conf").write_text(f"include /etc/ld.so.conf.d/*.conf\ninclude ../opt/more/*.conf\n{LIBDIR}\n")
    build_lib(root / "usr/lib64", "libimage.so.1", filename="libimage.so.1.0")
    subprocess.run(["ldconfig", "-r", str(root)], check=True)
    return root


def test_a_race_that_never_ends_falls_back_to_the_walk(tmp_path, monkeypatch):
    """After lookup.OPENAT2_TRIES answers of EAGAIN, RootFS walks the path itself: the answer a quiet
    host gives (the file, or a true 'no such file'), never an error made by the race."""
    calls = []
    real = syscall.call

    def always_eagain(name, *args):
        calls.append(name)
        if name == "openat2":
            ctypes.set_errno(errno.EAGAIN)
            return -1
        return real(name, *args)

    (tmp_path / "a").mkdir()
    (tmp_path / "b").write_text("b\n")
    with RootFS(str(tmp_path), use_openat2=True) as rfs:
        monkeypatch.setattr(syscall, "call", always_eagain)
        fd = rfs.open("a/../../../b", os.O_RDONLY)  # `..` at the root stays there, as chroot does
        try:
            assert os.read(fd, 10) == b"b\n"
        finally:
            os.close(fd)
        assert calls.count("openat2") == lookup.OPENAT2_TRIES
        with pytest.raises(RootPathError) as e:
            rfs.open("a/../missing", os.O_RDONLY)
    assert e.value.errno == errno.ENOENT


def test_a_race_that_never_ends_leaves_the_ld_so_conf_unread(dotdot_image, monkeypatch):
    """An endless race changes nothing the reader sees: it walks `..` one component at a time itself
    (no openat2 lookup to race), so the tree reads as on a quiet host; and a configured dir whose
    openat2 lookup stays EAGAIN is found by RootFS's own walk, the same directory as on a quiet host."""
    real = syscall.call

    def eagain_through_dotdot(name, *args):
        if name == "openat2" and b".." in args[1].value:
            ctypes.set_errno(errno.EAGAIN)
            return -1
        return real(name, *args)

    with RootFS(str(dotdot_image), use_openat2=True) as rfs:
        quiet = read_ld_so_conf(rfs.path, rfs=rfs)
        monkeypatch.setattr(syscall, "call", eagain_through_dotdot)
        conf = read_ld_so_conf(rfs.path, rfs=rfs)
        assert conf == quiet and not conf.truncated and "/opt/b" in conf.dirs
        raced = dirs_by_inode(rfs, ("/opt/a", "/usr/lib/../lib64"))
        monkeypatch.setattr(syscall, "call", real)
        assert raced == dirs_by_inode(rfs, ("/opt/a", "/usr/lib/../lib64"))
