"""rootpin: the rootfs is the mount the runtime made in the container's namespace (or its pivoted root).

Stand-ins for a container init (root): `unshare -m` + `mount --bind ROOTFS
ROOTFS` is runc/crun before pivot_root (both bind-mount the rootfs onto
itself, tests/e2e/test_rootpin.py checks the real ones); `unshare -m --root`
is a container process whose root directory already is the rootfs.  The name
is then re-pointed as whoever can write the bundle could.
"""

from __future__ import annotations

import os
import shutil

import pytest
from hypothesis import given, strategies as st

from fixtures.standin import start_standin

from pyxis_hook.apply.mounttable import mount_line, mount_points
from pyxis_hook.apply.rootpin import runtime_mount_problem

LIBDIR = "/usr/lib/x86_64-linux-gnu"


# ------------------------------------------------------------ the rule itself (no kernel)


def test_the_runtimes_bind_mount_is_the_rootfs():
    assert runtime_mount_problem("/b/rootfs", True, ["/", "/proc", "/b/rootfs", "/b/rootfs/proc"].count,
                                 ["/", "/proc"].count) is None


def test_a_bind_stacked_on_a_host_mount_is_the_rootfs():
    """podman: the overlay is a host mount at the path, the runtime's bind sits on its copy."""
    assert runtime_mount_problem("/m/merged", True, ["/", "/m/merged", "/m/merged"].count,
                                 ["/", "/m/merged"].count) is None


@pytest.mark.parametrize("point, is_root, words", [
    ("/", True, "also in the hook's own mount namespace"),
    ("/home", True, "also in the hook's own mount namespace"),
    ("/b/rootfs/dev", True, "lies below /b/rootfs"),
    ("/b/rootfs", False, "not that mount's root"),
])
def test_anything_else_is_refused_with_the_reason(point, is_root, words):
    theirs = ["/", "/home", "/b/rootfs", "/b/rootfs/dev"]
    ours = ["/", "/home"]
    assert words in runtime_mount_problem(point, is_root, theirs.count, ours.count)


_FIELD = st.text(alphabet="/abc\\0", min_size=1, max_size=6)  # fields hold no raw space: the kernel escapes it


@given(st.lists(st.tuples(_FIELD, _FIELD), min_size=1, max_size=12), _FIELD)
def test_a_mountinfo_line_and_its_mount_point(rows, other):
    """The fifth field is the point: not the root (fourth), the options, or the source after the separator."""
    lines = [f"{i} 1 0:{i} {root} {where} rw,{other} shared:1 - ext4 {other} rw"
             for i, (root, where) in enumerate(rows, start=20)]
    text = "\n".join(lines) + "\n"
    assert mount_points(text) == [where for _root, where in rows]
    for i, line in enumerate(lines, start=20):
        assert mount_line(text, str(i)) == line
    assert mount_line(text, "2") is None and mount_line(text, "0") is None


# ------------------------------------------------------------ stand-in containers (root)


@pytest.fixture
def start():
    """Start container stand-ins (`fixtures.standin`); all are killed at the end of the test."""
    procs = []

    def run(script: str) -> int:
        procs.append(start_standin(script))
        return procs[-1].pid

    yield run
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def bundle(tmp_path):
    """A bundle dir with rootfs/ (an image: etc/, the lib dir, busybox as sleep) and a host dir beside it."""
    root = tmp_path / "bundle/rootfs"
    for d in ("etc", LIBDIR.lstrip("/"), "bin", "dev"):
        (root / d).mkdir(parents=True)
    (root / "etc/marker").write_text("image\n")
    shutil.copy2(shutil.which("busybox") or "/bin/busybox", root / "bin/sleep")
    canary = tmp_path / "host-dir"
    (canary / LIBDIR.lstrip("/")).mkdir(parents=True)
    (canary / "etc").mkdir()
    (canary / "etc/marker").write_text("host\n")
    return root, canary


@pytest.fixture
def runtime_like(bundle, start):
    """A container init as runc/crun leave it for prestart: the rootfs bind-mounted onto itself, before pivot_root."""
    root, _canary = bundle
    return start(f"mount --bind {root} {root} && mount -t tmpfs none {root}/dev && exec sleep 600")


def _repoint(root, canary) -> None:
    """What the bundle's owner can do after the runtime mounted the rootfs: `rootfs` becomes a link elsewhere."""
    root.rename(root.with_name("real"))
    root.symlink_to(canary)


def _tree(d) -> dict:
    return {os.path.join(p, n): os.lstat(os.path.join(p, n)).st_mtime_ns
            for p, ds, fs in os.walk(d) for n in ds + fs}


# ------------------------------------------------------------ apply works on the pinned fd only


