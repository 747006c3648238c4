"""RootFS: fd-based resolution and creation inside a rootfs, with and without openat2.

Every case runs twice: with the kernel's openat2(RESOLVE_IN_ROOT) and with the
component walk used on kernels < 5.6; both must give chroot semantics.
"""

from __future__ import annotations

import errno
import fcntl
import os
import posix  # what the modules under test call (they do not import os)
import stat

import pytest

from pyxis_hook.errors import PathError
from pyxis_hook.apply.rootwrite import WritableRoot
from pyxis_hook.rootfs import RootPathError, resolve_in_root


@pytest.fixture(params=[True, False], ids=["openat2", "walk"])
def use_openat2(request):
    return request.param


@pytest.fixture
def tree(tmp_path):
    """A rootfs next to a 'host' dir holding a file the image must never reach."""
    root = tmp_path / "rootfs"
    host = tmp_path / "host"
    (root / "etc").mkdir(parents=True)
    (root / "usr/lib").mkdir(parents=True)
    (root / "etc/os-release").write_text("ID=test\n")
    host.mkdir()
    (host / "secret").write_text("host secret\n")
    return root, host


def _ident(fd):
    st = os.fstat(fd)
    os.close(fd)
    return st.st_dev, st.st_ino


def _ident_path(p):
    st = os.lstat(p)
    return st.st_dev, st.st_ino


def _snapshot(d):
    out = {}
    for dirpath, dirnames, filenames in os.walk(d):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[p] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def test_open_plain_file(tree, use_openat2):
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        assert _ident(r.open("/etc/os-release", os.O_RDONLY)) == _ident_path(root / "etc/os-release")
        assert r.read_text("etc/os-release") == "ID=test\n"


@pytest.mark.parametrize("link", ["/", "../../../../..", "/../..", "../../etc/.."])
def test_dir_symlink_escapes_stay_in_root(tree, use_openat2, link):
    root, host = tree
    (root / "usr/lib/evil").symlink_to(link)
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        # usr/lib/evil/etc/os-release names the rootfs' own file, never a host one
        assert _ident(r.open("usr/lib/evil/etc/os-release", os.O_RDONLY)) == _ident_path(root / "etc/os-release")


def test_dotdot_chain_clamped(tree, use_openat2):
    root, host = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        assert _ident(r.open("../../../../etc/os-release", os.O_RDONLY)) == _ident_path(root / "etc/os-release")
        with pytest.raises(RootPathError) as e:
            r.open("../../host/secret", os.O_RDONLY)
        assert e.value.errno == errno.ENOENT


def test_absolute_symlink_to_host_file_resolves_in_root(tree, use_openat2):
    root, host = tree
    (root / "etc/ld.so.cache").symlink_to(str(host / "secret"))
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        with pytest.raises(PathError) as e:
            r.read_text("/etc/ld.so.cache")
        assert "etc/ld.so.cache" in str(e.value) and "\n" not in str(e.value)


def test_symlink_loop_is_clean_error(tree, use_openat2):
    root, _ = tree
    (root / "a").symlink_to("b")
    (root / "b").symlink_to("a")
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        with pytest.raises(RootPathError) as e:
            r.open("a/x", os.O_RDONLY)
        assert e.value.errno == errno.ELOOP
        with pytest.raises(RootPathError):
            r.ensure_file("a/x")


def test_41_link_chain(tree, use_openat2):
    root, _ = tree
    for i in range(41):
        (root / f"l{i}").symlink_to(f"l{i + 1}")
    (root / "l41").write_text("end")
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        assert r.read_text("l1") == "end"  # 40 links
        with pytest.raises(RootPathError) as e:
            r.read_text("l0")  # 41 links
        assert e.value.errno == errno.ELOOP


def test_read_text_refuses_fifo_and_big_files(tree, use_openat2):
    root, _ = tree
    os.mkfifo(root / "etc/debian_version")
    (root / "etc/big").write_bytes(b"x" * 5000)
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        with pytest.raises(RootPathError, match="not a regular file"):
            r.read_text("/etc/debian_version")
        with pytest.raises(RootPathError, match="larger than"):
            r.read_text("/etc/big", limit=4096)
        assert r.exists("/etc/debian_version")
        assert not r.exists("/etc/nothing")


def test_ensure_file_creates_parents_inside_root(tree, use_openat2):
    root, host = tree
    (root / "usr/lib/x86_64-linux-gnu").symlink_to("/")  # hostile dir link
    before = _snapshot(host)
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        fd = r.ensure_file("/usr/lib/x86_64-linux-gnu/opt/nv/libcuda.so.1")
        st = os.fstat(fd)
        os.close(fd)
        assert stat.S_ISREG(st.st_mode)
        assert _ident_path(root / "opt/nv/libcuda.so.1") == (st.st_dev, st.st_ino)
        assert [c.kind for c in r.created] == ["dir", "dir", "file"]
        assert r.rollback() == []
    assert not (root / "opt").exists()
    assert _snapshot(host) == before


def test_a_file_made_here_is_its_own_mount_target_read_only(tree, use_openat2):
    """The fd that made a mount point file is the target (no reopen by name); an existing file is opened O_PATH."""
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        made = r.ensure_entry("/usr/lib/libnvidia-ml.so.1")
        flags = fcntl.fcntl(made.fd, fcntl.F_GETFL)
        assert made.created and not flags & os.O_PATH and flags & os.O_ACCMODE == os.O_RDONLY
        assert _ident_path(root / "usr/lib/libnvidia-ml.so.1") == _ident(os.dup(made.fd))
        found = r.ensure_entry("/etc/os-release")
        assert not found.created and fcntl.fcntl(found.fd, fcntl.F_GETFL) & os.O_PATH
        made.close()
        found.close()
        assert r.rollback() == []
    assert not (root / "usr/lib/libnvidia-ml.so.1").exists()


def test_ensure_reuses_existing_and_checks_type(tree, use_openat2):
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        fd = r.ensure_file("/etc/os-release")
        os.close(fd)
        assert r.created == []
        with pytest.raises(RootPathError, match="is a directory"):
            r.ensure_file("/etc")
        with pytest.raises(RootPathError, match="not a directory"):
            r.ensure_dir("/etc/os-release")
        with pytest.raises(RootPathError, match="(?i)not a directory"):
            r.ensure_file("/etc/os-release/x")
        os.close(r.ensure_dir("/"))


@pytest.mark.parametrize("target", ["/etc/shadow", "/proc/self/root/etc/passwd", "os-release"])
def test_symlink_at_mount_target_refused(tree, use_openat2, target):
    root, _ = tree
    (root / "usr/lib/libcuda.so.1").symlink_to(target)
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        with pytest.raises(RootPathError, match="symlink"):
            r.ensure_file("/usr/lib/libcuda.so.1")
    assert os.readlink(root / "usr/lib/libcuda.so.1") == target


def test_ensure_dir_through_dotdot_and_root(tree, use_openat2):
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        fd = r.ensure_dir("/../../proc/driver/nvidia")
        assert _ident(fd) == _ident_path(root / "proc/driver/nvidia")
        assert r.rollback() == []
    assert not (root / "proc").exists()


def test_symlink_create_keep_replace_rollback(tree, use_openat2):
    root, host = tree
    (root / "usr/lib/x86_64-linux-gnu").symlink_to("../../../..")
    (root / "usr/lib/old.so").symlink_to("elsewhere")
    (root / "usr/lib/real.so").write_text("")
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        assert r.symlink("/usr/lib/x86_64-linux-gnu/lib/libcuda.so", "libcuda.so.1") is True
        assert os.readlink(root / "lib/libcuda.so") == "libcuda.so.1"
        assert r.symlink("/lib/libcuda.so", "libcuda.so.1") is False
        assert r.symlink("/usr/lib/old.so", "new") is True
        assert os.readlink(root / "usr/lib/old.so") == "new"
        with pytest.raises(RootPathError) as e:
            r.symlink("/usr/lib/real.so", "x")
        assert e.value.errno == errno.EEXIST
        assert r.rollback() == []
    assert not (root / "lib").exists()
    assert os.readlink(root / "usr/lib/old.so") == "elsewhere"
    assert not os.path.lexists(host / "lib")


def test_rollback_leaves_replaced_files_alone(tree, use_openat2):
    root, _ = tree
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        os.close(r.ensure_file("/opt/x"))
        os.rename(root / "opt/x", root / "opt/x.orig")  # keeps the inode alive, so no number reuse
        (root / "opt/x").write_text("someone else's")
        problems = r.rollback()
    assert (root / "opt/x").read_text() == "someone else's"
    # the dir 'opt' is not empty any more: reported, not forced
    assert len(problems) == 1 and "opt" in problems[0]


def test_agrees_with_resolve_in_root(tree, use_openat2):
    """The string walk (read-only uses) and the fd walk name the same file."""
    root, _ = tree
    (root / "usr/lib/a").symlink_to("/etc")
    (root / "usr/lib/b").symlink_to("../lib/a/../etc")
    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        for p in ("usr/lib/a/os-release", "usr/lib/b/os-release", "/../usr/lib/a/../etc/os-release"):
            assert _ident(r.open(p, os.O_PATH)) == _ident_path(resolve_in_root(str(root), p))


def test_missing_rootfs_is_one_line(tmp_path):
    with pytest.raises(PathError, match="container rootfs"):
        WritableRoot(str(tmp_path / "nope"))


# --- read_bytes and rollback gaps -------------------------------------------------------------


def test_failed_chown_still_rolled_back(tree, use_openat2, monkeypatch):
    """A created entry is recorded before it is chowned: a chown that fails leaves nothing behind."""
    root, _ = tree

    def chown(*_a, **_k):
        raise PermissionError(errno.EPERM, "Operation not permitted")

    with WritableRoot(str(root), owner=(4321, 4321), use_openat2=use_openat2) as r:
        monkeypatch.setattr(posix, "chown", chown)
        with pytest.raises(RootPathError) as e:
            r.ensure_file("/opt/nv/libcuda.so.1")
        monkeypatch.undo()
        assert "opt" in str(e.value) and "\n" not in str(e.value)
        assert r.rollback() == []
    assert not (root / "opt").exists()


def test_entry_vanishing_between_stat_and_open_is_retried(tree, use_openat2, monkeypatch):
    root, _ = tree
    (root / "etc/target").write_text("")
    real_open = os.open
    fired = []

    def racing_open(path, flags, mode=0o777, *, dir_fd=None):
        if path == "target" and flags & os.O_PATH and not flags & os.O_DIRECTORY and not fired:
            fired.append(1)
            os.unlink(path, dir_fd=dir_fd)  # someone removes it after our stat
        return real_open(path, flags, mode, dir_fd=dir_fd)

    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        monkeypatch.setattr(posix, "open", racing_open)
        entry = r.ensure_entry("/etc/target", "file")
        monkeypatch.undo()
        assert fired and entry.created
        assert _ident(os.dup(entry.fd)) == _ident_path(root / "etc/target")
        entry.close()
        assert r.rollback() == []
    assert not (root / "etc/target").exists()


@pytest.mark.parametrize("fails,err,match", [
    ("symlink", errno.ENOSPC, "libcuda.so"),  # making the temporary link
    ("replace", errno.EIO, "cannot replace symlink"),  # renaming it over the image's link
])
def test_a_failed_symlink_replacement_keeps_the_images_link_and_leaves_no_temp(tree, use_openat2, monkeypatch,
                                                                             fails, err, match):
    root, _ = tree
    (root / "usr/lib/libcuda.so").symlink_to("libcuda.so.old")

    def failing(*_a, **_k):
        raise OSError(err, os.strerror(err))

    with WritableRoot(str(root), use_openat2=use_openat2) as r:
        monkeypatch.setattr(posix, fails, failing)
        with pytest.raises(RootPathError, match=match):
            r.symlink("/usr/lib/libcuda.so", "libcuda.so.1")
        monkeypatch.undo()
        assert r.created == [] and r.rollback() == []
    assert os.readlink(root / "usr/lib/libcuda.so") == "libcuda.so.old"
    assert sorted(os.listdir(root / "usr/lib")) == ["libcuda.so"]


def test_locate_names_the_resolved_path_and_hides_top_level_dirs(tmp_path):
    """The fd and the path it resolves to (no link, no `..`, `..` at the root stays there); a `hidden`
    top-level directory is missing whichever way a path reaches it."""
    import errno

    from pyxis_hook.rootfs import RootPathError

    (tmp_path / "usr/lib").mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/version").write_text("x")
    (tmp_path / "lib").symlink_to("usr/lib")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/v").symlink_to("../../../proc/version")
    (tmp_path / "loop").symlink_to("loop")
    with WritableRoot(str(tmp_path)) as rfs:
        fd, real = rfs.locate("/../../lib/../lib/./")
        os.close(fd)
        assert real == "/usr/lib"
        fd, real = rfs.locate("/etc/v")
        os.close(fd)
        assert real == "/proc/version"
        for path in ("/etc/v", "/proc/version", "/proc", "/etc/../proc"):
            with pytest.raises(RootPathError) as e:
                rfs.locate(path, hidden=("proc", "sys"))
            assert e.value.errno == errno.ENOENT
        with pytest.raises(RootPathError) as e:
            rfs.locate("/loop/x")
        assert e.value.errno == errno.ELOOP


def test_read_to_end_reads_past_one_chunk_caps_and_closes(tmp_path):
    """The one posix read loop of procfs texts, GPU files and kept files: whole, bounded, fd closed either way."""
    import errno as _errno

    from pyxis_hook.rootfs import read_to_end

    path = tmp_path / "f"
    path.write_bytes(b"0123456789" * 10)
    fd = os.open(path, os.O_RDONLY)
    assert read_to_end(fd, 100, chunk=16) == b"0123456789" * 10
    with pytest.raises(OSError):
        os.fstat(fd)  # closed
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(OSError) as e:
        read_to_end(fd, 99, chunk=16)
    assert e.value.errno == _errno.EFBIG
    with pytest.raises(OSError):
        os.fstat(fd)


# ------------------------------------------------------------ links nobody can follow, components that change


def _foreign_readlink(monkeypatch, name):
    """readlink of `name` fails with ENOENT although lstat sees a link: `self` of another PID namespace's procfs."""
    real = posix.readlink

    def readlink(path, *args, **kw):
        if os.fsdecode(path).endswith("/" + name) or os.fsdecode(path) == name:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", path)
        return real(path, *args, **kw)

    monkeypatch.setattr(posix, "readlink", readlink)


def test_a_link_whose_text_cannot_be_read_is_missing(tmp_path, monkeypatch):
    """A link through /proc/self: the string walk keeps it as a missing component, the fd walk says ENOENT."""
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/self").symlink_to("4242")
    (tmp_path / "opt/compat").mkdir(parents=True)
    (tmp_path / "usr/local").mkdir(parents=True)
    (tmp_path / "usr/local/cuda").symlink_to("/proc/self/root/opt")
    _foreign_readlink(monkeypatch, "self")
    assert resolve_in_root(str(tmp_path), "/usr/local/cuda/compat") == f"{tmp_path}/proc/self/root/opt/compat"
    with WritableRoot(str(tmp_path), use_openat2=False) as r:
        for path in ("/usr/local/cuda/compat", "/proc/self"):
            with pytest.raises(RootPathError) as e:
                r.open(path, posix.O_PATH)
            assert e.value.errno == errno.ENOENT
            assert not r.exists(path)
        os.close(r.open("/proc/self", posix.O_PATH | posix.O_NOFOLLOW))  # the link itself is there


def test_a_component_that_stops_being_a_link_is_looked_at_again(tmp_path, monkeypatch):
    """lstat saw a link, readlink finds a directory (EINVAL): the answer is the directory's, not an OSError."""
    (tmp_path / "a").mkdir()
    real_lstat = posix.lstat
    seen = []

    def lstat(path, *args, **kw):
        st = real_lstat(path, *args, **kw)
        if os.fsdecode(path).endswith("/a") and not seen:
            seen.append(path)
            return os.stat_result((stat.S_IFLNK | 0o777,) + tuple(st)[1:])  # what it was a moment ago
        return st

    monkeypatch.setattr(posix, "lstat", lstat)
    assert resolve_in_root(str(tmp_path), "/a/f") == f"{tmp_path}/a/f"
    assert seen

    def always_a_link(path, *args, **kw):
        st = real_lstat(path, *args, **kw)
        return os.stat_result((stat.S_IFLNK | 0o777,) + tuple(st)[1:]) if os.fsdecode(path).endswith("/a") else st

    monkeypatch.setattr(posix, "lstat", always_a_link)
    with pytest.raises(RootPathError, match="changed while resolving"):
        resolve_in_root(str(tmp_path), "/a/f")


@pytest.mark.parametrize("err", [errno.EACCES, errno.EIO, errno.ENAMETOOLONG])
def test_any_other_readlink_error_is_one_line(tmp_path, monkeypatch, err):
    (tmp_path / "l").symlink_to("x")

    def readlink(*_a, **_k):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(posix, "readlink", readlink)
    with pytest.raises(RootPathError) as e:
        resolve_in_root(str(tmp_path), "/l/y")
    assert e.value.errno == err and "\n" not in str(e.value)
    with WritableRoot(str(tmp_path), use_openat2=False) as r, pytest.raises(RootPathError) as e:
        r.open("/l/y", posix.O_PATH)
    assert e.value.errno == err


def test_hidden_dirs_are_missing_with_openat2_too(tmp_path):
    """A RootFS made with HIDDEN walks (openat2 cannot leave a directory out) and agrees with locate."""
    from pyxis_hook.rootfs import HIDDEN, RootFS

    (tmp_path / "proc/self/root").mkdir(parents=True)
    (tmp_path / "sys").mkdir()
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/a").symlink_to("/proc/self/root")
    (tmp_path / "etc/b").symlink_to("../sys")
    (tmp_path / "proc.d").symlink_to("proc")  # a link named otherwise is followed to the hidden dir
    with RootFS(str(tmp_path), use_openat2=True, hidden=HIDDEN) as r:
        assert r.use_openat2 is False
        for path in ("/proc", "/proc/self/root", "/etc/a", "/etc/b", "/etc/../sys", "/proc.d/self", "/sys/"):
            assert not r.exists(path), path
        assert r.exists("/etc") and r.exists("/etc/..")
    with RootFS(str(tmp_path), use_openat2=True) as r:
        assert r.exists("/etc/a") and r.exists("/etc/b")


@pytest.mark.root
def test_a_link_through_a_procfs_of_another_pid_namespace(tmp_path):
    """The container's own /proc mounted (another PID namespace's procfs: readlink of `self` is ENOENT there):
    `/usr/local/cuda -> /proc/self/root/opt` names nothing, and nothing raises."""
    import json
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1)")
    root = tmp_path / "rootfs"
    (root / "proc").mkdir(parents=True)
    (root / "opt/compat").mkdir(parents=True)
    (root / "usr/local").mkdir(parents=True)
    (root / "usr/local/cuda").symlink_to("/proc/self/root/opt")
    code = r"""
import json, posix, sys
from pyxis_hook.plan.container import container_facts
from pyxis_hook.rootfs import HIDDEN, RootFS, RootPathError, resolve_in_root
root = sys.argv[1]
out = {"readlink": None, "resolved": resolve_in_root(root, "/usr/local/cuda/compat")}
try:
    posix.readlink(root + "/proc/self")
except OSError as e:
    out["readlink"] = e.errno
for name, kw in (("openat2", {"use_openat2": True}), ("walk", {"use_openat2": False}), ("hidden", {"hidden": HIDDEN})):
    with RootFS(root, **kw) as r:
        out[name] = [r.exists(p) for p in ("/usr/local/cuda/compat", "/proc/self", "/opt/compat")]
facts = container_facts(root)
out["facts"] = [facts.compat_problem, facts.compat_libcuda, facts.has_ld_so_conf]
print(json.dumps(out))
"""
    (tmp_path / "probe.py").write_text(code)
    inner = f"unshare -p -f mount -t proc proc '{root}/proc' && exec '{sys.executable}' '{tmp_path}/probe.py' '{root}'"
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    # the mount lives in a mount namespace of its own: it goes away with the probe
    run = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", inner], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "PYTHONPATH": repo})
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["readlink"] == errno.ENOENT  # the kernel's answer this test stands in for
    assert out["resolved"] == f"{root}/proc/self/root/opt/compat"
    assert out["openat2"] == out["walk"] == out["hidden"] == [False, False, True]
    assert out["facts"] == ["", "", False]


def _exchange_forever(root):
    """In a child process: swap `a` (a directory) and `spare` (a link to `b`) with renameat2(RENAME_EXCHANGE)."""
    import ctypes

    pid = os.fork()
    if pid:
        return pid
    try:  # pragma: no cover - the child
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        while libc.renameat2(fd, b"a", fd, b"spare", 2) == 0:
            pass
    finally:
        os._exit(0)


@pytest.fixture
def swapping(tmp_path):
    """A rootfs whose `/a` flips between a directory holding `f` and a link to `b` (holding another `f`)."""
    import signal

    root = tmp_path / "rootfs"
    (root / "a").mkdir(parents=True)
    (root / "a/f").write_text("dir state\n")
    (root / "b").mkdir()
    (root / "b/f").write_text("link state\n")
    (root / "spare").symlink_to("b")
    answers = {"dir": (root / "a/f").stat(), "link": (root / "b/f").stat()}
    pid = _exchange_forever(str(root))
    for _ in range(50000):  # the swapping has begun before the lookups do
        if (root / "a").is_symlink():
            break
    yield root, {k: (st.st_dev, st.st_ino) for k, st in answers.items()}
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


SWAP_LOOKUPS = 3000


def test_a_component_swapped_while_the_string_walk_resolves(swapping):
    """Every answer is the directory's or the link's, or the one-line 'changed while resolving': never an OSError."""
    import time

    root, _ = swapping
    allowed = {f"{root}/a/f", f"{root}/b/f"}
    seen: dict[str, int] = {}
    start = time.monotonic()
    for _ in range(SWAP_LOOKUPS):
        try:
            got = resolve_in_root(str(root), "/a/f")
        except RootPathError as e:  # only when it kept changing: the kinds of both states are no error
            got = "error"
            assert e.errno == errno.ELOOP and "changed while resolving" in str(e)
        assert got in allowed or got == "error"
        seen[got] = seen.get(got, 0) + 1
    assert time.monotonic() - start < 10
    assert set(allowed) <= set(seen)  # both states were seen: the swap ran while resolving


@pytest.mark.parametrize("kind", ["openat2", "walk", "hidden"])
def test_a_component_swapped_while_rootfs_resolves(swapping, kind):
    import time

    from pyxis_hook.rootfs import HIDDEN, RootFS

    root, answers = swapping
    kw = {"hidden": HIDDEN} if kind == "hidden" else {"use_openat2": kind == "openat2"}
    seen: dict[str, int] = {}
    start = time.monotonic()
    with RootFS(str(root), **kw) as r:
        for i in range(SWAP_LOOKUPS):
            try:
                if i % 2:
                    fd, real = r.locate("/a/f")
                    assert real in ("/a/f", "/b/f")
                else:
                    fd = r.open("/a/f", posix.O_RDONLY)
            except RootPathError as e:  # only when it kept changing: the kinds of both states are no error
                seen["error"] = seen.get("error", 0) + 1
                assert e.errno == errno.ELOOP and "changed while resolving" in str(e)
                continue
            got = _ident(fd)
            state = next(k for k, v in answers.items() if v == got)  # StopIteration: neither state's file
            seen[state] = seen.get(state, 0) + 1
    assert time.monotonic() - start < 10
    assert {"dir", "link"} <= set(seen)
