"""WritableRoot's table of parent directories: resolved once per start, shared, forgotten, closed once.

Each case runs with openat2 and with the component walk (`use_openat2`).
"""

from __future__ import annotations

import fcntl
import os
import posix  # what the module under test calls

import pytest

from pyxis_hook.apply.rootwrite import HostDirError, WritableRoot
from unit.base import test_rootfs

tree, use_openat2 = test_rootfs.tree, test_rootfs.use_openat2  # the fixtures, shared


def _open_fds() -> set[int]:
    return {int(n) for n in os.listdir("/proc/self/fd")}


def _count_lookups(r: WritableRoot) -> list[str]:
    """Every resolution of a path inside `r` that `_parent` may make (openat2 or the walk), by path."""
    seen: list[str] = []
    real_open, real_walk = r.open, r._walk

    def open_(path, *a, **k):
        seen.append(path)
        return real_open(path, *a, **k)

    def walk(path, *a, **k):
        seen.append(path)
        return real_walk(path, *a, **k)

    r.open, r._walk = open_, walk  # type: ignore[method-assign]
    return seen


class _Dirs:
    """A stand-in for `hostdirs.HostDirs`: the directories named in `host` are host directories."""

    def __init__(self, host=()):
        self.host = {(os.stat(p).st_dev, os.stat(p).st_ino) for p in host}
        self.asked = 0

    def why(self, dir_fd, root_fd):
        self.asked += 1
        st = os.fstat(dir_fd)
        return "a host directory" if (st.st_dev, st.st_ino) in self.host else None


def test_a_directory_is_resolved_once_for_all_its_entries_and_links(tree, use_openat2):
    root, _ = tree
    dirs = _Dirs()
    with WritableRoot(str(root), use_openat2=use_openat2, host_dirs=dirs) as r:
        seen = _count_lookups(r)
        entries = [r.ensure_entry(f"/usr/lib/lib{i}.so.1") for i in range(3)]
        assert r.symlink("/usr/lib/lib0.so", "lib0.so.1") and r.symlink("usr/lib/lib1.so", "lib1.so.1")
        assert len(seen) == 1 and dirs.asked == 1
        assert len({e.parent_fd for e in entries}) == 1 and not any(e.owns_parent for e in entries)
        assert {c.parent_fd for c in r.created} == {entries[0].parent_fd}
        for e in entries:
            e.close()
        assert r.rollback() == []
    assert sorted(os.listdir(root / "usr/lib")) == []


def test_rollback_removes_everything_and_closes_every_fd_once(tree, use_openat2, monkeypatch):
    root, _ = tree
    (root / "usr/lib/old.so").symlink_to("elsewhere")
    before = _open_fds()
    not_open: list[int] = []
    real_close = posix.close

    def close(fd):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            not_open.append(fd)  # closed already (a second close of one fd)
        real_close(fd)

    r = WritableRoot(str(root), use_openat2=use_openat2)
    monkeypatch.setattr(posix, "close", close)
    for path in ("/dev/nvidia0", "/dev/nvidia1", "/usr/lib/libcuda.so.1", "/opt/nv/fw/gsp.bin"):
        r.ensure_entry(path).close()
    r.ensure_entry("/opt/nv/share", "dir").close()
    assert r.symlink("/usr/lib/libcuda.so", "libcuda.so.1") and r.symlink("/usr/lib/old.so", "new")
    assert r.ensure_file("/usr/lib/libnvidia-ml.so.1") >= 0  # (its fd is the caller's: left open here)
    assert r.rollback() == []
    r.close()
    monkeypatch.undo()
    assert not_open == []
    assert _open_fds() - before == {max(_open_fds() - before)}  # only the ensure_file fd the test kept
    for fd in _open_fds() - before:
        os.close(fd)
    assert not (root / "dev").exists() and not (root / "opt").exists()
    assert sorted(os.listdir(root / "usr/lib")) == ["old.so"]
    assert os.readlink(root / "usr/lib/old.so") == "elsewhere"


def test_close_without_rollback_closes_every_kept_fd(tree, use_openat2):
    root, _ = tree
    before = _open_fds()
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        for path in ("/dev/a", "/dev/b", "/x/y/z"):
            r.ensure_entry(path).close()
        r.symlink("/dev/c", "a")
    assert _open_fds() == before
    assert (root / "dev/c").is_symlink() and (root / "x/y/z").exists()  # kept: no rollback asked


def test_a_replaced_link_on_the_way_is_not_resolved_from_before(tree, use_openat2):
    """usr/lib/a led to b when the first entry was made; the link then leads to c: the next entry goes to c."""
    root, _ = tree
    for d in ("b", "c"):
        (root / "usr/lib" / d).mkdir()
    (root / "usr/lib/a").symlink_to("b")
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        r.ensure_entry("/usr/lib/a/x").close()
        assert r.symlink("/usr/lib/a", "c")
        r.ensure_entry("/usr/lib/a/y").close()
        assert (root / "usr/lib/b/x").exists() and (root / "usr/lib/c/y").exists()
        assert not (root / "usr/lib/b/y").exists()
        assert r.rollback() == []
    assert os.listdir(root / "usr/lib/b") == [] and os.listdir(root / "usr/lib/c") == []
    assert os.readlink(root / "usr/lib/a") == "b"


def test_a_directory_entry_forgets_the_table(tree, use_openat2):
    """A directory mount point is where a directory mount goes: what was resolved before is resolved again."""
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        seen = _count_lookups(r)
        r.ensure_entry("/usr/lib/x").close()
        r.ensure_entry("/usr/lib/d", "dir").close()  # its parent is the one resolved for x
        assert len(seen) == 1
        r.ensure_entry("/usr/lib/y").close()
        r.ensure_entry("/usr/lib/z").close()
        assert len(seen) == 2
        assert r.rollback() == []


def test_a_host_verdict_is_kept_per_directory_and_never_given_to_another_fd(tree, use_openat2):
    """A kept fd's answer is asked once; a caller's own fd is asked every time (its number may come back
    for another directory once it is closed)."""
    root, _ = tree
    (root / "hostdir").mkdir()
    dirs = _Dirs(host=[root / "hostdir"])
    with WritableRoot(str(root), use_openat2=use_openat2, host_dirs=dirs) as r:
        for name in ("a", "b"):
            with pytest.raises(HostDirError):
                r.ensure_file(f"/hostdir/{name}")
        assert dirs.asked == 1
        fd = os.open(root / "hostdir", os.O_PATH | os.O_DIRECTORY)
        with pytest.raises(HostDirError):
            r.check_dir(fd, "/hostdir/x")
        os.close(fd)
        fd2 = os.open(root / "etc", os.O_PATH | os.O_DIRECTORY)  # very likely the same number
        try:
            r.check_dir(fd2, "/etc/x")
        finally:
            os.close(fd2)
        assert dirs.asked == 3
    assert os.listdir(root / "hostdir") == []


def test_directory_and_file_entries_in_turn_hold_no_parent_fd_per_entry(tree, use_openat2):
    """A forgotten parent no record needs is closed at once; the entry being handed out keeps its own."""
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        before = _open_fds()
        for _ in range(20):  # existing dirs and files: nothing created, so no record needs a parent
            d = r.ensure_entry("/usr/lib", "dir")
            assert os.path.samestat(os.fstat(d.parent_fd), os.stat(root / "usr"))  # usable while handed out
            d.close()
            f = r.ensure_entry("/usr/lib/libreal.so.1")
            f.close()
        assert len(_open_fds() - before) <= 3, sorted(_open_fds() - before)  # the two tables in use, the listing
        made = r.ensure_entry("/usr/lib/libnew.so.1")  # a record of what was created keeps its parent
        made.close()
        r.ensure_entry("/usr", "dir").close()
        assert made.parent_fd in r._kept and os.fstat(made.parent_fd)
        assert r.rollback() == [] and not (root / "usr/lib/libnew.so.1").exists()


def test_the_table_is_forgotten_after_the_confined_ldconfig_ran(tree, use_openat2, monkeypatch):
    """ldconfig points links the image's configuration chooses: a path through one may name another dir after."""
    from pyxis_hook.apply import child, confined
    from pyxis_hook.plan.build import LdcacheUpdate, Plan

    root, _ = tree
    monkeypatch.setattr(confined, "run_ldconfig", lambda *a, **k: "")
    plan = Plan(rootfs=str(root), ldcache=LdcacheUpdate(mode="ldconfig", ldconfig="@/sbin/ldconfig"))
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        r.ensure_entry("/usr/lib/libnew.so.1").close()
        assert r._dirs
        child._run_ldconfig(plan, r, -1, [])
        assert not r._dirs
        r.rollback()
