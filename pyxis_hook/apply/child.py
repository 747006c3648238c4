"""Plan -> kernel: the only code that mounts, links and writes cgroup rules for a container.

Order (the plan's order): device binds, library/file binds, symlinks, the
/proc/driver/nvidia view, then the ld.so.cache refresh.  Device cgroup rules
are written last, from the host side, once all of that succeeded (the
cgroup is found and its devices.allow opened before, so a wrong cgroup
fails before anything is mounted); a v1 rule cannot be taken back, so
writing it last means a failed start never widened the cgroup.

Why a forked child does the namespace work: `setns(CLONE_NEWNS)` fails with
EINVAL in a multi-threaded process and changes the caller's view of the
filesystem for good.  A child of `fork()` is single-threaded whatever the
parent is (a test runner, a future CLI with a thread), it inherits the host
fds opened and checked before the fork, and when it exits the parent is
still on the host, so error reporting, logging and a second container work
as before.  The child sends one marshal'ed result up a pipe; the parent turns a
failure into one PyxisHookError line (the same class the child raised).

Safety rules kept here (docs/security.md):
- sources are host paths opened on the host *before* entering the container
  namespace and checked with fstat (regular file / directory / socket as the
  plan says; a char device with exactly the planned st_rdev, else "invalid
  device node"); they are mounted by fd, never re-resolved by name;
- the rootfs is the fd `rootpin` found in the container's mount namespace
  when the caller pinned one (prestart): the child never opens `plan.rootfs`
  by name then, so a `root.path` re-pointed since cannot lead it elsewhere;
- targets are resolved and created inside the rootfs by `rootfs.RootFS`
  (chroot semantics, O_NOFOLLOW creation), and mounted onto the target fd:
  open_tree(OPEN_TREE_CLONE) + mount_setattr(flags, MS_PRIVATE) + move_mount
  (atomic: no read-write window), or on kernels without the new mount API a
  bind + remount onto /proc/self/fd/N, checking the reopened target is the
  source inode;
- any failure undoes every mount (umount2 MNT_DETACH, newest first) and
  removes every mount point, directory and symlink created, so nothing is
  left behind; the ldconfig run comes last so its failure is undone too;
- nothing is imported after setns: a module imported by name then would be
  looked up in the container's mount namespace (after pivot_root, for the
  CDI hooks: the image's files), so apply_plan imports what the child needs.
"""

from __future__ import annotations

import errno
import marshal
import os
import stat
import sys
from _signal import SIGKILL  # the C module: signal.py's enums cost the hook ~4 ms a start

from pyxis_hook.host import gpus
from pyxis_hook.apply import kernel
from pyxis_hook import log
from pyxis_hook.errors import ApplyError, PathError, PyxisHookError
from pyxis_hook.plan.build import DEV_OPTIONS, PROC_OPTIONS, Plan
from pyxis_hook.record import record
from pyxis_hook.rootfs import Entry, RootFS, RootPathError

#: mount option -> (MOUNT_ATTR_* for mount_setattr, MS_* for the legacy remount); the values
#: happen to be equal, the two names are kept so each call site says which API it speaks
_FLAGS = {"ro": (kernel.MOUNT_ATTR_RDONLY, kernel.MS_RDONLY), "nosuid": (kernel.MOUNT_ATTR_NOSUID, kernel.MS_NOSUID),
          "nodev": (kernel.MOUNT_ATTR_NODEV, kernel.MS_NODEV), "noexec": (kernel.MOUNT_ATTR_NOEXEC, kernel.MS_NOEXEC)}

#: what a /proc/driver/nvidia file name in a plan may hold (no '/', checked again here: the plan is data)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-")


@record
class ApplyResult:
    """What was done, for the log and for tests."""

    mounted: tuple[str, ...] = ()
    symlinks: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()


@record
class _Bind:
    """One host source, opened and checked on the host, and where it goes.

    `tree` is a detached clone of the source made on the host with the final
    flags already set (new mount API), or -1 (legacy: the child binds by fd
    after checking the source is still the same inode).
    """

    container_path: str
    fd: int
    kind: str  # file | dir (mount point type)
    options: tuple[str, ...]
    host_path: str
    tree: int = -1
    covers: str = ""  # the plan's warning for a bind over a file of the image (MountEdit.covers)


def apply_plan(plan: Plan, pid: int | str, config=None, *, proc: str = "/proc", root=None) -> ApplyResult:
    """Apply `plan` to the container whose init is `pid` (in our PID namespace; "self": our own namespace).

    `root`: the rootfs pinned in the container's mount namespace
    (`rootpin.PinnedRoot`, prestart): the child works on that fd and never
    resolves `plan.rootfs` by name.  Without it (CDI and enroot hooks, tests)
    the child opens `plan.rootfs` in the container's mount namespace.
    Every decision is in the plan (`cgroup_mode`, `ldcache.ldconfig`):
    `config` is accepted for the design's signature and not read.  Every
    message is logged here, once.  Raises PathError/ApplyError with one
    line; on error nothing is left mounted or created in the rootfs and no
    cgroup rule was written.  The rules are written by the child, through
    the devices.allow fd opened here, after the mounts and links and before
    the ld.so.cache: a rule the kernel refuses undoes the mounts and links
    like any other failure.  (A refused rule leaves those before it, and a
    failed cache update the rules, in the cgroup of a container whose start
    fails: the runtime removes it.)
    """
    del config  # the plan says everything: apply never re-decides what the planner decided
    messages: list[str] = []
    if plan.empty and not plan.cgroup_rules and plan.ldcache.mode == "none":
        return ApplyResult()
    if plan.ldcache.mode != "none":
        _preload_ldcache_modules()
    fds: list[int] = []
    try:
        binds = _open_sources(plan, fds)
        gpu_dirs = _open_proc_sources(plan, fds, messages)
        if kernel.have_new_mount_api():
            # Clone on the host: a bind source must be a mount of the caller's namespace, and a
            # detached clone may then be moved into any namespace (the legacy path re-opens instead).
            binds = [_clone(b, fds) for b in binds]
            gpu_dirs = [_clone(b, fds) for b in gpu_dirs]
        try:
            owner_st = os.stat(f"{proc}/{pid}")
            ns_fd = os.open(f"{proc}/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            raise ApplyError(f"container process {pid}: {e.strerror}") from None
        fds.append(ns_fd)
        owner = (owner_st.st_uid, owner_st.st_gid)
        exe_fd = _ldconfig_fd(plan, fds)
        allow = _cgroup_target(plan, pid, proc, fds, messages) if plan.cgroup_rules else None
        result = _in_child(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow)
        messages += result["messages"]
    finally:
        for fd in fds:
            os.close(fd)
        for m in messages:
            if m.startswith("warning: "):
                log.warning(m[len("warning: "):])
            else:
                log.info(m)
    return ApplyResult(tuple(result["mounted"]), tuple(result["symlinks"]), tuple(messages))


def _preload_ldcache_modules() -> None:
    """Import on the host what the ld.so.cache step runs, so the child imports nothing after setns.

    After setns a name lookup is the container's: an import there could
    read (and run) the image's files, so the child refuses any (`_NoImports`).
    An internal error there is logged with `log.frames`, which needs no
    module and reads no file.
    """
    from pyxis_hook.loader import cachefile, ldconf, ldmerge  # noqa: F401
    from pyxis_hook.apply import confined  # noqa: F401


# ---------------------------------------------------------------- host side


def _host_ldconfig(plan: Plan) -> str:
    """The plan's host ldconfig: the planner sets it only from an '@' (host) `ldconfig` key."""
    if not plan.ldcache.ldconfig:
        raise ApplyError("ld.so.cache: the plan asks for ldconfig but names no host ldconfig binary "
                         "(the `ldconfig` key must name a host binary: '@/sbin/ldconfig')")
    return plan.ldcache.ldconfig


def _ldconfig_fd(plan: Plan, fds: list[int]) -> int | None:
    """The host ldconfig for the child: a sealed copy (mode ldconfig) or an O_RDONLY fd (merge's fallback).

    Merge normally succeeds, so it only opens the binary (microseconds);
    the child makes the sealed copy from that fd when it must fall back.
    """
    if plan.ldcache.mode == "ldconfig":
        from pyxis_hook.apply import confined

        fd = confined.sealed_copy(_host_ldconfig(plan))
    elif plan.ldcache.mode == "merge" and plan.ldcache.ldconfig:
        path = _host_ldconfig(plan)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY)
        except OSError as e:
            raise ApplyError(f"ldconfig {path}: {e.strerror}") from None
    else:
        return None
    fds.append(fd)
    return fd


def _open_sources(plan: Plan, fds: list[int]) -> list[_Bind]:
    binds = []
    for d in plan.devices:
        fd = _open_host(d.host_path, fds)
        st = os.fstat(fd)
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != os.makedev(d.major, d.minor):
            got = f"{os.major(st.st_rdev)}:{os.minor(st.st_rdev)}" if stat.S_ISCHR(st.st_mode) else "not a char device"
            raise ApplyError(f"invalid device node {d.host_path}: expected c {d.major}:{d.minor}, found {got}")
        binds.append(_Bind(d.path, fd, "file", DEV_OPTIONS, d.host_path))
    for m in plan.mounts:
        fd = _open_host(m.host_path, fds)
        st = os.fstat(fd)
        want = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "socket": stat.S_ISSOCK}.get(m.kind)
        if want is None:
            raise ApplyError(f"mount of {m.host_path}: unknown kind {m.kind!r}")
        if not want(st.st_mode):
            raise ApplyError(f"unexpected source file mode for {m.host_path}: not a {m.kind}")
        binds.append(_Bind(m.container_path, fd, "dir" if m.kind == "dir" else "file", m.options, m.host_path,
                           covers=m.covers))
    return binds


def _clone(b: _Bind, fds: list[int]) -> _Bind:
    """open_tree(OPEN_TREE_CLONE) + mount_setattr(flags, MS_PRIVATE): a detached, final mount."""
    from pyxis_hook.record import replace

    attrs = 0
    for o in b.options:
        attrs |= _FLAGS.get(o, (0, 0))[0]
    tree = kernel.open_tree(b.fd, "", kernel.OPEN_TREE_CLONE | kernel.OPEN_TREE_CLOEXEC | kernel.AT_EMPTY_PATH,
                            what=b.host_path)
    fds.append(tree)
    kernel.mount_setattr(tree, "", kernel.AT_EMPTY_PATH, attrs, 0, kernel.MS_PRIVATE, what=b.host_path)
    return replace(b, tree=tree)


def _open_host(path: str, fds: list[int]) -> int:
    """O_PATH fd of a host source; host paths are trusted, symlinks among them (driver-root) are followed."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{path}: {e.strerror}") from None
    fds.append(fd)
    return fd


#: the name of a proc-view bind that is the host's whole gpus/ dir (bus ids never look like this)
ALL_GPUS = "gpus"


def _open_proc_sources(plan: Plan, fds: list[int], messages: list[str]) -> list[_Bind]:
    """The GPU dirs the /proc view binds: one per selected GPU, or one of the whole gpus/ dir.

    When the selection is every GPU the host lists (`all`, or a node's whole
    allocation), binding the host's gpus/ directory once shows the container
    the same entries as binding each one, for one mount instead of N (64 GPUs
    then cost at most 1.3x one GPU).  That dir is then the live procfs one: a GPU added to or
    removed from the host later shows there too.  The view is information
    only: what a container may open is decided by the device nodes and the
    cgroup, never by these dirs.
    """
    view = plan.proc_driver
    if view is None:
        return []
    for name, _content in view.files:
        if not name or not _NAME_CHARS.issuperset(name) or name in (".", ".."):
            raise ApplyError(f"/proc/driver/nvidia: bad file name {name!r} in plan")
    for bus in view.gpu_dirs:
        if not gpus.is_full_bus_id(bus):  # a GPU dir name: hex, ':' and '.', never '/' or '..'
            raise ApplyError(f"/proc/driver/nvidia: bad GPU bus id {bus!r} in plan")
    gpus_dir = f"{view.host_dir}/gpus"
    if view.gpu_dirs:
        try:
            fd = os.open(gpus_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd >= 0:
            fds.append(fd)
            if sorted(os.listdir(fd)) == sorted(view.gpu_dirs):
                return [_Bind(ALL_GPUS, fd, "dir", PROC_OPTIONS, gpus_dir)]
    out = []
    for bus in view.gpu_dirs:
        path = f"{gpus_dir}/{bus}"
        try:
            fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            # less access, never more: the view is still made, without this GPU's entry
            messages.append(f"{path}: {e.strerror}; not bound into /proc/driver/nvidia/gpus")
            continue
        fds.append(fd)
        out.append(_Bind(bus, fd, "dir", PROC_OPTIONS, path))
    return out


def _rules_text(plan: Plan) -> str:
    return ", ".join(f"{r.type} {r.major}:{r.minor} {r.access}" for r in plan.cgroup_rules)


def _cgroup_target(plan: Plan, pid, proc: str, fds: list[int], messages: list[str]) -> tuple[int, str] | None:
    """The container's v1 devices.allow, opened (fd, path); None with a message when no rule is written.

    Done before anything is mounted, so a cgroup that cannot be written
    fails the start with nothing to undo.  Never inside a Slurm job: the
    step's cgroup is the boundary Slurm computed, and the container's
    cgroup below it inherits it; rules we wrote there could only try to
    widen it (docs/slurm.md).
    """
    from pyxis_hook.host import cgroup

    rules = _rules_text(plan)
    if plan.cgroup_mode == "none":
        messages.append(f"device cgroup: not modified (no-cgroups = true): {rules}")
        return None
    if plan.cgroup_mode != "auto":
        raise ApplyError(f"device cgroup: unknown cgroup_mode {plan.cgroup_mode!r} in plan")
    if not os.path.exists(f"{proc}/{pid}/cgroup"):
        raise ApplyError(f"{proc}/{pid}/cgroup: no such process")
    slurm = cgroup.read_slurm_cgroup(proc, pid)
    if slurm is not None:
        messages.append(f"device cgroup: not modified: the container is inside Slurm job {slurm.job} "
                        f"step {slurm.step}, whose device cgroup is authoritative")
        return None
    dev = cgroup.read_devices_cgroup(proc, pid)
    if dev is None or dev.controller != "v1":
        if dev is not None and dev.controller == "v2":
            messages.append(f"device cgroup v2: not modified; the runtime must allow {rules} "
                            "(config.json linux.resources.devices, or use CDI)")
        else:
            messages.append(f"device cgroup: no devices controller for pid {pid}: not modified")
        return None
    if dev.fs_path is None:
        raise ApplyError(f"device cgroup {dev.path}: no cgroup v1 devices mount in {proc}/self/mountinfo")
    allow = f"{dev.fs_path}/devices.allow"
    try:
        fd = os.open(allow, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{allow}: cannot allow {rules}: {e.strerror}") from None
    fds.append(fd)
    return fd, allow


def _cgroup_write(plan: Plan, fd: int, allow: str) -> str:
    """Write the plan's rules into the opened v1 devices.allow (one rule per write, as the kernel parses)."""
    for r in plan.cgroup_rules:
        rule = f"{r.type} {r.major}:{r.minor} {r.access}"
        try:
            os.write(fd, rule.encode())
        except OSError as e:
            raise ApplyError(f"{allow}: cannot allow {rule}: {e.strerror}") from None
    return f"device cgroup v1 {os.path.dirname(allow)}: allowed {_rules_text(plan)}"


# -------------------------------------------------------- in the namespace


def _in_child(plan: Plan, ns_fd: int, binds, gpu_dirs, exe_fd, owner, root, allow) -> dict:
    r, w = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - measured through the tests' results
        # Whatever happens below, this process ends here: it must never return into the
        # caller's code while it sits in the container's mount namespace as root.
        status = 1
        try:
            os.close(r)
            # dies with the hook: a runtime that kills the hook (its hook timeout, a SIGKILL)
            # waits for the hook's stdout/stderr to close, which this process holds too, and
            # must not find the rootfs still being written after it gave up on the start
            kernel.prctl(kernel.PR_SET_PDEATHSIG, SIGKILL)
            if os.getppid() != parent:  # the hook died before the line above
                os._exit(1)
            out: dict
            try:
                out = _child(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow)
            except PyxisHookError as e:
                out = {"error": str(e), "class": type(e).__name__}
            except kernel.SyscallError as e:  # a mount, setns or umount the kernel refused: its own line
                out = {"error": str(e), "class": "ApplyError"}
            except BaseException as e:  # noqa: BLE001 - a bug: log the frames, report one line
                log.error(f"apply: internal error\n{log.frames(e)}")  # no traceback module: nothing read here
                out = {"error": f"internal error while applying the plan: {type(e).__name__}",
                       "class": "ApplyError"}
                out["error"] += f": {e}"
            data = marshal.dumps(out)  # our own process's dict of strings: no json import
            while data:
                data = data[os.write(w, data):]
            status = 0
        finally:
            os._exit(status)
    os.close(w)
    chunks = []
    try:
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
    _, status = os.waitpid(pid, 0)
    try:
        out = marshal.loads(b"".join(chunks))
    except (ValueError, EOFError, TypeError):
        raise ApplyError(f"the process applying the plan to {plan.rootfs} died "
                         f"(wait status {status:#x}); nothing reported") from None
    if "error" in out:
        cls = PathError if out.get("class") in ("PathError", "RootPathError") else ApplyError
        raise cls(out["error"])
    return out


class _Undo:
    """Mounts made so far (as fds of the mount roots), undone newest first."""

    def __init__(self) -> None:
        self.mount_fds: list[tuple[int, str]] = []

    def add(self, fd: int, path: str) -> None:
        self.mount_fds.append((fd, path))

    def run(self) -> list[str]:
        problems = []
        while self.mount_fds:
            fd, path = self.mount_fds.pop()
            try:
                kernel.umount2(kernel.proc_fd_path(fd), kernel.MNT_DETACH, what=path)
            except (ApplyError, kernel.SyscallError) as e:
                problems.append(str(e))
            finally:
                os.close(fd)
        return problems


class _NoImports:
    """A meta path finder that refuses every import that would read a file.

    After setns, a module name resolves in the container's mount namespace:
    an import there could read, and run as root, files of the image.  What
    the child needs is imported on the host first (`_preload_ldcache_modules`);
    modules built into the interpreter (or frozen in it) read no file and are
    left to their importers; anything else fails with ImportError instead of
    being looked up.
    """

    @staticmethod
    def find_spec(name, path=None, target=None):
        import _imp  # builtin, already loaded by the import system itself

        if name in sys.builtin_module_names or _imp.is_frozen(name):
            return None  # the next finders (BuiltinImporter, FrozenImporter) take it, from memory
        raise ImportError(f"no import inside the container's mount namespace: {name}")


def _child(plan: Plan, ns_fd: int, binds, gpu_dirs, exe_fd, owner, root, allow) -> dict:
    sys.meta_path.insert(0, _NoImports)  # this forked child only
    kernel.setns(ns_fd, kernel.CLONE_NEWNS, "container mount namespace")
    undo = _Undo()
    messages: list[str] = []
    mounted: list[str] = []
    links: list[str] = []
    owner = owner if owner != (0, 0) else None
    # a pinned rootfs is its fd (taken in this namespace), named by its path here, not by plan.rootfs
    rfs = RootFS(plan.rootfs, owner=owner) if root is None else RootFS(root.ns_path, fd=root.fd, owner=owner)
    try:
        try:
            new_api = kernel.have_new_mount_api()
            for b in binds:
                entry = rfs.ensure_entry(b.container_path, b.kind)
                try:
                    if _same_file(b.fd, entry.fd):
                        # a second hook run (createRuntime and prestart both registered, a hooks.d
                        # hook plus a bundle hook): the file is already there, do not stack a mount
                        messages.append(f"{b.container_path}: already {b.host_path}, not mounted again")
                        continue
                    _bind(b, entry, undo)
                finally:
                    entry.close()
                mounted.append(b.container_path)
                if b.covers:
                    messages.append("warning: " + b.covers)
            for s in plan.symlinks:
                try:
                    if rfs.symlink(s.container_path, s.target):
                        links.append(s.container_path)
                except RootPathError as e:
                    if e.errno != errno.EEXIST:
                        raise
                    messages.append(f"symlink {s.container_path} not created: a file of the image is there")
            if plan.proc_driver is not None:
                mounted += _proc_view(plan, rfs, gpu_dirs, undo, new_api, messages)
            if allow is not None:  # the host's devices.allow, opened before the fork: no name resolved here
                messages.append(_cgroup_write(plan, *allow))
            _ldcache(plan, rfs, exe_fd, messages)  # last: the one write the undo cannot take back
        except BaseException:
            problems = undo.run() + rfs.rollback()
            for p in problems:
                log.error(f"rollback: {p}")
            raise
        # success: the mounts stay; their fds are no longer needed (the parent logs the messages)
        for fd, _path in undo.mount_fds:
            os.close(fd)
        return {"mounted": mounted, "symlinks": links, "messages": messages}
    finally:
        rfs.close()


def _same_file(a: int, b: int) -> bool:
    sa, sb = os.fstat(a), os.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _bind(b: _Bind, entry: Entry, undo: _Undo) -> int:
    """Put source `b` onto the target entry with its flags; return the new mount's fd (for undo)."""
    if b.tree >= 0:
        tree = os.dup(b.tree)
        try:
            kernel.move_mount(tree, "", entry.fd, "", kernel.MOVE_MOUNT_F_EMPTY_PATH | kernel.MOVE_MOUNT_T_EMPTY_PATH,
                              what=entry.path)
        except BaseException:
            os.close(tree)
            raise
        undo.add(tree, entry.path)
        return tree
    # legacy: the host fd belongs to another mount namespace and cannot be a bind source here,
    # so open the same host path in this one (runc's namespace is a copy of the host's, before
    # pivot_root) and insist it is the very inode checked on the host.
    try:
        src = os.open(b.host_path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{b.host_path}: not reachable in the container mount namespace: {e.strerror}") from None
    try:
        want, got = os.fstat(b.fd), os.fstat(src)
        if (want.st_dev, want.st_ino) != (got.st_dev, got.st_ino):
            raise ApplyError(f"{b.host_path}: is another file in the container mount namespace")
        flags = 0
        for o in b.options:
            flags |= _FLAGS.get(o, (0, 0))[1]
        kernel.mount(kernel.proc_fd_path(src), kernel.proc_fd_path(entry.fd), None, kernel.MS_BIND, what=entry.path)
    finally:
        os.close(src)
    top = _reopen_mounted(entry, undo)
    got = os.fstat(top)
    if (want.st_dev, want.st_ino) != (got.st_dev, got.st_ino):
        raise ApplyError(f"{entry.path}: the mount point changed while mounting {b.host_path}")
    target = kernel.proc_fd_path(top)
    kernel.mount(None, target, None, kernel.MS_REMOUNT | kernel.MS_BIND | flags, what=entry.path)
    kernel.mount(None, target, None, kernel.MS_PRIVATE, what=entry.path)
    return top


def _reopen_mounted(entry: Entry, undo: _Undo) -> int:
    """Reopen `entry` to get the mount just made on it; if that fails, the mount is undone here.

    Until the reopened fd is in `undo` the new mount has no handle: undo it
    by the parent dir fd and name (no symlink followed), so a failed reopen
    leaves nothing mounted.
    """
    try:
        top = entry.reopen()
    except (OSError, PyxisHookError) as e:
        try:
            kernel.umount2(f"{kernel.proc_fd_path(entry.parent_fd)}/{entry.name}",
                           kernel.MNT_DETACH | kernel.UMOUNT_NOFOLLOW, what=entry.path)
        except (ApplyError, kernel.SyscallError) as u:
            log.error(f"rollback: {u}")
        if isinstance(e, PyxisHookError):
            raise
        raise ApplyError(f"{entry.path}: cannot reopen after mounting: {e.strerror}") from None
    undo.add(top, entry.path)
    return top


def _is_our_view(rfs: RootFS, target: str, view) -> bool:
    """A previous run for this container already covered the procfs dir: its params is our patched copy.

    The kernel's own /proc/driver/nvidia/params says `ModifyDeviceFiles: 1`
    on a node where the module manages nodes; only our view holds exactly
    the plan's text (and lives on another filesystem than /proc).
    """
    want = dict(view.files).get("params")
    if want is None:
        return False
    def dev(path: str) -> int:
        fd = rfs.open(path, os.O_PATH)
        try:
            return os.fstat(fd).st_dev
        finally:
            os.close(fd)

    try:
        if dev(target) == dev("/proc"):
            return False
        return rfs.read_text(f"{target}/params", 1 << 20) == want
    except (OSError, PathError):
        return False


def _proc_view(plan: Plan, rfs: RootFS, gpu_dirs, undo: _Undo, new_api: bool, messages: list[str]) -> list[str]:
    """tmpfs over the container's /proc/driver/nvidia with copied files and the selected GPUs' dirs."""
    view = plan.proc_driver
    target = "/proc/driver/nvidia"
    if not rfs.exists(target):
        messages.append(f"{target}: not in the container's /proc (no NVIDIA kernel module?): view not mounted")
        return []
    if _is_our_view(rfs, target, view):
        messages.append(f"{target}: already this hook's view, not mounted again")
        return []
    entry = rfs.ensure_entry(target, "dir")
    try:
        base = kernel.MOUNT_ATTR_NOSUID | kernel.MOUNT_ATTR_NODEV | kernel.MOUNT_ATTR_NOEXEC
        if new_api:
            fsfd = kernel.fsopen("tmpfs")
            try:
                kernel.fsconfig_string(fsfd, "mode", "0555")
                kernel.fsconfig_string(fsfd, "size", "1m")
                kernel.fsconfig_create(fsfd)
                mnt = kernel.fsmount(fsfd, base)
            finally:
                os.close(fsfd)
            try:
                kernel.move_mount(mnt, "", entry.fd, "", kernel.MOVE_MOUNT_F_EMPTY_PATH | kernel.MOVE_MOUNT_T_EMPTY_PATH,
                                  what=target)
            except BaseException:
                os.close(mnt)
                raise
            undo.add(mnt, target)
        else:
            kernel.mount("tmpfs", kernel.proc_fd_path(entry.fd), "tmpfs",
                         kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC, "mode=0555,size=1m", what=target)
            mnt = _reopen_mounted(entry, undo)
        for name, content in view.files:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444, dir_fd=mnt)
            try:
                os.write(fd, content.encode())
            finally:
                os.close(fd)
        done = [target]
        if gpu_dirs:
            os.mkdir("gpus", 0o555, dir_fd=mnt)
            gfd = os.open("gpus", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=mnt)
            try:
                if gpu_dirs[0].container_path == ALL_GPUS:  # every GPU: the host's gpus/ dir itself
                    sub = Entry(os.dup(mnt), "gpus", os.dup(gfd), True, f"{target}/gpus")
                    try:
                        _bind(gpu_dirs[0], sub, undo)
                    finally:
                        sub.close()
                    done.append(sub.path)
                    gpu_dirs = ()
                for b in gpu_dirs:
                    bus = b.container_path
                    os.mkdir(bus, 0o555, dir_fd=gfd)
                    sub = Entry(os.dup(gfd), bus,
                                os.open(bus, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=gfd),
                                True, f"{target}/gpus/{bus}")
                    try:
                        _bind(b, sub, undo)
                    finally:
                        sub.close()
                    done.append(sub.path)
            finally:
                os.close(gfd)
        # populated: now make the tmpfs itself read-only
        if new_api:
            kernel.mount_setattr(mnt, "", kernel.AT_EMPTY_PATH, kernel.MOUNT_ATTR_RDONLY, 0, 0, what=target)
        else:
            kernel.mount(None, kernel.proc_fd_path(mnt), None,
                         kernel.MS_REMOUNT | kernel.MS_RDONLY | kernel.MS_NOSUID | kernel.MS_NODEV | kernel.MS_NOEXEC,
                         "mode=0555", what=target)
        return done
    finally:
        entry.close()


def _ldcache(plan: Plan, rfs: RootFS, exe_fd, messages: list[str]) -> None:
    mode = plan.ldcache.mode
    if mode == "none":
        return
    if mode not in ("merge", "ldconfig"):
        raise ApplyError(f"ld.so.cache: unknown update mode {mode!r} in plan")
    if rfs.readonly:
        messages.append(f"ld.so.cache: {plan.rootfs} is read-only; cache not updated")
        return
    # preloaded by apply_plan: sys.modules lookups, no file is read in this namespace
    from pyxis_hook.apply import confined
    from pyxis_hook.loader import ldconf, ldmerge

    if mode == "merge":
        try:
            # reads the image's ld.so.conf first: UnsafeLoaderConfig (not a CannotMerge) refuses the start
            messages.append(ldmerge.update_container_cache(rfs, ldmerge.libs_from_plan(plan.ldcache)))
            return
        except ldmerge.CannotMerge as e:
            messages.append(f"ld.so.cache: merge cannot model this image ({e}); running ldconfig instead")
            if exe_fd is None:
                raise ApplyError(f"ld.so.cache: cannot merge ({e}) and no host ldconfig to fall back to") from None
            ldconf.require_safe(rfs)
            # exe_fd is the host binary opened O_RDONLY on the host: copy it now, from the fd
            exe_fd = confined.sealed_copy_from_fd(exe_fd, plan.ldcache.ldconfig)
            try:
                _run_ldconfig(plan, rfs, exe_fd, messages)
            finally:
                os.close(exe_fd)
            return
    # the same reader as the merge's, first: glibc's ldconfig would block on a FIFO, open a
    # device as root or recurse through an include loop until its limits killed it
    ldconf.require_safe(rfs)
    _run_ldconfig(plan, rfs, exe_fd, messages)


def _run_ldconfig(plan: Plan, rfs: RootFS, exe_fd: int, messages: list[str]) -> None:
    from pyxis_hook.loader import cachefile  # preloaded: sys.modules lookups
    from pyxis_hook.apply import confined  # preloaded: sys.modules lookups

    dirs = tuple(dict.fromkeys(plan.ldcache.lib_dirs))
    try:
        # rfs.path: the rootfs's name in this mount namespace; the runner checks it is still rfs.fd's inode
        warnings = confined.run_ldconfig(rfs.path, exe_fd, dirs, root_fd=rfs.fd, owner=rfs.owner)
    except BaseException:
        # glibc's ldconfig exits on a failed write, chmod or rename and leaves its temp file
        problem = cachefile.remove_temp(rfs)
        if problem:
            log.error(f"rollback: {problem}")
        raise
    messages.append(f"ld.so.cache: ldconfig ran for {', '.join(dirs) or '(configured dirs)'}")
    for line in warnings.strip().splitlines()[-5:]:
        messages.append(f"ldconfig: {line}")
    _relink(plan, rfs, messages)


def _relink(plan: Plan, rfs: RootFS, messages: list[str]) -> None:
    """Put back the plan's links that ldconfig pointed elsewhere.

    glibc's ldconfig points a SONAME link at the file of that SONAME with
    the greatest version in the dir (`search_dir`, `create_links`): an
    image's own copy of a newer driver line beside the injected file wins
    there, and the container would load a library that does not match the
    host's kernel module.  The cache names `dir/SONAME` either way, so the
    link decides.  A link that could not be made before (a file of the
    image appeared) was already reported.
    """
    for s in plan.symlinks:
        try:
            if rfs.symlink(s.container_path, s.target):
                messages.append(f"{s.container_path}: ldconfig pointed it elsewhere; set back to {s.target}")
        except RootPathError as e:
            if e.errno != errno.EEXIST:
                raise
