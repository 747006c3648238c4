"""Every file apply writes in a rootfs is renamed into place whole or removed: a failed write leaves nothing.

The container's writable layer is an overlay upper dir on its own tmpfs,
as under runc/podman/enroot; a full one makes the cache write fail
(ENOSPC) in both ld.so.cache modes, after the mount points and SONAME links
were made.  Then each write call apply makes in the rootfs (mkdir, create,
symlink, rename, write, chown, chmod) is failed once in turn.  Every time the
start fails with one line, and the rootfs (its merged view and the upper
dir) is what it was: no mount, no mount point, no link, no
`/etc/ld.so.cache~`.
"""

from __future__ import annotations

import errno
import os
import posix  # what the modules under test call (they do not import os)
import stat
import subprocess
from pathlib import Path

import pytest


from fixtures.overlay import overlay
from fixtures.synth import build_lib
from pyxis_hook.apply.child import apply_plan
from pyxis_hook.errors import PyxisHookError
from pyxis_hook.loader.ldcache import written_flags as cache_flags
from pyxis_hook.plan.build import LdcacheUpdate, MountEdit, Plan, SymlinkEdit
from root.test_apply import LIBDIR, _container, _mounts_under

pytestmark = pytest.mark.root

LIBS = (("libcuda.so.535.104.05", "libcuda.so.1"), ("libnvidia-ml.so.535.104.05", "libnvidia-ml.so.1"))


@pytest.fixture
def layered(tmp_path):
    """Host libraries; an image (lower dir) whose cache glibc's ldconfig built; its upper dir on a
    256 KiB tmpfs; the merged rootfs; a container process over it."""
    host = tmp_path / "host"
    for name, soname in LIBS:
        build_lib(host, soname, filename=name)
    lower = tmp_path / "image"
    (lower / LIBDIR.lstrip("/")).mkdir(parents=True)
    (lower / "etc").mkdir()
    (lower / "etc/ld.so.conf").write_text(f"{LIBDIR}\n")
    build_lib(lower / LIBDIR.lstrip("/"), "libimage.so.1", filename="libimage.so.1.0")
    os.symlink("libcuda.so.0", lower / LIBDIR.lstrip("/") / "libcuda.so")  # an old link: replaced by rename
    subprocess.run(["ldconfig", "-r", str(lower)], check=True)
    with overlay(lower, tmp_path, size="256k") as (root, layer):
        p = _container(root)
        yield host, root, layer, p.pid
        p.kill()
        p.wait()

def fill(fs: Path) -> None:
    """Fill the filesystem at `fs` to the last block."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as e:
        assert e.errno == errno.ENOSPC
    finally:
        os.close(fd)


def plan_for(host: Path, root: Path, mode: str) -> Plan:
    """What the planner makes for two driver libraries: binds, SONAME and dev links, the cache update."""
    rows = tuple((LIBDIR, name, soname, cache_flags(64)) for name, soname in LIBS)
    return Plan(rootfs=str(root),
                mounts=tuple(MountEdit(str(host / name), f"{LIBDIR}/{name}") for name, _ in LIBS),
                symlinks=tuple(SymlinkEdit(f"{LIBDIR}/{soname}", name) for name, soname in LIBS)
                + (SymlinkEdit(f"{LIBDIR}/libcuda.so", "libcuda.so.1"),),
                ldcache=LdcacheUpdate(mode, "/sbin/ldconfig", (LIBDIR,), libs=rows))


def tree(d: Path) -> dict:
    """Every name under `d`: a link by its target, a file by size, inode and mtime, a directory by
    its type (copied up to the upper dir, or a mount point came and went in it: a new inode, size
    or mtime).  A link the rollback put back is a new link with the image's target."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                out[os.path.relpath(p, d)] = ("link", os.readlink(p))
            else:
                out[os.path.relpath(p, d)] = (stat.S_IFMT(st.st_mode),
                                             None if stat.S_ISDIR(st.st_mode) else (st.st_size, st.st_ino,
                                                                                     st.st_mtime_ns))
    return out


@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_full_upper_dir_fails_the_start_and_leaves_no_temp_file(layered, mode):
    host, root, layer, pid = layered
    fill(layer)
    before, mounts = tree(root), _mounts_under(pid, root)
    with pytest.raises(PyxisHookError) as e:
        apply_plan(plan_for(host, root, mode), pid)
    assert "No space left on device" in str(e.value) and "\n" not in str(e.value)
    assert _mounts_under(pid, root) == mounts  # the rootfs's own overlay, nothing on it
    assert not (root / "etc/ld.so.cache~").exists() and not (layer / "upper/etc/ld.so.cache~").exists()
    assert tree(root) == before


class FailOnce:
    """os's write calls, the `n`-th one that changes something in `root` failing with ENOSPC.

    Set on the host before apply_plan; its forked child inherits them with
    the count at zero, so each run fails exactly one write of its own.  A
    call is in `root` when its path, or the file or directory its fd names,
    is.  Reads (O_PATH, O_RDONLY opens without O_CREAT), the close of an fd
    opened read-only (a mount point created O_RDONLY | O_CREAT) and the undo
    (unlink, rmdir) are not counted.
    """

    NAMES = ("mkdir", "open", "symlink", "replace", "rename", "write", "fchown", "fchmod", "chown", "close")

    def __init__(self, root: Path, n: int) -> None:
        self.root = str(root)
        self.n = n
        self.seen = 0
        self.written: set[int] = set()  # fds opened for writing in root: their close counts too
        self.real = {name: getattr(os, name) for name in self.NAMES}

    def inside(self, path, dir_fd) -> bool:
        if isinstance(path, int):
            where = os.readlink(f"/proc/self/fd/{path}")
        elif dir_fd is not None and not os.fsdecode(path).startswith("/"):
            where = os.readlink(f"/proc/self/fd/{dir_fd}")
        else:
            where = os.fsdecode(path)
        return where == self.root or where.startswith(self.root + "/")

    def wrap(self, name: str):
        real = self.real[name]

        def call(*args, **kwargs):
            target = args[1] if name == "symlink" else args[0]
            dir_fd = kwargs.get("src_dir_fd", kwargs.get("dir_fd"))
            counted = self.inside(target, dir_fd)
            if name == "open":
                counted = counted and bool(args[1] & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            elif name == "close":
                counted = args[0] in self.written
                self.written.discard(args[0])
            if counted:
                self.seen += 1
                if self.seen == self.n:
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            result = real(*args, **kwargs)
            if name == "open" and counted and args[1] & (os.O_WRONLY | os.O_RDWR):
                self.written.add(result)  # a read-only fd (a mount point made O_CREAT) writes nothing at close
            return result

        return call

    def install(self, monkeypatch) -> None:
        for name in self.NAMES:
            monkeypatch.setattr(posix, name, self.wrap(name))


@pytest.mark.slow
def test_each_write_failing_leaves_the_rootfs_as_it_was(layered, monkeypatch):
    """Mount points, SONAME links, the cache: whichever write fails, the start fails and nothing stays."""
    host, root, layer, pid = layered
    before, mounts = tree(root), _mounts_under(pid, root)
    plan = plan_for(host, root, "merge")
    failures = []
    for n in range(1, 100):
        with monkeypatch.context() as m:
            FailOnce(root, n).install(m)
            try:
                res = apply_plan(plan, pid)
            except PyxisHookError as e:
                failures.append(str(e))
            else:
                break  # n is one more than the writes a start makes
        assert "No space left on device" in failures[-1] and "\n" not in failures[-1], (n, failures[-1])
        assert _mounts_under(pid, root) == mounts, (n, failures[-1])
        assert tree(root) == before, (n, failures[-1])
    else:
        raise AssertionError("apply never succeeded")
    assert any("merged 2 entries" in m for m in res.messages), res.messages
    for what in ("cannot create mount point", "cannot create symlink", "cannot replace symlink",
                 "/etc/ld.so.cache (in"):
        assert any(what in f for f in failures), (what, failures)
