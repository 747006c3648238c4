"""cacheupdate.model_image: what it reads of the rootfs, and what it refuses, with the fewest lookups."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pyxis_hook.apply import cacheupdate
from pyxis_hook.loader import ldconf, ldmerge
from pyxis_hook.rootfs import RootFS


def _image(root: Path, conf: str | None = "/opt/lib\n") -> tuple[ldmerge.InjectedLib, ...]:
    for d in ("usr/lib/x86_64-linux-gnu", "opt/lib", "etc"):
        (root / d).mkdir(parents=True, exist_ok=True)
    os.symlink("usr/lib", root / "lib")
    if conf is not None:
        (root / "etc/ld.so.conf").write_text(conf)
    (root / "etc/ld.so.cache").write_bytes(b"cache bytes")
    return (ldmerge.InjectedLib("/usr/lib/x86_64-linux-gnu", "libcuda.so.535", "libcuda.so.1", 0x303),
            ldmerge.InjectedLib("/usr/lib/x86_64-linux-gnu", "libnvidia-ml.so.535", "libnvidia-ml.so.1", 0x303),
            ldmerge.InjectedLib("/lib", "libx.so.1", "libx.so.1", 0x303))


def test_scan_dirs_and_each_directory_asked_once(tmp_path, monkeypatch):
    """The libraries' directories are the scan's: their identities are not looked up a second time."""
    libs = _image(tmp_path)
    asked = []
    real = ldconf.dir_identity
    monkeypatch.setattr(ldconf, "dir_identity", lambda where, d: asked.append(d) or real(where, d))
    with RootFS(str(tmp_path)) as rfs:
        data, dirs, mapped = cacheupdate.model_image(rfs, libs, machine="x86_64")
    assert data == b"cache bytes"
    # /lib is /usr/lib (merged /usr): its names under /lib come first in the built-in list and win
    assert dirs == ("/opt/lib", "/lib/x86_64-linux-gnu", "/lib")
    assert [m.dir for m in mapped] == ["/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/lib"]
    assert sorted(asked) == sorted(set(asked)) == sorted(["/opt/lib", *cacheupdate.BUILTIN_DIRS["x86_64"]])


def test_a_library_dir_outside_the_scan_is_looked_up_and_refused(tmp_path):
    _image(tmp_path)
    (tmp_path / "srv").mkdir()
    with RootFS(str(tmp_path)) as rfs, pytest.raises(ldmerge.CannotMerge, match="/srv is not in the image"):
        cacheupdate.model_image(rfs, (ldmerge.InjectedLib("/srv", "liba.so.1", "liba.so.1", 0x303),), machine="x86_64")


def test_no_ld_so_conf_is_cannot_merge_and_a_directory_there_reads_as_empty(tmp_path):
    """ldconfig reads a missing /etc/ld.so.conf as nothing, and so would we: the merge refuses it
    (musl, distroless); a directory in its place is an empty configuration, as for ldconfig."""
    libs = _image(tmp_path, conf=None)
    with RootFS(str(tmp_path)) as rfs, pytest.raises(ldmerge.CannotMerge, match="no /etc/ld.so.conf"):
        cacheupdate.model_image(rfs, libs, machine="x86_64")
    (tmp_path / "etc/ld.so.conf").mkdir()
    with RootFS(str(tmp_path)) as rfs:
        _data, dirs, _mapped = cacheupdate.model_image(rfs, libs, machine="x86_64")
    assert dirs == ("/lib/x86_64-linux-gnu", "/lib")


def test_an_unsafe_ld_so_conf_is_refused_before_anything_else(tmp_path, no_hang):
    libs = _image(tmp_path, conf=None)
    os.mkfifo(tmp_path / "etc/ld.so.conf")
    with RootFS(str(tmp_path)) as rfs, pytest.raises(ldconf.UnsafeLoaderConfig):
        cacheupdate.model_image(rfs, libs, machine="x86_64")
