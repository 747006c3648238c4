"""NVIDIA container-toolkit advisories, each tried against the hook by an image under real runc.

One test per advisory (docs/security.md lists the classes): the image, or a
process racing the hook in the rootfs, does exactly what that advisory's
exploit did.  Before and after: the host's paths the shape aims at (the
driver root, /etc/ld.so.cache, /usr/lib/x86_64-linux-gnu, /, a host directory
standing in for any other, the bundle's parent) are fingerprinted and must
be unchanged, and nothing may be mounted on the host below the test's dirs.
The start itself either works with everything landing inside the rootfs,
or fails with one `pyxis-hook: error:` line.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from faults.rig import fault_hook, host_and_image, hook_errors, mounts_under, start
from fixtures.overlay import overlay

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow]

GPU = ("NVIDIA_VISIBLE_DEVICES=0",)
LIBDIR = "usr/lib/x86_64-linux-gnu"
PROBE = "/usr/bin/gputest"

EVIL_C = r"""
#include <fcntl.h>
#include <unistd.h>
__attribute__((constructor)) static void evil(void) {
    int fd = open("MARKER", O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) { write(fd, "loaded\n", 7); close(fd); }
}
"""


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A fake GPU host (confs per ld.so.cache mode), one image, a host directory standing in for
    any host dir an escape would reach, and a host marker path an escaped process would write."""
    base = tmp_path_factory.mktemp("cve")
    host, confs, image = host_and_image(base)
    canary = base / "hostdir"
    canary.mkdir()
    (canary / "libcuda.so.999.1").write_text("host file\n")
    (canary / "shadow").write_text("root:secret\n")
    return host, confs, image, canary, base / "marker"


def _fingerprint(paths) -> dict:
    """For each (path, deep): deep, every entry below it by mode, size, inode, mtime and link
    target; shallow (/, /usr/lib/x86_64-linux-gnu, /etc/ld.so.cache, dirs others write in
    meanwhile), the entry and its direct entries by name, type and link target."""
    out = {}
    for top, deep in paths:
        entries = [top]
        if deep:
            entries += [os.path.join(d, n) for d, dirs, files in os.walk(top) for n in dirs + files]
        elif os.path.isdir(top) and not os.path.islink(top):
            entries += [os.path.join(top, n) for n in os.listdir(top)]
        for p in entries:
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            link = os.readlink(p) if stat.S_ISLNK(st.st_mode) else None
            out[p] = (st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, link) if deep else (stat.S_IFMT(st.st_mode), link)
    return out


def _attack(world, tmp_path, prepare, *, mode: str = "merge", env=GPU, racer: str = "", script: str = PROBE):
    """Start a container whose image `prepare(lower)` made hostile (on a copy of the image), with
    `racer` (a shell loop) running in the rootfs while the hook runs; assert the host unchanged."""
    host, confs, image, canary, marker = world
    lower = tmp_path / "image"
    tmp_path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(image), str(lower)], check=True)
    prepare(lower)
    watched = [(str(host.driver_root), True), ("/etc/ld.so.cache", False), ("/usr/lib/x86_64-linux-gnu", False),
               ("/", False), (str(canary), True), (str(tmp_path), False)]
    where = tmp_path / "run"
    where.mkdir()
    before = _fingerprint(watched)
    with overlay(lower, where) as (rootfs, _layer):
        mounts = mounts_under(tmp_path)
        hook = fault_hook(confs[mode])
        if racer:
            _with_racer(hook, rootfs, racer)
        r = start(where, rootfs, hook, env, script)
        subprocess.run(["pkill", "-F", str(where / "racer.pid")], capture_output=True) if racer else None
        assert mounts_under(tmp_path) == mounts, "a mount leaked onto the host"
    assert _fingerprint(watched) == before, "a host path changed"
    assert not marker.exists(), "code of the image ran on the host"
    assert not [m for m in mounts_under(host.base.parent) if str(canary) in m]
    assert "Traceback" not in r.stderr
    if "error running hook" in r.stderr:  # refused: by us, in one line
        assert len(hook_errors(r.stderr)) == 1, r.stderr
    return r


def _with_racer(hook: dict, rootfs: Path, loop: str) -> None:
    """Run `loop` (in the rootfs's dir, on the host) in the background from the hook's start on.

    The hook's argv is wrapped in a shell that starts the racer first:
    exactly a process of a multi-container job changing the shared rootfs
    while the hook works.  The racer's pid goes to racer.pid beside it.
    """
    racer = f"cd {rootfs} && ( {loop} ) >/dev/null 2>&1 & echo $! > {rootfs.parent}/racer.pid"
    argv = hook["args"]
    hook["path"] = "/bin/sh"
    hook["args"] = ["sh", "-c", f'{racer}; exec "$@"', "sh", *argv]


def _evil_lib(where: Path, marker: Path) -> Path:
    """A library whose constructor appends to `marker`: loaded anywhere, it leaves a trace there."""
    src = where / "evil.c"
    where.mkdir(parents=True, exist_ok=True)
    src.write_text(EVIL_C.replace("MARKER", str(marker)))
    out = where / "libevil.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(src)], check=True)
    src.unlink()
    return out


def test_CVE_2024_0132_mount_target_flipped_between_dir_and_host_symlink(world, tmp_path):
    """The TOCTOU of the CLI: a path checked as the image's directory is a symlink to the host
    by the time it is mounted on.  Here the lib dir flips in a tight loop while the hook runs."""
    canary = world[3]

    def prepare(lower):
        (lower / "usr/lib/x86_64-linux-gnu.real").mkdir()

    flip = (f"while :; do mv {LIBDIR} {LIBDIR}.dir; ln -s {canary} {LIBDIR}; "
            f"rm {LIBDIR}; mv {LIBDIR}.dir {LIBDIR}; done")
    _attack(world, tmp_path, prepare, racer=flip, script="true")  # the racer still runs: the image is a wreck


def test_CVE_2024_0133_mount_points_under_a_link_to_the_host_create_nothing_there(world, tmp_path):
    """Mount-point creation through the image's links: /usr/bin (where nvidia-smi is mounted) and
    the lib dir are absolute links to a host dir; no empty file may appear there."""
    canary = world[3]

    def prepare(lower):
        for d in ("usr/bin", LIBDIR):
            subprocess.run(["rm", "-rf", str(lower / d)], check=True)
            (lower / d).symlink_to(canary)

    _attack(world, tmp_path, prepare, script="true")


def test_CVE_2024_0134_links_made_through_a_dir_link_to_root_stay_in_the_rootfs(world, tmp_path):
    """create-symlinks: the lib dir is `/` (absolute) or climbs out with `..`; the SONAME links
    the hook makes land inside the rootfs, never in the host's /."""
    for i, target in enumerate(("/", "../../../../../../../../..")):
        def prepare(lower, target=target):
            subprocess.run(["rm", "-rf", str(lower / LIBDIR)], check=True)
            (lower / LIBDIR).symlink_to(target)

        _attack(world, tmp_path / str(i), prepare, script="true")
        assert not os.path.lexists("/libcuda.so.1") and not os.path.lexists("/libnvidia-ml.so.1")


def test_CVE_2024_0135_the_images_ldconfig_is_never_run(world, tmp_path):
    """The image ships /sbin/ldconfig (and ldconfig.real) that would write on the host if run there."""
    marker = world[4]

    def prepare(lower):
        for name in ("sbin/ldconfig", "sbin/ldconfig.real", "usr/sbin/ldconfig"):
            p = lower / name
            if p.exists() or p.is_symlink():
                p.unlink()
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
            p.chmod(0o755)

    r = _attack(world, tmp_path, prepare, mode="ldconfig")
    assert r.rc == 0, r.stderr


def test_CVE_2024_0136_a_container_relative_ldconfig_setting_is_not_run_from_the_image(world, tmp_path):
    """The bulletin's mitigation: only a host ldconfig ('@' path).  A config naming a container path
    must not make the hook run the image's binary at that path."""
    host, confs, image, canary, marker = world
    conf = tmp_path / "pyxis.conf"
    conf.write_text(confs["ldconfig"].read_text() + 'ldconfig = "/sbin/ldconfig"\n')

    def prepare(lower):
        p = lower / "sbin/ldconfig"
        if p.exists() or p.is_symlink():
            p.unlink()
        p.write_text(f"#!/bin/sh\necho ran >> {marker}\n")
        p.chmod(0o755)

    _attack((host, {"ldconfig": conf}, image, canary, marker), tmp_path, prepare, mode="ldconfig")


def test_CVE_2024_0137_ldconfig_follows_no_link_out_of_the_rootfs(world, tmp_path):
    """The image's loader config leads the host ldconfig out: an include through /proc/self/root,
    a lib dir that is a link to a host dir with libraries in it.  ldconfig runs confined in the
    rootfs: no link or cache is made on the host, the host dir is not scanned into the cache."""
    canary = world[3]

    def prepare(lower):
        (lower / "etc/ld.so.conf.d").mkdir(exist_ok=True)
        (lower / "etc/ld.so.conf.d/escape.conf").write_text(f"/proc/self/root{canary}\n{canary}\n")
        (lower / "opt").mkdir(exist_ok=True)
        (lower / "opt/hostlib").symlink_to(canary)
        with open(lower / "etc/ld.so.conf", "a") as f:
            f.write("/opt/hostlib\ninclude /proc/self/root/etc/ld.so.conf\n")

    _attack(world, tmp_path, prepare, mode="ldconfig")


def test_CVE_2025_23266_ld_preload_of_the_image_never_loads_into_the_hook(world, tmp_path):
    """NVIDIAScape: LD_PRELOAD in the container's env naming a .so of the image, and
    /etc/ld.so.preload naming it: neither the hook nor the ldconfig it runs loads it."""
    marker = world[4]

    def prepare(lower):
        lib = _evil_lib(lower / "lib", marker)
        (lower / "etc/ld.so.preload").write_text(f"{lib}\n/lib/libevil.so\n")

    # the container's own processes load the image's preload (inside: the marker lands in the rootfs)
    env = (*GPU, "LD_PRELOAD=/lib/libevil.so", "PYTHONPATH=/evil", "PYTHONSTARTUP=/evil/x.py")
    for mode in ("merge", "ldconfig"):
        r = _attack(world, tmp_path / mode, prepare, mode=mode, env=env, script="true")
        assert r.rc == 0, r.stderr


def test_CVE_2025_23267_cache_and_conf_d_links_to_the_host_are_not_written_through(world, tmp_path):
    """update-ldcache link following: the image's /etc/ld.so.cache and ld.so.cache~ are links to
    host files, /etc/ld.so.conf.d a link to a host dir; both cache modes write only in the rootfs."""
    canary = world[3]

    def prepare(lower):
        (lower / "etc/ld.so.cache").unlink()
        (lower / "etc/ld.so.cache").symlink_to(canary / "shadow")
        (lower / "etc/ld.so.cache~").symlink_to(canary / "shadow")
        subprocess.run(["rm", "-rf", str(lower / "etc/ld.so.conf.d")], check=True)
        (lower / "etc/ld.so.conf.d").symlink_to(canary)

    for mode in ("merge", "ldconfig"):
        _attack(world, tmp_path / mode, prepare, mode=mode, script="true")


def test_CVE_2025_23359_compat_libs_linked_to_the_host_are_never_bound(world, tmp_path):
    """The 0132 fix's bypass: /usr/local/cuda/compat is a link to a host dir holding a
    libcuda.so.<newer>; nothing of it is mounted into the container, at most a loader conf line."""
    canary = world[3]

    def prepare(lower):
        (lower / "usr/local/cuda").mkdir(parents=True, exist_ok=True)
        (lower / "usr/local/cuda/compat").symlink_to(canary)

    r = _attack(world, tmp_path, prepare, script=f"grep -c {canary.name} /proc/self/mountinfo; ls /usr/local/cuda/compat/ 2>&1; true")
    assert r.rc == 0, r.stderr
    assert r.stdout.splitlines()[0] == "0", r.stdout  # nothing of the host dir mounted
    assert "libcuda.so.999.1" not in r.stdout  # the link resolves inside the rootfs: nothing there
