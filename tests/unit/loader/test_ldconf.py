"""pyxis_hook.loader.ldconf's reader: one reader for the hook and ldcheck, bounded, blind to /proc and /sys.

glibc's ldconfig has no limits: a FIFO blocks it, a device node is opened
by root, an include loop recurses until its rlimits kill it.  The reader
stops at the first such thing and says which kind it was (`stop`); the
kinds in `UNSAFE` make the hook refuse the start (tests/test_apply.py).
The general parsing rules are tested in tests/test_ldcache.py and against
glibc's ldconfig in tests/oracles/.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from pyxis_hook.loader import conftree, ldconf
from pyxis_hook.loader.conftree import LIMIT, LOOP, MAX_ENTRIES, NOT_REGULAR
from pyxis_hook.loader.ldconf import MAX_FILES, MAX_INCLUDE_DEPTH, UnsafeLoaderConfig, read_ld_so_conf, require_safe
from pyxis_hook.rootfs import RootFS


def write(root: Path, path: str, text: str) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def read(root: Path, conf: str = "/etc/ld.so.conf") -> ldconf.LdSoConf:
    """The hook's read (through a RootFS) and ldcheck's (by root directory): one reader, one answer."""
    by_dir = read_ld_so_conf(str(root), conf)
    with RootFS(str(root)) as rfs:
        assert read_ld_so_conf(str(root), conf, rfs=rfs) == by_dir
    return by_dir


def test_fifo_as_ld_so_conf_is_refused_at_once(tmp_path, no_hang):
    (tmp_path / "etc").mkdir()
    os.mkfifo(tmp_path / "etc/ld.so.conf")
    conf = read(tmp_path)
    assert conf.stop == NOT_REGULAR and conf.unsafe and conf.files_read == ()
    assert conf.problems == (f"/etc/ld.so.conf (in {tmp_path}): a FIFO, not a configuration file",)
    with RootFS(str(tmp_path)) as rfs, pytest.raises(UnsafeLoaderConfig) as e:
        require_safe(rfs)
    assert str(e.value) == ("ld.so.cache not updated: the image's loader configuration is refused: "
                            f"/etc/ld.so.conf (in {tmp_path}): a FIFO, not a configuration file")


def test_include_loop_stops_at_once(tmp_path):
    """`include /etc/ld.so.conf` twice: glibc's ldconfig spins until RLIMIT_CPU; the reader stops at once."""
    write(tmp_path, "/etc/ld.so.conf", "/opt/a\ninclude /etc/ld.so.conf /etc/ld.so.conf\n/opt/b\n")
    conf = read(tmp_path)
    assert conf.stop == LOOP and conf.unsafe
    assert conf.files_read == ("/etc/ld.so.conf",) and conf.dirs == ("/opt/a",)
    assert conf.problems == (f"/etc/ld.so.conf (in {tmp_path}) (included at /etc/ld.so.conf:2): "
                             "includes itself (an include loop)",)
    # through another file and a link: the same inode is the loop, whatever its name
    write(tmp_path, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    write(tmp_path, "/etc/ld.so.conf.d/a.conf", "include ../top.conf\n")
    os.symlink("ld.so.conf", tmp_path / "etc/top.conf")
    conf = read(tmp_path)
    assert conf.stop == LOOP and conf.files_read == ("/etc/ld.so.conf", "/etc/ld.so.conf.d/a.conf")
    assert "/etc/top.conf" in conf.problems[0]


def test_a_file_included_twice_is_no_loop(tmp_path):
    write(tmp_path, "/etc/ld.so.conf", "include /etc/x.conf\ninclude /etc/x.conf /etc/y.conf\n")
    write(tmp_path, "/etc/x.conf", "/opt/x\ninclude /etc/y.conf\n")
    write(tmp_path, "/etc/y.conf", "/opt/y\n")
    conf = read(tmp_path)
    assert conf.stop == "" and not conf.truncated and conf.dirs == ("/opt/x", "/opt/y")
    assert conf.files_read == ("/etc/ld.so.conf", "/etc/x.conf", "/etc/y.conf", "/etc/x.conf", "/etc/y.conf",
                               "/etc/y.conf")


def test_depth_and_count_limits(tmp_path):
    for i in range(MAX_INCLUDE_DEPTH + 5):
        write(tmp_path, f"/etc/chain/{i}.conf", f"/opt/{i}\ninclude {i + 1}.conf\n")
    conf = read(tmp_path, "/etc/chain/0.conf")
    assert conf.stop == LIMIT and conf.unsafe and len(conf.dirs) == MAX_INCLUDE_DEPTH + 1
    assert f"nested more than {MAX_INCLUDE_DEPTH} deep" in conf.problems[0]

    write(tmp_path, "/etc/ld.so.conf", "include /etc/empty.conf\n" * (MAX_FILES + 10))
    write(tmp_path, "/etc/empty.conf", "")
    conf = read(tmp_path)
    assert conf.stop == LIMIT and len(conf.files_read) == MAX_FILES
    assert f"more than {MAX_FILES} configuration files" in conf.problems[0]


def test_glob_work_is_bounded(tmp_path, no_hang):
    """300 lines of `include /*/*/*/*/*/*` over a tree that looks 10^5 entries wide: a refusal at the budget.

    Ten links back to their own directory make every level ten times wider,
    as a real image's /usr does with a few thousand entries.
    """
    (tmp_path / "d").mkdir()
    for i in range(10):
        os.symlink("/d", tmp_path / f"d/l{i}")
    write(tmp_path, "/etc/ld.so.conf", "/opt/first\n" + "include /*/*/*/*/*/*\n" * 300)
    conf = read(tmp_path)
    assert conf.stop == LIMIT and conf.unsafe and conf.dirs == ("/opt/first",)
    assert conf.problems == (f"include patterns in {tmp_path} look at more than {MAX_ENTRIES} paths and "
                             "directory entries",)


def test_time_is_bounded(tmp_path, monkeypatch):
    write(tmp_path, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    write(tmp_path, "/etc/ld.so.conf.d/a.conf", "/opt/a\n")
    monkeypatch.setattr(conftree, "MAX_SECONDS", -1.0)  # a read whose deadline has already passed
    conf = read(tmp_path)
    assert conf.stop == LIMIT and "took more than" in conf.problems[0]


def test_the_images_own_proc_dir_is_absent(tmp_path):
    """ldcheck on an unpacked image: a /proc/kmsg file there is no more read than the kernel's would be."""
    write(tmp_path, "/proc/kmsg", "/opt/from-proc\n")
    write(tmp_path, "/sys/x.conf", "/opt/from-sys\n")
    write(tmp_path, "/etc/link.conf", "")
    os.unlink(tmp_path / "etc/link.conf")
    os.symlink("../proc/kmsg", tmp_path / "etc/link.conf")
    write(tmp_path, "/etc/ld.so.conf", "include /proc/kmsg\ninclude /sys/*.conf /etc/link.conf\ninclude /*/kmsg\n"
                                       "/opt/a\n")
    conf = read(tmp_path)
    assert conf.stop == "" and conf.dirs == ("/opt/a",) and conf.files_read == ("/etc/ld.so.conf",)
    assert conf.unmatched_includes == (("/etc/ld.so.conf", 1, "/proc/kmsg"), ("/etc/ld.so.conf", 2, "/sys/*.conf"),
                                       ("/etc/ld.so.conf", 3, "/*/kmsg"))


@pytest.fixture
def live_proc_and_sys(tmp_path):
    """A rootfs with procfs and sysfs mounted, as the runtime has made it when prestart hooks run."""
    root = tmp_path / "rootfs"
    for d, fstype in (("proc", "proc"), ("sys", "sysfs")):
        (root / d).mkdir(parents=True)
        subprocess.run(["mount", "-t", fstype, fstype, str(root / d)], check=True)
    try:
        yield root
    finally:
        for d in ("proc", "sys"):
            subprocess.run(["umount", "-l", str(root / d)], check=True)


def test_dotdot_stays_at_the_root_and_names_are_resolved(tmp_path):
    """`..` above the root is the root (as in the kernel); an included file is named under its real directory,
    so a relative include does not grow `../../../..` at every level."""
    write(tmp_path, "/etc/ld.so.conf", "include ../../../../etc/ld.so.conf.d/*.conf\n")
    write(tmp_path, "/etc/ld.so.conf.d/a.conf", "include ../../../../opt/conf/*.conf\n")
    write(tmp_path, "/opt/conf/b.conf", "/opt/b\ninclude ../../../../../opt/more/c.conf\n")
    write(tmp_path, "/opt/more/c.conf", "/opt/c\n")
    conf = read(tmp_path)
    assert conf.stop == "" and conf.dirs == ("/opt/b", "/opt/c")
    assert conf.files_read == ("/etc/ld.so.conf", "/etc/ld.so.conf.d/a.conf", "/opt/conf/b.conf", "/opt/more/c.conf")


def test_dotdot_glob_of_etc_is_a_loop_not_a_growing_path(tmp_path):
    """`include ../../../../etc/*` in /etc/ld.so.conf matches itself: a loop at once, every name without `..`."""
    write(tmp_path, "/etc/hostname", "node1\n")
    write(tmp_path, "/etc/ld.so.conf", "include ../../../../etc/*\n")
    write(tmp_path, "/etc/ld.so.conf.d/a.conf", "include ../../../../etc/*\n")
    conf = read(tmp_path)
    assert conf.stop == LOOP
    assert conf.files_read == ("/etc/ld.so.conf", "/etc/hostname")
    assert all(".." not in name for name in conf.files_read)


def test_relative_include_in_a_linked_file_starts_at_the_links_directory(tmp_path):
    """glibc joins a relative pattern to the including file's name as globbed: the link's directory."""
    write(tmp_path, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    write(tmp_path, "/opt/real/r.conf", "include sub.conf\n")
    write(tmp_path, "/opt/real/sub.conf", "/opt/wrong\n")
    write(tmp_path, "/etc/ld.so.conf.d/sub.conf", "/opt/right\n")
    os.symlink("/opt/real/r.conf", tmp_path / "etc/ld.so.conf.d/link.conf")
    conf = read(tmp_path)
    assert conf.dirs == ("/opt/right",)
    assert conf.files_read == ("/etc/ld.so.conf", "/etc/ld.so.conf.d/link.conf", "/etc/ld.so.conf.d/sub.conf",
                               "/etc/ld.so.conf.d/sub.conf")


def test_a_bracket_pattern_where_fnmatch_cannot_load_reads_on_wider(tmp_path, monkeypatch, no_hang):
    """In apply's child (no imports) a `[...]` pattern is matched wider, not skipped: the result is no model
    for the merge (`UNMODELLED`), and every file the pattern could reach was still checked."""
    import sys

    monkeypatch.setitem(sys.modules, "fnmatch", None)  # `import fnmatch` raises ImportError, as after setns
    write(tmp_path, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/[a-m]*.conf\n/opt/after\n")
    write(tmp_path, "/etc/ld.so.conf.d/a.conf", "/opt/a\n")
    conf = read(tmp_path)
    assert conf.stop == conftree.UNMODELLED and not conf.unsafe and conf.dirs == ("/opt/a", "/opt/after")
    assert "bracket expression" in conf.problems[0]
    os.mkfifo(tmp_path / "etc/ld.so.conf.d/n.conf")  # outside [a-m]: glibc would not match it; checked anyway
    assert read(tmp_path).stop == NOT_REGULAR


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_held_directories_serve_their_entries_and_are_closed_after(tmp_path):
    """`include /etc/ld.so.conf.d/*.conf` walks to the directory once; what it holds open is closed by the end.

    A conf file opened in the held directory is named as the walk would name
    it; a link among them still goes through the walk (its target's inode,
    the link's name), and a FIFO there is still refused before it is opened.
    """
    write(tmp_path, "/etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\ninclude /etc/ld.so.conf.d/z.conf\n")
    write(tmp_path, "/etc/ld.so.conf.d/a.conf", "/opt/a\n")
    write(tmp_path, "/opt/real/r.conf", "/opt/r\n")
    os.symlink("/opt/real/r.conf", tmp_path / "etc/ld.so.conf.d/b.conf")
    write(tmp_path, "/etc/ld.so.conf.d/z.conf", "/opt/z\n")
    before = _open_fds()
    conf = read(tmp_path)
    assert _open_fds() == before
    assert conf.stop == "" and conf.dirs == ("/opt/a", "/opt/r", "/opt/z")
    assert conf.files_read == ("/etc/ld.so.conf", "/etc/ld.so.conf.d/a.conf", "/etc/ld.so.conf.d/b.conf",
                               "/etc/ld.so.conf.d/z.conf", "/etc/ld.so.conf.d/z.conf")
    os.mkfifo(tmp_path / "etc/ld.so.conf.d/c.conf")
    assert read(tmp_path).stop == NOT_REGULAR
    assert _open_fds() == before


def test_held_directories_are_bounded(tmp_path, monkeypatch):
    """More matched directories than MAX_HELD: the rest are walked to again, the answer is the same."""
    lines = []
    for i in range(conftree.MAX_HELD + 4):
        write(tmp_path, f"/etc/d{i:02}/x/a.conf", f"/opt/{i}\n")
    lines.append("include /etc/d*/x/*.conf\n")
    write(tmp_path, "/etc/ld.so.conf", "".join(lines))
    before = _open_fds()
    conf = read(tmp_path)
    assert _open_fds() == before
    assert conf.dirs == tuple(f"/opt/{i}" for i in range(conftree.MAX_HELD + 4))
    monkeypatch.setattr(conftree, "MAX_HELD", 0)
    assert read(tmp_path) == conf


def test_a_literal_prefix_is_one_lookup_resolved_as_its_components(tmp_path):
    """`/etc/ld.so.conf.d` in a pattern is looked up at once: a link, `..` above the root and a masked
    /proc on the way give what resolving each component would."""
    write(tmp_path, "/srv/conf.d/a.conf", "/opt/a\n")
    os.symlink("../srv", tmp_path / "etc-link")
    write(tmp_path, "/proc/conf.d/p.conf", "/opt/proc\n")
    write(tmp_path, "/etc/ld.so.conf", "include /etc-link/conf.d/*.conf\ninclude /../../srv/./conf.d/*.conf\n"
                                       "include /etc/../proc/conf.d/*.conf\ninclude /etc/missing/dir/*.conf\n")
    conf = read(tmp_path)
    assert conf.dirs == ("/opt/a",) and conf.stop == ""
    assert conf.files_read == ("/etc/ld.so.conf", "/srv/conf.d/a.conf", "/srv/conf.d/a.conf")
    assert [u[2] for u in conf.unmatched_includes] == ["/etc/../proc/conf.d/*.conf", "/etc/missing/dir/*.conf"]


def test_a_name_listed_twice_is_looked_up_once(tmp_path, monkeypatch):
    """dirs_by_inode asks each name once and hands each name's identity to `seen`."""
    (tmp_path / "usr/lib").mkdir(parents=True)
    os.symlink("usr/lib", tmp_path / "lib")
    asked = []
    real = ldconf.dir_identity
    monkeypatch.setattr(ldconf, "dir_identity", lambda where, d: asked.append(d) or real(where, d))
    seen: dict = {}
    with RootFS(str(tmp_path)) as rfs:
        got = ldconf.dirs_by_inode(rfs, ("/lib", "/usr/lib", "/lib", "/missing", "/usr/lib"), seen)
    st = os.stat(tmp_path / "usr/lib")
    assert got == {(st.st_dev, st.st_ino): "/lib"}
    assert asked == ["/lib", "/usr/lib", "/missing"]
    assert seen == {"/lib": (st.st_dev, st.st_ino), "/usr/lib": (st.st_dev, st.st_ino), "/missing": None}
