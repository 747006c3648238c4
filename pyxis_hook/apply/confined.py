"""Run the host's ldconfig inside a container rootfs without trusting anything in it.

ldconfig must see the container's files (its ld.so.conf, its library dirs) but
runs with our privileges, so it is boxed in (docs/security.md; the
CVE-2025-23267 / CVE-2024-0136 class):

- the binary is the *host's*, opened before any namespace is entered and
  copied into a sealed memfd (NCT 1.17.3 "virtual copy ... before fexecve"),
  then exec'd from that fd: nothing the image holds, not even its
  `/sbin/ldconfig`, is ever executed, and a swap of the host file after the
  check changes nothing.  Scripts (Ubuntu's wrapper) are refused: an fd exec
  of a script would need the interpreter from the rootfs.
- a runner child (the caller is already in the container's mount namespace)
  unshares new mount/IPC/UTS/NET/PID namespaces, makes `/`
  rprivate and forks ldconfig as pid 1 of the new PID namespace; that one
  chroots into the rootfs through an fd, hides the live `/proc` and `/sys`
  under empty read-only tmpfs (so `include /proc/1/root/...` in a hostile
  ld.so.conf reaches nothing of the host), sets rlimits, drops capabilities
  (below), drops to the rootfs owner when that is not root, sets
  PR_SET_NO_NEW_PRIVS and execs with an empty environment.  All of that
  happens in namespaces nothing else shares.  The rootfs it chroots into is
  a nodev copy of the rootfs's mounts (`_nodev_view`), so no device node of
  the image can be opened by it, whatever its configuration names.
- ldconfig parses what the image controls (every library's ELF headers,
  ld.so.conf and its includes) as root, so a parser bug must not hand over
  root's full power.  Once the privileged setup is done (unshare, chroot,
  mounts, rlimits) and before the exec, every capability but `KEEP_CAPS`
  (CAP_DAC_OVERRIDE, CAP_FOWNER: what writing the cache and the SONAME links
  needs where root does not own the tree, or its dirs are mode 555) leaves
  the bounding set, the ambient set is emptied, and effective = permitted =
  the kept set, inheritable empty.  An exec as root gets inheritable |
  bounding, so nothing dropped comes back; NO_NEW_PRIVS stops file caps and
  setuid binaries.  Gone are CAP_SYS_ADMIN (mount, setns: the way out of
  these namespaces), CAP_SYS_CHROOT, CAP_DAC_READ_SEARCH
  (open_by_handle_at), CAP_MKNOD, CAP_SETUID, CAP_SYS_PTRACE and the rest.
  Run as the rootfs owner (rootless images), ldconfig holds none at all.
  All of it is done with names resolved at import: apply's child, already
  in the container's mount namespace, refuses any import.
- a wall-clock timeout (plus RLIMIT_CPU) kills it; a non-zero exit is an
  ApplyError carrying the tail of ldconfig's stderr.

An image without `/etc/ld.so.conf` (musl, distroless) still gets `-f
/etc/ld.so.conf`: glibc's ldconfig treats a missing configuration file as
empty without a message or error (measured, glibc 2.36), indexes the dirs on
its command line plus its trusted dirs, and creates the SONAME links there.
"""

from __future__ import annotations

import errno
import posix
import stat
from _signal import SIGKILL  # the C module, not signal.py and its enums (docs/decisions/2026-12-07-start-costs.md)

from pyxis_hook import pathnames
from pyxis_hook.kernel import lookup, mountapi, namespaces, process, syscall
from pyxis_hook.errors import ApplyError
from pyxis_hook.rootfs import HIDDEN

#: The capabilities ldconfig keeps (a bit mask).  It writes /etc/ld.so.cache~, chmods it 0644,
#: renames it over /etc/ld.so.cache and replaces SONAME links in the library dirs: as root with
#: no capability that works only where uid 0 owns those dirs and they are writable by their owner.
#: CAP_DAC_OVERRIDE covers a rootfs owned by another uid (rootless images unpacked by a user, a
#: chowned tree) and read-only-mode dirs (Fedora's dr-xr-xr-x /usr/lib64); CAP_FOWNER covers the
#: chmod of a leftover ld.so.cache~ that another uid owns (and unlinks in sticky dirs).  Not kept:
#: CAP_DAC_READ_SEARCH (DAC_OVERRIDE already reads and searches everything; what it adds is
#: open_by_handle_at, the "shocker" way out of a container), CAP_CHOWN (ldconfig chowns nothing), and
#: everything else (SYS_ADMIN, SYS_CHROOT, MKNOD, SETUID, NET_*, ...).  tests/root/test_confined.py
#: shows each kept one is needed.
KEEP_CAPS = 1 << process.CAP_DAC_OVERRIDE | 1 << process.CAP_FOWNER

#: (resource, limit) applied to ldconfig; FSIZE leaves room for large images' caches
RLIMITS = (
    (process.RLIMIT_CPU, 10),
    (process.RLIMIT_AS, 2 << 30),
    (process.RLIMIT_NOFILE, 64),
    (process.RLIMIT_FSIZE, 64 << 20),
    (process.RLIMIT_CORE, 0),
)

DEFAULT_TIMEOUT = 30.0
STDERR_LIMIT = 16384

#: memfd seals: no writes, no resizing, no removing the seals
_SEALS = process.F_SEAL_SEAL | process.F_SEAL_SHRINK | process.F_SEAL_GROW | process.F_SEAL_WRITE


def sealed_copy(host_path: str) -> int:
    """Open a host ELF executable and return a sealed, close-on-exec memfd holding a copy of it."""
    try:
        src = posix.open(host_path, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NOCTTY)
    except OSError as e:
        raise ApplyError(f"ldconfig {host_path}: {e.strerror}") from None
    try:
        return sealed_copy_from_fd(src, host_path)
    finally:
        posix.close(src)


def sealed_copy_from_fd(src: int, what: str) -> int:
    """The sealed memfd copy of the executable open as `src` (named `what` in errors).

    Needs no filesystem: apply's child, already in the container's mount
    namespace, copies the host binary it opened before entering.
    """
    try:
        st = posix.fstat(src)
        if not stat.S_ISREG(st.st_mode):
            raise ApplyError(f"ldconfig {what}: not a regular file")
        if posix.pread(src, 4, 0) != b"\x7fELF":
            raise ApplyError(f"ldconfig {what}: not an ELF executable (a wrapper script? use ldconfig.real)")
        mfd = posix.memfd_create("ldconfig", posix.MFD_CLOEXEC | getattr(posix, "MFD_ALLOW_SEALING", 2))
        try:
            offset = 0
            while offset < st.st_size:
                n = posix.sendfile(mfd, src, offset, st.st_size - offset)
                if n == 0:
                    break
                offset += n
            posix.fchmod(mfd, 0o555)
            process.add_seals(mfd, _SEALS)
        except BaseException:
            posix.close(mfd)
            raise
        return mfd
    except OSError as e:
        raise ApplyError(f"ldconfig {what}: cannot copy: {e.strerror}") from None


def ldconfig_argv(lib_dirs: tuple[str, ...] | list[str], conf: str = "/etc/ld.so.conf",
                  cache: str = "/etc/ld.so.cache") -> list[str]:
    """The command line, as libnvidia-container builds it (`src/nvc_ldcache.c`).

    Order matters: glibc's ldconfig scans its command-line dirs first, in
    the order given, before ld.so.conf's, and among equal cache entries
    the first scanned wins.  The plan puts CUDA's compat dir first in
    `lib_dirs` when it is used (`plan.cuda_compat`), as libnvidia-container
    adds it to its ldconfig call.
    """
    return ["ldconfig", "-f", conf, "-C", cache, *lib_dirs]


def run_ldconfig(rootfs: str, exe_fd: int, lib_dirs: tuple[str, ...] | list[str], *,
                 root_fd: int | None = None, owner: tuple[int, int] | None = None,
                 timeout: float = DEFAULT_TIMEOUT, host_devs: frozenset[str] = frozenset()) -> str:
    """Run the sealed ldconfig `exe_fd` chrooted into `rootfs`; return its stderr (warnings).

    The caller is inside the container's mount namespace, whose /dev may be
    the image's once the runtime has pivoted (Apptainer's OCI engine), so
    no device is opened by name: the runner's stdin is an empty pipe (EOF)
    and its stdout joins stderr (ldconfig prints nothing there with this argv).  The
    runner never outlives this call: whatever goes wrong while waiting, it
    is SIGKILLed and reaped before the ApplyError, so it cannot write the
    cache after the caller rolled back.  The rootfs is opened by name *after* the new mount
    namespace exists (an fd from before would pin the old namespace's mount,
    and chroot through it would make every later mount fail with EINVAL);
    `root_fd`, when given, is the caller's fd of the same directory and the
    reopened one must be the same inode, so a swapped path is refused.
    `host_devs`: the host's filesystems (`hostdirs.HostDirs.host_devices`);
    a mount under the rootfs on one of them is a host directory bound in,
    and is read-only in ldconfig's view, so its SONAME links never land there.
    """
    label = rootfs
    argv = ldconfig_argv(lib_dirs)
    for d in lib_dirs:
        if not d.startswith("/") or "\0" in d:
            raise ApplyError(f"ldconfig: library dir {d!r} is not an absolute container path")
    errr, errw = posix.pipe2(posix.O_CLOEXEC)
    stdin, eof = posix.pipe2(posix.O_CLOEXEC)  # the runner's stdin: its write end closed at once
    posix.close(eof)
    pid = posix.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        try:
            posix.close(errr)
            _runner(rootfs, root_fd, exe_fd, argv, owner, errw, stdin, host_devs)
        except BaseException as e:  # noqa: BLE001 - report anything, exit
            try:
                posix.write(errw, f"pyxis-hook: ldconfig setup: {e}\n".encode())
            except OSError:
                pass
        posix._exit(127)
    posix.close(errw)
    posix.close(stdin)
    try:
        status, err = _wait(pid, errr, timeout)
    except BaseException as e:
        _kill_and_reap(pid)
        if isinstance(e, Exception):
            raise ApplyError(f"ldconfig in {label}: waiting for it failed ({e}); killed") from None
        raise
    finally:
        posix.close(errr)
    text = err.decode("utf-8", "replace")
    if status is None:
        raise ApplyError(f"ldconfig in {label}: no result after {timeout:g} s, killed")
    if status != 0:
        tail = " | ".join(line for line in text.strip().splitlines()[-3:]) or "no message"
        raise ApplyError(f"ldconfig in {label} failed with exit code {status}: {tail}")
    return text


def _kill_and_reap(pid: int) -> None:
    """SIGKILL the runner (its pid-1 ldconfig dies with it: PDEATHSIG) and wait for it; never raises."""
    try:
        posix.kill(pid, SIGKILL)
    except OSError:
        pass
    while True:
        try:
            posix.waitpid(pid, 0)
            return
        except InterruptedError:
            continue
        except OSError:  # ECHILD: already reaped
            return


#: how often the fallback without a pidfd looks whether the runner has exited
_POLL_INTERVAL = 0.02


def _wait(pid: int, errr: int, timeout: float) -> tuple[int | None, bytes]:
    """Collect stderr while waiting for `pid`; a None status means it was killed at the timeout.

    A pidfd makes the exit pollable with the pipe; where pidfd_open is not
    available (kernel < 5.3: ENOSYS, or refused by a seccomp filter: EPERM)
    the same loop polls the pipe in short slices and asks waitpid(WNOHANG).
    """
    import time

    try:
        pidfd: int | None = posix.pidfd_open(pid)
    except (OSError, AttributeError):
        pidfd = None
    watched = [errr] if pidfd is None else [errr, pidfd]
    buf = b""
    deadline = time.monotonic() + timeout
    exited = timed_out = False
    reaped: int | None = None
    pipe_open = True
    try:
        while not exited:
            if pidfd is None:
                done, wstatus = posix.waitpid(pid, posix.WNOHANG)
                if done:
                    reaped, exited = wstatus, True
                    break
            left = deadline - time.monotonic()
            if left <= 0:
                posix.kill(pid, SIGKILL)  # its pid-1 child dies with it (PDEATHSIG)
                timed_out = True
                break
            slice_s = left if pidfd is not None else min(left, _POLL_INTERVAL)
            for fd, _ev in process.poll(watched, int(slice_s * 1000) + 1):
                if fd == pidfd:
                    exited = True
                elif pipe_open:
                    chunk = posix.read(errr, 4096)
                    if not chunk:
                        watched.remove(errr)
                        pipe_open = False
                    buf = (buf + chunk)[-STDERR_LIMIT:]
        # drain what is left; bounded, in case a killed grandchild lingers a moment
        drain_deadline = time.monotonic() + 2.0
        while pipe_open and time.monotonic() < drain_deadline:
            if not process.poll([errr], 200):
                continue
            chunk = posix.read(errr, 4096)
            if not chunk:
                break
            buf = (buf + chunk)[-STDERR_LIMIT:]
    finally:
        if pidfd is not None:
            posix.close(pidfd)
    if reaped is None:
        _, wstatus = posix.waitpid(pid, 0)
    else:
        wstatus = reaped
    if timed_out:
        return None, buf
    if posix.WIFEXITED(wstatus):
        return posix.WEXITSTATUS(wstatus), buf
    return 128 + posix.WTERMSIG(wstatus), buf


def _runner(rootfs, root_fd, exe_fd, argv, owner, errw, stdin, host_devs) -> None:  # pragma: no cover - child
    """In the forked child: unshare, fork ldconfig as pid 1 and relay its exit status."""
    posix.dup2(stdin, 0)
    posix.dup2(errw, 1)
    posix.dup2(errw, 2)
    process.prctl(process.PR_SET_PDEATHSIG, SIGKILL)
    if root_fd is None:
        root_fd = posix.open(rootfs, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    expect = posix.fstat(root_fd)
    flags = namespaces.CLONE_NEWNS | namespaces.CLONE_NEWIPC | namespaces.CLONE_NEWUTS | namespaces.CLONE_NEWPID
    namespaces.unshare(flags)
    try:
        namespaces.unshare(namespaces.CLONE_NEWNET)
    except syscall.SyscallError:
        pass  # not essential: ldconfig opens no sockets
    mountapi.mount(None, "/", None, mountapi.MS_REC | mountapi.MS_PRIVATE, what="/ (make rprivate)")
    root_fd = posix.open(rootfs, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
    st = posix.fstat(root_fd)
    if (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
        raise ApplyError(f"{rootfs}: changed while preparing ldconfig")
    root_fd = _nodev_view(rootfs, root_fd, host_devs)
    st = posix.fstat(root_fd)
    if (st.st_dev, st.st_ino) != (expect.st_dev, expect.st_ino):
        raise ApplyError(f"{rootfs}: changed while preparing ldconfig")
    child = posix.fork()
    if child == 0:
        try:
            _exec_ldconfig(root_fd, exe_fd, argv, owner)
        except BaseException as e:  # noqa: BLE001
            try:
                posix.write(2, f"pyxis-hook: ldconfig setup: {e}\n".encode())
            except OSError:
                pass
        posix._exit(127)
    while True:
        try:
            _, wstatus = posix.waitpid(child, 0)
            break
        except InterruptedError:
            continue
    if posix.WIFSIGNALED(wstatus):
        posix.write(2, f"ldconfig killed by signal {posix.WTERMSIG(wstatus)}\n".encode())
        posix._exit(128 + posix.WTERMSIG(wstatus))
    posix._exit(posix.WEXITSTATUS(wstatus))


#: statvfs flags a bind remount must repeat (it resets the per-mount flags it is not given)
_KEPT_FLAGS = ((posix.ST_RDONLY, mountapi.MS_RDONLY), (posix.ST_NOSUID, mountapi.MS_NOSUID), (posix.ST_NOEXEC, mountapi.MS_NOEXEC),
               (posix.ST_NOATIME, mountapi.MS_NOATIME), (posix.ST_NODIRATIME, mountapi.MS_NODIRATIME),
               (posix.ST_RELATIME, mountapi.MS_RELATIME))


def _nodev_view(rootfs: str, root_fd: int, host_devs: frozenset[str] = frozenset()) -> int:  # pragma: no cover
    """Mount a nodev copy of the rootfs and every mount under it over the rootfs; return an fd of it.

    In the runner's private mount namespace only: ldconfig then cannot open
    any device node of the image (the kernel answers EACCES), whatever a
    configuration file, a library dir or a link names.  The hook runs in the
    host's device cgroup, where the container's device rules do not apply:
    without this a `/dev/zero` or a watchdog node under a conf.d name would
    be opened by root.  New mount API: one recursive clone with nodev set on
    all of it; older kernels: a recursive bind, then a bind remount of each
    mount under it that repeats the flags it had.  A mount below the rootfs
    on one of `host_devs` (a host directory bound in) is made read-only too.
    """
    real = pathnames.realpath(rootfs)
    if mountapi.have_new_mount_api():
        tree = mountapi.open_tree(root_fd, "", mountapi.OPEN_TREE_CLONE | mountapi.OPEN_TREE_CLOEXEC | syscall.AT_EMPTY_PATH
                                | mountapi.AT_RECURSIVE, what=f"{rootfs} (nodev view)")
        mountapi.mount_setattr(tree, "", syscall.AT_EMPTY_PATH | mountapi.AT_RECURSIVE, mountapi.MOUNT_ATTR_NODEV,
                             what=f"{rootfs} (nodev view)")
        mountapi.move_mount(tree, "", root_fd, "", mountapi.MOVE_MOUNT_F_EMPTY_PATH | mountapi.MOVE_MOUNT_T_EMPTY_PATH,
                          what=f"{rootfs} (nodev view)")
        posix.close(root_fd)
        if host_devs:
            for point, dev in _mounts_under(real):
                if point != real and dev in host_devs:
                    mountapi.mount_setattr(syscall.AT_FDCWD, point, 0, mountapi.MOUNT_ATTR_RDONLY,
                                         what=f"{point} (host directory, read-only for ldconfig)")
        return tree
    mountapi.mount(lookup.proc_fd_path(root_fd), rootfs, None, mountapi.MS_BIND | mountapi.MS_REC,
                 what=f"{rootfs} (nodev view)")
    posix.close(root_fd)
    for point, dev in _mounts_under(real):
        flags = mountapi.MS_REMOUNT | mountapi.MS_BIND | mountapi.MS_NODEV
        have = posix.statvfs(point).f_flag
        for st_flag, ms_flag in _KEPT_FLAGS:
            if have & st_flag:
                flags |= ms_flag
        if point != real and dev in host_devs:
            flags |= mountapi.MS_RDONLY
        mountapi.mount(None, point, None, flags, what=f"{point} (nodev view)")
    return posix.open(rootfs, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)


def _mounts_under(root: str) -> list[tuple[str, str]]:  # pragma: no cover - child
    """(mount point, major:minor of the mount on top there) at or below `root` in this namespace, parents first."""
    with open(lookup.proc_self_path("mountinfo"), "rb") as f:
        lines = f.read().splitlines()
    out: dict[str, str] = {}
    for line in lines:
        fields = line.split(b" ")
        if len(fields) < 5:
            continue
        point = _unescape(fields[4])
        if point == root or point.startswith(root.rstrip("/") + "/"):
            out[point] = fields[2].decode()  # a later line is a mount on top of an earlier one: its device counts
    return list(out.items())


def _unescape(field: bytes) -> str:
    """A mountinfo path: the kernel writes space, tab, newline and backslash as \\ooo octal."""
    out = bytearray()
    i = 0
    while i < len(field):
        if field[i] == 0x5C and i + 3 < len(field) and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return pathnames.fsdecode(bytes(out))


def _drop_bounding_and_ambient(keep: int) -> None:  # pragma: no cover - child
    """Remove every capability but `keep` from the bounding set, and empty the ambient set.

    The bounding set is what an exec as root may get back: it is dropped
    (with CAP_SETPCAP, itself dropped last) before the owner switch (which
    needs CAP_SETUID/CAP_SETGID) and the capset that lowers the rest.  Caps already out of the
    bounding set are skipped, so a caller without CAP_SETPCAP whose bounding
    set is already small enough still works.  The last cap comes from the
    kernel (PR_CAPBSET_READ), not /proc: procfs is masked in here.
    """
    last = process.cap_last_cap()
    drop = [c for c in range(last + 1) if not keep >> c & 1 and process.capbset_has(c)]
    if process.CAP_SETPCAP in drop:
        drop.remove(process.CAP_SETPCAP)
        drop.append(process.CAP_SETPCAP)
    for cap in drop:
        process.capbset_drop(cap)
    process.clear_ambient()


def _exec_ldconfig(root_fd, exe_fd, argv, owner) -> None:  # pragma: no cover - child
    """pid 1 of the new PID namespace: chroot, hide live procfs/sysfs, limit, drop, exec."""
    posix.fchdir(root_fd)
    posix.chroot(".")
    posix.chdir("/")
    for name in HIDDEN:  # the directories the readers of the image's facts leave out too
        d = "/" + name
        try:
            st = posix.lstat(d)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            mountapi.mount("tmpfs", d, "tmpfs",
                         mountapi.MS_RDONLY | mountapi.MS_NOSUID | mountapi.MS_NODEV | mountapi.MS_NOEXEC, "size=4k",
                         what=f"{d} (mask)")
    for res, value in RLIMITS:
        soft, hard = process.getrlimit(res)
        lim = value if hard == process.RLIM_INFINITY else min(value, hard)
        process.setrlimit(res, lim, lim)
    _drop_bounding_and_ambient(KEEP_CAPS)
    if owner and owner != (0, 0):
        posix.setgroups([])
        posix.setgid(owner[1])
        posix.setuid(owner[0])  # clears the permitted and effective sets (no SECBIT_KEEP_CAPS)
    # what is left of the kept set (none once no longer root); inheritable empty: after exec as
    # root the permitted set is inheritable | bounding, so nothing outside KEEP_CAPS comes back
    keep = KEEP_CAPS & process.capget()[1] if posix.getuid() == 0 else 0
    process.capset(keep, keep, 0)
    process.prctl(process.PR_SET_PDEATHSIG, SIGKILL)
    process.no_new_privs()
    posix.closerange(3, exe_fd)
    posix.closerange(exe_fd + 1, 65536)
    try:
        posix.execve(exe_fd, argv, {})
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise ApplyError("exec of the sealed ldconfig copy failed: ENOENT") from None
        raise
