"""ctypes syscall wrappers against the running kernel (no mocks).

Namespace-changing checks run in a forked child so the test process keeps its
own mount namespace; the child reports failures through a pipe.
"""

from __future__ import annotations

import errno
import os
import posix  # what the modules under test call (they do not import os)

import pytest

from fixtures.forked import run_forked
from pyxis_hook import cabi
from pyxis_hook.kernel import lookup, mountapi, namespaces, process, syscall
from pyxis_hook.errors import ApplyError, InternalSignal


def test_errors_are_one_line_with_errno(tmp_path):
    with pytest.raises(syscall.SyscallError) as e:
        lookup.openat2(syscall.AT_FDCWD, str(tmp_path / "missing"), os.O_RDONLY)
    assert e.value.errno == errno.ENOENT
    assert isinstance(e.value, InternalSignal) and not isinstance(e.value, ApplyError)  # apply's child words it
    assert str(e.value) == f"open {tmp_path}/missing: No such file or directory"
    with pytest.raises(syscall.SyscallError, match="setns fd 9999: Bad file descriptor"):
        namespaces.setns(9999, namespaces.CLONE_NEWNS)


def test_probes_on_this_kernel():
    assert lookup.have_openat2() is True
    assert mountapi.have_new_mount_api() is True


def test_openat2_resolve_modes(tmp_path):
    root = tmp_path / "r"
    (root / "etc").mkdir(parents=True)
    (root / "etc/x").write_text("in root")
    (root / "abs").symlink_to("/")
    (root / "up").symlink_to("../../../..")
    rfd = os.open(root, os.O_PATH | os.O_DIRECTORY)
    try:
        for p in ("abs/etc/x", "up/etc/x", "/etc/x", "../../etc/x"):
            fd = lookup.openat2(rfd, p, os.O_RDONLY, 0, lookup.RESOLVE_IN_ROOT)
            assert os.read(fd, 100) == b"in root"
            os.close(fd)
        with pytest.raises(syscall.SyscallError) as e:
            lookup.openat2(rfd, "abs/etc/x", os.O_RDONLY, 0, lookup.RESOLVE_BENEATH)
        assert e.value.errno == errno.EXDEV
    finally:
        os.close(rfd)
    # magic links refused
    with pytest.raises(syscall.SyscallError) as e:
        lookup.openat2(syscall.AT_FDCWD, "/proc/self/root/etc/passwd", os.O_RDONLY, 0, lookup.RESOLVE_NO_MAGICLINKS)
    assert e.value.errno == errno.ELOOP


def _bind_case(tmp_path, body) -> None:
    """A host file `src` and a mount point `tgt`; `body(src, tgt, sfd, tfd)` runs in a child's private mount ns."""
    src = tmp_path / "src"
    src.write_text("host")
    tgt = tmp_path / "tgt"
    tgt.write_text("")

    def child():
        namespaces.unshare(namespaces.CLONE_NEWNS)
        mountapi.mount(None, "/", None, mountapi.MS_REC | mountapi.MS_PRIVATE)
        body(src, tgt, os.open(src, os.O_PATH), os.open(tgt, os.O_PATH | os.O_NOFOLLOW))

    run_forked(child)


def _options(tgt) -> set[str]:
    line = next(x for x in open("/proc/self/mountinfo") if x.split()[4] == str(tgt))
    return set(line.split()[5].split(","))


def test_no_new_privs():
    def child():
        process.no_new_privs()
        status = open("/proc/self/status").read()
        assert "NoNewPrivs:\t1" in status

    run_forked(child)


def _status_caps() -> dict[str, int]:
    """The Cap* lines of /proc/self/status as masks (the kernel's own report, to compare with)."""
    with open("/proc/self/status") as f:
        return {k: int(v, 16) for k, v in (line.split(":\t") for line in f.read().splitlines())
                if k.startswith("Cap")}


def test_cap_last_cap_is_procfs_without_procfs():
    with open("/proc/sys/kernel/cap_last_cap") as f:
        assert process.cap_last_cap() == int(f.read())


def test_capget_matches_proc_status():
    caps = _status_caps()
    assert process.capget() == (caps["CapEff"], caps["CapPrm"], caps["CapInh"])
    bounding = {c for c in range(process.cap_last_cap() + 1) if process.capbset_has(c)}
    assert sum(1 << c for c in bounding) == caps["CapBnd"]


def _header_nrs(path: str) -> dict[str, int]:
    import re

    with open(path) as f:
        return {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR_(\w+)\s+(\d+)\b", f.read())}


@pytest.mark.parametrize("arch,header", [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
                                         ("aarch64", "/usr/include/asm-generic/unistd.h")])
def test_arch_syscall_numbers_match_kernel_headers(arch, header):
    """The per-arch numbers are the kernel headers' (aarch64 uses the generic table)."""
    if not os.path.exists(header):
        pytest.skip(f"no {header}")
    nrs = _header_nrs(header)
    for name, nr in syscall.ARCH_NR[arch].items():
        assert nrs[name] == nr, (arch, name)
    for name, nr in syscall.GENERIC_NR.items():
        assert nrs[name] == nr, name


def test_every_arch_table_is_complete(monkeypatch):
    """ppc64le (arch/powerpc syscall.tbl) and the others name every per-arch syscall the wrappers use."""
    names = {"unshare", "setns", "mount", "umount2", "statx"}
    assert {"x86_64", "aarch64", "ppc64le"} <= set(syscall.ARCH_NR)
    for arch, table in syscall.ARCH_NR.items():
        assert set(table) == names, arch
    real = os.uname()
    monkeypatch.setattr(posix, "uname", lambda: os.uname_result(real[:4] + ("ppc64le",)))
    assert syscall.nr("setns") == 350 and syscall.nr("mount") == 21 and syscall.nr("open_tree") == 428
    assert syscall.nr("statx") == 383
    monkeypatch.setattr(posix, "uname", lambda: os.uname_result(real[:4] + ("s390x",)))
    with pytest.raises(ApplyError, match="unsupported architecture s390x"):
        syscall.nr("setns")


def _fdinfo_mount_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return int(next(line for line in f if line.startswith("mnt_id:")).split()[1])


@pytest.mark.parametrize("path", ["/", "/proc", "/dev", "/proc/self/fdinfo", "/sys"])
def test_mount_id_by_statx_is_the_fdinfo_one(path):
    """One statx where the kernel tells the mount id (Linux >= 5.8): the very id mountinfo and fdinfo show."""
    fd = os.open(path, os.O_PATH)
    try:
        got = lookup.mount_id(fd)
        assert got == _fdinfo_mount_id(fd) == lookup.mount_id(fd, "/proc/self")
        assert lookup.HAVE_STATX_MNT_ID in (True, False)
        if lookup.HAVE_STATX_MNT_ID:
            assert lookup._statx_mount_id(fd) == got
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", ["ENOSYS", "no mask bit"])
def test_mount_id_without_statx_reads_fdinfo(monkeypatch, how):
    """statx missing (before 4.11, a seccomp filter) or without STATX_MNT_ID (before 5.8): the fdinfo read, once
    decided for the process."""
    calls = []
    real = syscall.call

    def call(name, *args):
        if name != "statx":
            return real(name, *args)
        calls.append(name)
        if how == "ENOSYS":
            cabi.set_errno(errno.ENOSYS)
            return -1
        r = real(name, *args)
        lookup._STATX_ARGS[4][0] &= ~lookup.STATX_MNT_ID  # as a 5.7 kernel leaves stx_mask
        return r

    monkeypatch.setattr(syscall, "call", call)
    monkeypatch.setattr(lookup, "HAVE_STATX_MNT_ID", None)
    fd = os.open("/proc", os.O_PATH)
    try:
        assert lookup.mount_id(fd) == lookup.mount_id(fd) == _fdinfo_mount_id(fd)
    finally:
        os.close(fd)
    assert calls == ["statx"] and lookup.HAVE_STATX_MNT_ID is False


def test_path_arguments_are_fsencode(tmp_path):
    """A str encoded in place is what `fsencode` gives (undecodable bytes kept); bytes and PathLike too."""
    from pyxis_hook import pathnames

    for p in ("/dev/nvidia0", "/x/\udcff\u00e9", "", b"/raw\xff", tmp_path):
        assert syscall.encode_path(p) == pathnames.fsencode(p)
    assert syscall.encode_path(None) is None
    assert syscall.path_arg("") is syscall.path_arg("") and syscall.path_arg("").value == b""
    assert syscall.path_arg("/a").value == b"/a"
