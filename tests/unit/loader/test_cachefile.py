"""pyxis_hook.loader.cachefile: the cache replaced by rename, or the image's left as it was with no temp file.

(Apply-level proofs, a full upper dir and each write failing in turn:
tests/test_apply_writes.py.)
"""

from __future__ import annotations

import errno
import os
import posix  # what the modules under test call (they do not import os)
import stat

import pytest

from pyxis_hook.loader import cachefile
from pyxis_hook.errors import LdCacheError
from pyxis_hook.rootfs import RootFS


@pytest.fixture
def image(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.cache").write_bytes(b"old cache")
    return tmp_path


def test_written_whole_and_renamed(image):
    (image / "etc/ld.so.cache~").write_bytes(b"leftover of an interrupted run")
    old = os.stat(image / "etc/ld.so.cache")
    with RootFS(str(image)) as rfs:
        cachefile.write_cache(rfs, b"new cache")
    st = os.stat(image / "etc/ld.so.cache")
    assert (image / "etc/ld.so.cache").read_bytes() == b"new cache" and st.st_ino != old.st_ino
    assert stat.S_IMODE(st.st_mode) == 0o644
    assert sorted(os.listdir(image / "etc")) == ["ld.so.cache"]


@pytest.mark.parametrize("step", ["write", "fchown", "fchmod", "close", "rename"])
def test_a_failed_step_leaves_the_old_cache_and_no_temp_file(image, monkeypatch, step):
    real = getattr(os, step)
    temp = {}

    def failing(*args, **kwargs):
        if step == "rename" or args[0] == temp.get("fd"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(*args, **kwargs)

    real_open = os.open

    def remember(*args, **kwargs):
        fd = real_open(*args, **kwargs)
        if args[0] == cachefile.TEMP_NAME:
            temp["fd"] = fd
        return fd

    with RootFS(str(image), owner=(os.getuid(), os.getgid())) as rfs:
        monkeypatch.setattr(posix, "open", remember)
        monkeypatch.setattr(posix, step, failing)
        with pytest.raises(LdCacheError) as e:
            cachefile.write_cache(rfs, b"new cache")
        monkeypatch.undo()
        if step == "close":
            os.close(temp["fd"])  # the fake failure left it open
    assert str(e.value) == f"/etc/ld.so.cache (in {image}): cannot write: Input/output error"
    assert (image / "etc/ld.so.cache").read_bytes() == b"old cache"
    assert sorted(os.listdir(image / "etc")) == ["ld.so.cache"]


def test_remove_temp_removes_only_a_regular_file(image):
    with RootFS(str(image)) as rfs:
        assert cachefile.remove_temp(rfs) is None  # nothing there
        (image / "etc/ld.so.cache~").write_bytes(b"half a cache")
        assert cachefile.remove_temp(rfs) is None
        assert not (image / "etc/ld.so.cache~").exists()
        # not ldconfig's (it opens the temp name O_NOFOLLOW): left alone
        (image / "etc/ld.so.cache~").symlink_to("/etc/passwd")
        assert cachefile.remove_temp(rfs) is None
        assert (image / "etc/ld.so.cache~").is_symlink()
        os.unlink(image / "etc/ld.so.cache~")
        (image / "etc/ld.so.cache~").mkdir()
        assert cachefile.remove_temp(rfs) is None
        assert (image / "etc/ld.so.cache~").is_dir()


def test_remove_temp_without_etc(tmp_path):
    with RootFS(str(tmp_path)) as rfs:
        assert cachefile.remove_temp(rfs) is None
