"""The confined ldconfig run: host binary from a sealed memfd, chrooted, namespaced, limited.

Oracles: glibc's own `ldconfig -p -C <cache>` reads back what the confined run
wrote; static helper programs built with gcc stand in for a failing or hanging
ldconfig.
"""

from __future__ import annotations

import os
import posix  # what the modules under test call (they do not import os)
import shutil
import subprocess
from pathlib import Path

import pytest


from fixtures.forked import run_forked
from fixtures.synth import build_lib
from pyxis_hook.apply import confined
from pyxis_hook.kernel import mountapi, process
from pyxis_hook.apply.child import _NoImports
from pyxis_hook.errors import ApplyError

pytestmark = pytest.mark.root

LIBDIR = "usr/lib/x86_64-linux-gnu"


def _static(tmp_path: Path, name: str, source: str) -> Path:
    src = tmp_path / f"{name}.c"
    src.write_text(source)
    out = tmp_path / name
    subprocess.run(["gcc", "-static", "-O0", str(src), "-o", str(out)], check=True, capture_output=True)
    return out


@pytest.fixture
def rootfs(tmp_path):
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "opt/vendor").mkdir(parents=True)
    build_lib(root / LIBDIR, "libcuda.so.1", filename="libcuda.so.535.104.05")
    build_lib(root / "opt/vendor", "libvendor.so.2", filename="libvendor.so.2.0")
    (root / "etc/ld.so.conf").write_text("/opt/vendor\n")
    return root


def _listing(root: Path) -> str:
    return subprocess.run(["ldconfig", "-p", "-C", str(root / "etc/ld.so.cache")], check=True,
                          capture_output=True, text=True).stdout


def test_sealed_copy_refuses_scripts_and_dirs(tmp_path):
    script = tmp_path / "ldconfig"
    script.write_text("#!/bin/sh\nexit 0\n")
    with pytest.raises(ApplyError, match="not an ELF"):
        confined.sealed_copy(str(script))
    with pytest.raises(ApplyError, match="not a regular file"):
        confined.sealed_copy(str(tmp_path))
    with pytest.raises(ApplyError, match="No such file"):
        confined.sealed_copy(str(tmp_path / "none"))


def test_sealed_copy_is_sealed():
    fd = confined.sealed_copy("/sbin/ldconfig")
    try:
        with pytest.raises(OSError):
            os.write(fd, b"x")
        with pytest.raises(OSError):
            os.ftruncate(fd, 0)
        assert os.pread(fd, 4, 0) == b"\x7fELF"
    finally:
        os.close(fd)


def test_ldconfig_indexes_cmdline_and_conf_dirs(rootfs):
    exe = confined.sealed_copy("/sbin/ldconfig")
    try:
        confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    out = _listing(rootfs)
    assert f"libcuda.so.1 (libc6,x86-64) => /{LIBDIR}/libcuda.so.1" in out
    assert "libvendor.so.2 (libc6,x86-64) => /opt/vendor/libvendor.so.2" in out
    # SONAME links were made by ldconfig, inside the rootfs
    assert os.readlink(rootfs / LIBDIR / "libcuda.so.1") == "libcuda.so.535.104.05"


def test_image_without_ld_so_conf_still_gets_cache(rootfs):
    (rootfs / "etc/ld.so.conf").unlink()
    exe = confined.sealed_copy("/sbin/ldconfig")
    try:
        err = confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    assert "libcuda.so.1" in _listing(rootfs)
    assert err == ""


def test_image_ldconfig_never_runs_and_hostile_conf_reaches_nothing(rootfs, tmp_path):
    marker = tmp_path / "marker"
    evil = f"#!/bin/sh\necho pwned > {marker}\necho pwned > /marker\n"
    for p in ("sbin/ldconfig", "usr/sbin/ldconfig", "sbin/ldconfig.real", "bin/sh"):
        f = rootfs / p
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(evil)
        f.chmod(0o755)
    # the image's conf points through live procfs at the host's root
    (rootfs / "proc").mkdir()
    subprocess.run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], check=True)
    try:
        (rootfs / "etc/ld.so.conf").write_text(
            "include /proc/1/root/etc/ld.so.conf.d/*.conf\n/proc/1/root/usr/lib/x86_64-linux-gnu\n"
            "/proc/self/root/usr/lib/x86_64-linux-gnu\n")
        host_dir = Path("/usr/lib/x86_64-linux-gnu")
        before = sorted(os.listdir(host_dir))
        exe = confined.sealed_copy("/sbin/ldconfig")
        try:
            confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
        finally:
            os.close(exe)
        assert sorted(os.listdir(host_dir)) == before
    finally:
        subprocess.run(["umount", "-l", str(rootfs / "proc")], check=True)
    out = _listing(rootfs)
    assert "libcuda.so.1" in out
    assert "libc.so.6" not in out  # the host's libc was never reachable
    assert not marker.exists() and not (rootfs / "marker").exists()


def test_environment_is_empty_and_limits_set(rootfs, tmp_path):
    prog = _static(tmp_path, "probe", r'''
#include <stdio.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
    struct rlimit r; int n = 0;
    for (char **e = environ; *e; e++) n++;
    getrlimit(RLIMIT_NOFILE, &r);
    fprintf(stderr, "env=%d nofile=%ld nnp=%d pid=%d argv1=%s\n", n, (long)r.rlim_cur,
            prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), (int)getpid(), argv[1]);
    return 0;
}
''')
    exe = confined.sealed_copy(str(prog))
    try:
        os.environ["LD_PRELOAD"] = "/evil.so"
        err = confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.environ.pop("LD_PRELOAD", None)
        os.close(exe)
    assert err.strip() == "env=0 nofile=64 nnp=1 pid=1 argv1=-f"


def test_failure_and_timeout_are_one_line(rootfs, tmp_path):
    fail = _static(tmp_path, "fail", '#include <stdio.h>\nint main(void){fputs("first\\nbad conf\\n", stderr);'
                   'return 3;}\n')
    exe = confined.sealed_copy(str(fail))
    try:
        with pytest.raises(ApplyError) as e:
            confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    msg = str(e.value)
    assert "exit code 3" in msg and "bad conf" in msg and "\n" not in msg

    hang = _static(tmp_path, "hang", "#include <unistd.h>\nint main(void){for(;;) pause();}\n")
    exe = confined.sealed_copy(str(hang))
    try:
        with pytest.raises(ApplyError, match="no result after 1 s"):
            confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR], timeout=1)
    finally:
        os.close(exe)


def test_relative_lib_dir_refused(rootfs):
    with pytest.raises(ApplyError, match="not an absolute"):
        confined.run_ldconfig(str(rootfs), 0, ["usr/lib"])


def test_without_pidfd_the_wait_polls(rootfs, tmp_path, monkeypatch):
    """Kernels < 5.3 (ENOSYS) or a seccomp filter (EPERM): same results through waitpid(WNOHANG)."""
    import errno

    asked = []

    def no_pidfd(pid, *_a):
        asked.append(pid)
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(posix, "pidfd_open", no_pidfd)
    exe = confined.sealed_copy("/sbin/ldconfig")
    try:
        confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    assert "libcuda.so.1" in _listing(rootfs)
    assert asked, "run_ldconfig never asked for a pidfd: the poll path did not run"
    fail = _static(tmp_path, "fail", '#include <stdio.h>\nint main(void){fputs("bad conf\\n", stderr);return 3;}\n')
    hang = _static(tmp_path, "hang", "#include <unistd.h>\nint main(void){for(;;) pause();}\n")
    for prog, match, timeout in ((fail, "exit code 3: bad conf", 30), (hang, "no result after 1 s", 1)):
        exe = confined.sealed_copy(str(prog))
        try:
            with pytest.raises(ApplyError, match=match):
                confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR], timeout=timeout)
        finally:
            os.close(exe)


def test_runner_is_killed_and_reaped_when_waiting_fails(rootfs, tmp_path, monkeypatch):
    """Nothing keeps running (and writing the cache) after run_ldconfig has given up."""
    import errno

    hang = _static(tmp_path, "hang", "#include <unistd.h>\nint main(void){for(;;) pause();}\n")
    seen = []

    def broken_wait(pid, _errr, _timeout):
        seen.append(pid)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(confined, "_wait", broken_wait)
    exe = confined.sealed_copy(str(hang))
    try:
        with pytest.raises(ApplyError, match="waiting for it failed") as e:
            confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    assert "\n" not in str(e.value)
    with pytest.raises(ChildProcessError):  # already reaped: no runner left behind
        os.waitpid(seen[0], os.WNOHANG)


# ------------------------------------------------------------------ capabilities

#: prints what the exec'd program holds; /proc is masked in the chroot, so it asks the kernel
_CAP_PROBE = r'''
#include <stdio.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <linux/capability.h>
int main(void) {
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    unsigned long long bnd = 0, amb = 0;
    if (syscall(SYS_capget, &h, d) != 0) { perror("capget"); return 2; }
    for (int c = 0; c < 64 && prctl(PR_CAPBSET_READ, c, 0, 0, 0) >= 0; c++) {
        if (prctl(PR_CAPBSET_READ, c, 0, 0, 0) == 1) bnd |= 1ULL << c;
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, c, 0, 0) == 1) amb |= 1ULL << c;
    }
    fprintf(stderr, "eff=%llx prm=%llx inh=%llx bnd=%llx amb=%llx nnp=%d uid=%d\n",
            d[0].effective | (unsigned long long)d[1].effective << 32,
            d[0].permitted | (unsigned long long)d[1].permitted << 32,
            d[0].inheritable | (unsigned long long)d[1].inheritable << 32,
            bnd, amb, prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), (int)getuid());
    return 0;
}
'''

CAP_NET_RAW = 13
PR_CAP_AMBIENT_RAISE = 2
DAC, FOWNER = 1 << process.CAP_DAC_OVERRIDE, 1 << process.CAP_FOWNER


def _probe_fields(text: str) -> dict[str, int]:
    fields = dict(kv.split("=") for kv in text.split())
    return {k: int(v, 10 if k in ("nnp", "uid") else 16) for k, v in fields.items()}


def test_kept_set_is_exactly_dac_override_and_fowner():
    assert confined.KEEP_CAPS == DAC | FOWNER


def test_exec_holds_only_the_kept_caps(rootfs, tmp_path):
    """Effective = permitted = bounding = the kept set; inheritable and ambient empty; NNP set.

    The caller is given an ambient capability and a full inheritable set
    first: neither may reach ldconfig.
    """
    probe = _static(tmp_path, "capprobe", _CAP_PROBE)
    eff, prm, _inh = process.capget()

    def run() -> str:
        process.capset(eff, prm, prm)
        process.prctl(process.PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_RAW)
        exe = confined.sealed_copy(str(probe))
        try:
            return confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
        finally:
            os.close(exe)

    got = _probe_fields(run_forked(run))
    bounding = sum(1 << c for c in range(process.cap_last_cap() + 1) if process.capbset_has(c))
    keep = confined.KEEP_CAPS & prm & bounding
    assert keep == DAC | FOWNER  # this test machine's root has both
    assert got == {"eff": keep, "prm": keep, "inh": 0, "bnd": keep, "amb": 0, "nnp": 1, "uid": 0}


def test_exec_as_rootfs_owner_holds_no_caps(rootfs, tmp_path):
    """A rootless image's owner runs ldconfig with nothing; its bounding set is the kept one too."""
    probe = _static(tmp_path, "capprobe", _CAP_PROBE)
    subprocess.run(["chown", "-R", "100000:100000", str(rootfs)], check=True)
    exe = confined.sealed_copy(str(probe))
    try:
        err = confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR], owner=(100000, 100000))
    finally:
        os.close(exe)
    assert _probe_fields(err) == {"eff": 0, "prm": 0, "inh": 0, "bnd": DAC | FOWNER, "amb": 0, "nnp": 1,
                                  "uid": 100000}


def _oracle_listing(tmp_path: Path, rootfs: Path) -> str:
    """What the host's ldconfig, unconfined (`-r`), makes of an identical copy of `rootfs`."""
    copy = tmp_path / "oracle"
    shutil.copytree(rootfs, copy, symlinks=True)
    subprocess.run(["ldconfig", "-r", str(copy), "-f", "/etc/ld.so.conf", "-C", "/etc/ld.so.cache",
                    "/" + LIBDIR], check=True, capture_output=True)
    return _listing(copy)


@pytest.mark.parametrize("how", ["root-owned", "root-owned 0555 dirs", "chowned 100000",
                                 "chowned 100000, run as owner", "chowned 100000, leftover temp file",
                                 "chowned 100000, sticky dir, stale link"])
def test_real_ldconfig_still_rebuilds_the_cache(rootfs, tmp_path, how):
    """With only the kept caps, glibc's ldconfig writes the cache and links as it does unconfined."""
    owner = None
    if how.startswith("root-owned 0555"):  # Fedora's dr-xr-xr-x /usr/lib64: even root needs DAC_OVERRIDE
        (rootfs / LIBDIR).chmod(0o555)
        (rootfs / "etc").chmod(0o555)
    if how.startswith("chowned"):
        subprocess.run(["chown", "-R", "100000:100000", str(rootfs)], check=True)
    if how.endswith("run as owner"):
        owner = (100000, 100000)
    if how.endswith("leftover temp file"):  # ldconfig chmods it: another uid's file needs CAP_FOWNER
        (rootfs / "etc/ld.so.cache~").write_bytes(b"old")
        os.chown(rootfs / "etc/ld.so.cache~", 100000, 100000)
    if how.endswith("stale link"):  # replacing another uid's link in a sticky dir needs CAP_FOWNER
        (rootfs / LIBDIR).chmod(0o1777)
        os.symlink("gone", rootfs / LIBDIR / "libcuda.so.1")
        os.lchown(rootfs / LIBDIR / "libcuda.so.1", 100000, 100000)
    want = _oracle_listing(tmp_path, rootfs)
    exe = confined.sealed_copy("/sbin/ldconfig")
    try:
        err = confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR], owner=owner)
    finally:
        os.close(exe)
    assert err == ""
    out = _listing(rootfs)
    assert out.splitlines()[1:] == want.splitlines()[1:]  # the first line names the cache file
    assert f"libcuda.so.1 (libc6,x86-64) => /{LIBDIR}/libcuda.so.1" in out
    assert "libvendor.so.2 (libc6,x86-64) => /opt/vendor/libvendor.so.2" in out
    assert os.readlink(rootfs / LIBDIR / "libcuda.so.1") == "libcuda.so.535.104.05"
    assert os.readlink(rootfs / "opt/vendor/libvendor.so.2") == "libvendor.so.2.0"


@pytest.mark.parametrize("without, how, message", [
    (DAC, "chowned", "Can't link"),
    (DAC, "0555 dirs", "Can't link"),
    (FOWNER, "leftover temp file", "Changing access rights of /etc/ld.so.cache~"),
])
def test_each_kept_cap_is_needed(rootfs, monkeypatch, without, how, message):
    """Minimal, not just sufficient: without either kept cap some image breaks ldconfig."""
    if how == "0555 dirs":
        (rootfs / LIBDIR).chmod(0o555)
        (rootfs / "etc").chmod(0o555)
    else:
        subprocess.run(["chown", "-R", "100000:100000", str(rootfs)], check=True)
    if how == "leftover temp file":
        (rootfs / "etc/ld.so.cache~").write_bytes(b"old")
        os.chown(rootfs / "etc/ld.so.cache~", 100000, 100000)
    monkeypatch.setattr(confined, "KEEP_CAPS", confined.KEEP_CAPS & ~without)  # read by the forked child
    exe = confined.sealed_copy("/sbin/ldconfig")
    try:
        with pytest.raises(ApplyError, match=message):
            confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)


def test_confined_imports_nothing_at_run_time(rootfs, tmp_path):
    """apply's child refuses imports after setns: the capability drop must not need any."""
    import sys

    probe = _static(tmp_path, "capprobe", _CAP_PROBE)

    def run() -> str:
        sys.meta_path.insert(0, _NoImports)  # the guard apply's child runs under
        exe = confined.sealed_copy(str(probe))
        try:
            return confined.run_ldconfig(str(rootfs), exe, ["/" + LIBDIR])
        finally:
            os.close(exe)

    out = run_forked(run)
    assert out.startswith("eff="), out


# ------------------------------------------------------------------ no device node of the image opens

#: opens each device node the test put in the rootfs, reading one byte: "ok" or the errno's name
_DEV_PROBE = r'''
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
int main(void) {
    const char *paths[] = {"/zero", "/dev/zero", "/etc/ld.so.conf"};
    for (int i = 0; i < 3; i++) {
        char c;
        int fd = open(paths[i], O_RDONLY);
        fprintf(stderr, "%s=%s\n", paths[i], fd >= 0 && read(fd, &c, 1) == 1 ? "ok" : strerror(errno));
        if (fd >= 0) close(fd);
    }
    return 0;
}
'''


@pytest.fixture
def devices_in_rootfs(rootfs):
    """/dev/zero's major:minor as nodes of the image: on its own filesystem and on a tmpfs mounted under it."""
    import stat

    zero = os.makedev(1, 5)
    os.mknod(rootfs / "zero", stat.S_IFCHR | 0o666, zero)
    (rootfs / "dev").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(rootfs / "dev")], check=True)
    try:
        os.mknod(rootfs / "dev/zero", stat.S_IFCHR | 0o666, zero)
        (rootfs / "etc/ld.so.conf").unlink()
        (rootfs / "etc/ld.so.conf").symlink_to("/dev/zero")
        yield rootfs
    finally:
        subprocess.run(["umount", "-l", str(rootfs / "dev")], check=True)


@pytest.mark.parametrize("api", ["new", "legacy"])
def test_no_device_node_of_the_image_can_be_opened(devices_in_rootfs, tmp_path, monkeypatch, api):
    """ldconfig's rootfs is a nodev copy (mounts under it too): every device node of the image is EACCES."""
    if api == "legacy":  # kernels < 5.12: recursive bind + a bind remount per mount (read by the forked child)
        monkeypatch.setattr(mountapi, "HAVE_NEW_MOUNT_API", False)
    probe = _static(tmp_path, "devprobe", _DEV_PROBE)
    with open("/proc/self/mountinfo") as f:
        before = f.read()
    exe = confined.sealed_copy(str(probe))
    try:
        err = confined.run_ldconfig(str(devices_in_rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    assert err.splitlines() == ["/zero=Permission denied", "/dev/zero=Permission denied",
                           "/etc/ld.so.conf=Permission denied"]
    with open("/proc/self/mountinfo") as f:
        assert f.read() == before  # the nodev copy lived in ldconfig's namespace only
    assert os.stat(devices_in_rootfs / "dev/zero").st_rdev == os.makedev(1, 5)


def test_real_ldconfig_skips_a_device_as_its_configuration(devices_in_rootfs):
    """/etc/ld.so.conf -> /dev/zero: glibc's ldconfig cannot open it (nodev), warns, and indexes the rest.

    Without the nodev view it read /dev/zero until RLIMIT_AS stopped it.
    """
    exe = confined.sealed_copy("/sbin/ldconfig")
    try:
        err = confined.run_ldconfig(str(devices_in_rootfs), exe, ["/" + LIBDIR])
    finally:
        os.close(exe)
    assert "ignoring configuration file that cannot be opened: /etc/ld.so.conf: Permission denied" in err, err
    assert "libcuda.so.1" in _listing(devices_in_rootfs)
