"""Plan -> kernel: applying a plan in the container's mount namespace, and its rollback.

Order (the plan's order): device binds, library/file binds, symlinks, the
/proc/driver/nvidia view, the device cgroup rules, then the ld.so.cache
refresh.  Everything the child touches on the host is opened before the
fork (the mount sources, `apply.mounts`; the GPU dirs of the /proc view,
`apply.procview`; the cgroup's devices.allow, `apply.devcgroup`; the host
ldconfig), so a wrong source or cgroup fails before anything is mounted.
A v1 cgroup rule cannot be taken back, so the rules come after every mount
and link; the ld.so.cache is last, the one write the undo cannot take back.

Where the namespace work runs: `setns(CLONE_NEWNS)` fails with EINVAL in
a multi-threaded process and changes the caller's view of the filesystem
until it sets it back.  When this process can come back (one thread, its
own mount namespace owned by its own user namespace: `_home`), it works in
place and returns to its namespace, root and directory right after
(`namespaces.leave_mount_ns`; a failed return ends the process at once); that
spares a start the fork of the interpreter and the exit of its copy.
Otherwise (a CLI or test runner with a thread, a hook whose namespace
belongs to an ancestor user namespace) a forked child does it: single-
threaded whatever the parent is, it inherits the host fds opened and
checked before the fork, sends one marshal'ed result up a pipe and exits.
Either way a failure is one PyxisHookError line of the same class
(`_outcome`, `_result`).

Safety rules kept here (docs/security.md):
- sources are mounted by fd, never re-resolved by name (`apply.mounts`); a source inside the
  rootfs (a CDI hook binds the runtime's mount of a host library over the image's file) is
  opened in the container's namespace through the rootfs fd, its last component never followed;
- the rootfs is the fd `rootpin` found in the container's mount namespace
  when the caller pinned one (prestart, the CDI hooks): the child never opens `plan.rootfs`
  by name then, so a `root.path` re-pointed since cannot lead it elsewhere;
- targets are resolved and created inside the rootfs by `rootwrite.WritableRoot`
  (chroot semantics, O_NOFOLLOW creation);
- any failure undoes every mount (umount2 MNT_DETACH, newest first) and
  removes every mount point, directory and symlink created, so nothing is
  left behind; the ldconfig run comes last so its failure is undone too;
- nothing is imported after setns: a module imported by name then would be
  looked up in the container's mount namespace (after pivot_root, for the
  CDI hooks: the image's files), so apply_plan imports what the child needs
  (this module imports `mounts`, `procview` and `devcgroup` at its top;
  the ld.so.cache step's modules are preloaded by `_preload_ldcache_modules`).
"""

from __future__ import annotations

import errno
import marshal
import posix
import sys
from _signal import SIGKILL  # the C module, not signal.py and its enums (docs/decisions/2026-12-07-start-costs.md)

from pyxis_hook.apply import devcgroup, hostdirs, mounts, procview
from pyxis_hook.kernel import mountapi, namespaces, process, syscall
from pyxis_hook import log
from pyxis_hook.errors import INTERNAL, ApplyError, PathError, PyxisHookError
from pyxis_hook.plan.build import Plan
from pyxis_hook.record import record, replace
from pyxis_hook.apply.rootwrite import HostDirError, WritableRoot
from pyxis_hook.rootfs import RootPathError


@record
class ApplyResult:
    """What was done, for the log and for tests."""

    mounted: tuple[str, ...] = ()
    symlinks: tuple[str, ...] = ()
    messages: tuple[str, ...] = ()


def apply_plan(plan: Plan, pid: int | str, config=None, *, proc: str = "/proc", root=None) -> ApplyResult:
    """Apply `plan` to the container whose init is `pid` (in our PID namespace; "self": our own namespace).

    `root`: the rootfs pinned in the container's mount namespace
    (`rootpin.PinnedRoot`, prestart and the CDI hooks): the child works on
    that fd and never resolves `plan.rootfs` by name.  Without it (the enroot hook, tests)
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
        # With the new mount API each source is cloned on the host: a bind source must be a mount of
        # the caller's namespace, and a detached clone may then be moved into any namespace (the
        # legacy path re-opens instead).
        new_api = mountapi.have_new_mount_api()
        binds = mounts.open_sources(plan, fds, clone=new_api)
        gpu_dirs = procview.open_gpu_dirs(plan, fds, messages, clone=new_api)
        try:
            owner_st = posix.stat(f"{proc}/{pid}")
            ns_fd = posix.open(f"{proc}/{pid}/ns/mnt", posix.O_RDONLY | posix.O_CLOEXEC)
        except OSError as e:
            raise ApplyError(f"container process {pid}: {e.strerror}") from None
        fds.append(ns_fd)
        owner = (owner_st.st_uid, owner_st.st_gid)
        exe_fd = _ldconfig_fd(plan, fds)
        allow = devcgroup.open_allow(plan, pid, proc, fds, messages) if plan.cgroup_rules else None
        point = _rootfs_point(plan, root)
        result = _in_namespace(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow, point)
        messages += result["messages"]
    finally:
        for fd in fds:
            posix.close(fd)
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
    from pyxis_hook.loader import cachefile, cachewrite, conftree, ldconf, ldmerge  # noqa: F401
    from pyxis_hook.apply import cacheupdate, confined  # noqa: F401


# ---------------------------------------------------------------- host side


def _rootfs_point(plan: Plan, root) -> str | None:
    """The rootfs's mount point in the hook's own namespace, for `hostdirs` (None: not known for sure)."""
    try:
        want = posix.fstat(root.fd) if root is not None else posix.stat(plan.rootfs)
    except OSError:
        return None
    return hostdirs.rootfs_point(plan.rootfs, want)


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
            fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NOCTTY)
        except OSError as e:
            raise ApplyError(f"ldconfig {path}: {e.strerror}") from None
    else:
        return None
    fds.append(fd)
    return fd


# -------------------------------------------------------- in the namespace


def _in_namespace(plan: Plan, ns_fd: int, binds, gpu_dirs, exe_fd, owner, root, allow, point) -> dict:
    """Run `_child` in the container's mount namespace: in this process when it can come back, else forked."""
    home = _home()
    if home is None:
        return _result(plan, _in_child(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow, point))
    try:
        try:
            out = _outcome(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow, point)
        finally:
            _go_home(home)
    finally:
        for fd in home:
            posix.close(fd)
    return _result(plan, out)


def _home() -> tuple[int, int, int] | None:
    """(own mount namespace, root, working directory) fds to come back with, or None: fork instead.

    Working in place spares a GPU start the fork of the whole interpreter
    and the exit of its copy (docs/decisions/2026-12-07-start-costs.md).
    It needs what the way back needs: a single thread (setns(CLONE_NEWNS) fails with EINVAL in a
    threaded process), and this process's mount namespace owned by its own
    user namespace (`namespaces.owned_by_own_userns`), so the capability that
    enters the container's namespace also returns from it.
    """
    try:
        if len(posix.listdir("/proc/self/task")) != 1:
            return None
    except OSError:
        return None
    fds: list[int] = []
    try:
        for path, flags in (("/proc/self/ns/mnt", posix.O_RDONLY), ("/", posix.O_PATH | posix.O_DIRECTORY),
                            (".", posix.O_PATH | posix.O_DIRECTORY)):
            fds.append(posix.open(path, flags | posix.O_CLOEXEC))
        if namespaces.owned_by_own_userns(fds[0]):
            return fds[0], fds[1], fds[2]
    except OSError:
        pass
    for fd in fds:
        posix.close(fd)
    return None


def _go_home(home: tuple[int, int, int]) -> None:
    """Back into the hook's own mount namespace, root and directory; or end the process here.

    A process left in the container's namespace as root must run nothing
    more (an import, a log line by name, a second container would act on
    the image's files): when the way back fails, it exits at once with one line.
    """
    try:
        namespaces.leave_mount_ns(*home)
    except BaseException as e:  # noqa: BLE001 - whatever it was, nothing else may run in there
        line = f"pyxis-hook: error: cannot return to the hook's own mount namespace: {e}\n"
        try:
            log.error(line.strip())
            posix.write(2, line.encode("utf-8", "replace"))
        finally:
            posix._exit(INTERNAL)
    while _NoImports in sys.meta_path:
        sys.meta_path.remove(_NoImports)


def _outcome(plan: Plan, ns_fd: int, binds, gpu_dirs, exe_fd, owner, root, allow, point) -> dict:
    """`_child`'s result, or its failure as {"error", "class"}: one form for both ways of running it."""
    try:
        return _child(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow, point)
    except PyxisHookError as e:
        return {"error": str(e), "class": type(e).__name__}
    except syscall.SyscallError as e:  # a mount, setns or umount the kernel refused: its own line
        return {"error": str(e), "class": "ApplyError"}
    except BaseException as e:  # noqa: BLE001 - a bug: log the frames, report one line
        log.error(f"apply: internal error\n{log.frames(e)}")  # no traceback module: nothing read here
        return {"error": f"internal error while applying the plan: {type(e).__name__}: {e}",
                "class": "ApplyError"}


def _result(plan: Plan, out: dict) -> dict:
    """`out` of `_outcome`, its failure raised as the PathError or ApplyError the runtime's line comes from."""
    if "error" in out:
        cls = PathError if out.get("class") in ("PathError", "RootPathError") else ApplyError
        raise cls(out["error"])
    return out


def _in_child(plan: Plan, ns_fd: int, binds, gpu_dirs, exe_fd, owner, root, allow, point) -> dict:
    """`_outcome` in a forked child, sent up a pipe with marshal."""
    r, w = posix.pipe2(posix.O_CLOEXEC)
    parent = posix.getpid()
    pid = posix.fork()
    if pid == 0:  # pragma: no cover - measured through the tests' results
        # Whatever happens below, this process ends here: it must never return into the
        # caller's code while it sits in the container's mount namespace as root.
        status = 1
        try:
            posix.close(r)
            # dies with the hook: a runtime that kills the hook (its hook timeout, a SIGKILL)
            # waits for the hook's stdout/stderr to close, which this process holds too, and
            # must not find the rootfs still being written after it gave up on the start
            process.prctl(process.PR_SET_PDEATHSIG, SIGKILL)
            if posix.getppid() != parent:  # the hook died before the line above
                posix._exit(1)
            data = marshal.dumps(_outcome(plan, ns_fd, binds, gpu_dirs, exe_fd, owner, root, allow, point))
            while data:
                data = data[posix.write(w, data):]
            status = 0
        finally:
            posix._exit(status)
    posix.close(w)
    chunks = []
    try:
        while True:
            chunk = posix.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        posix.close(r)
    _, status = posix.waitpid(pid, 0)
    try:
        return marshal.loads(b"".join(chunks))
    except (ValueError, EOFError, TypeError):
        raise ApplyError(f"the process applying the plan to {plan.rootfs} died "
                         f"(wait status {status:#x}); nothing reported") from None


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


def _child(plan: Plan, ns_fd: int, binds, gpu_dirs, exe_fd, owner, root, allow, point) -> dict:
    sys.meta_path.insert(0, _NoImports)  # until the process dies or `_go_home` takes it out
    # before setns: it keeps the hook's own mount table (the ones pinning read, when it did)
    tables = (root.own_table, root.their_table) if root is not None else (None, None)
    host_dirs = hostdirs.HostDirs(point, *tables)
    namespaces.enter_mount_ns(ns_fd)
    undo = mounts.Undo()
    messages: list[str] = []
    mounted: list[str] = []
    links: list[str] = []
    skipped: set[str] = set()
    owner = owner if owner != (0, 0) else None
    # a pinned rootfs is its fd (taken in this namespace), named by its path here, not by plan.rootfs
    rfs = (WritableRoot(plan.rootfs, owner=owner, host_dirs=host_dirs) if root is None
           else WritableRoot(root.ns_path, fd=root.fd, owner=owner, host_dirs=host_dirs))
    local_fds: list[int] = []
    try:
        try:
            new_api = mountapi.have_new_mount_api()
            # the runtime's mounts of host files inside the rootfs (CDI hooks): sources of this namespace
            local = [mounts.open_in_rootfs(m, rfs, local_fds) for m in plan.mounts if m.in_rootfs]
            if new_api:
                local = [mounts.clone(b, local_fds) for b in local]
            for b in [*binds, *local]:
                try:
                    entry = rfs.ensure_entry(b.container_path, b.kind)
                except HostDirError as e:
                    if b.required:  # a GPU without its device node: the start fails, everything undone
                        raise ApplyError(f"device node {e}") from None
                    messages.append(f"warning: {e}; not mounted")
                    skipped.add(b.container_path)
                    continue
                try:
                    # (a mount point this run just made, O_EXCL, holds nothing yet: no fstat pair to ask)
                    if not entry.created and mounts.same_file(b.fd, entry.fd):
                        # a second hook run (createRuntime and prestart both registered, a hooks.d
                        # hook plus a bundle hook): the file is already there, do not stack a mount
                        messages.append(f"{b.container_path}: already {b.host_path}, not mounted again")
                        continue
                    mounts.bind(b, entry, undo)
                finally:
                    entry.close()
                mounted.append(b.container_path)
                if b.covers:
                    messages.append("warning: " + b.covers)
            for s in plan.symlinks:
                try:
                    if rfs.symlink(s.container_path, s.target):
                        links.append(s.container_path)
                except HostDirError as e:
                    messages.append(f"warning: symlink {e}")
                except RootPathError as e:
                    if e.errno != errno.EEXIST:
                        raise
                    messages.append(f"symlink {s.container_path} not created: a file of the image is there")
            if plan.proc_driver is not None:
                mounted += procview.mount_view(plan, rfs, gpu_dirs, undo, new_api, messages)
            if allow is not None:  # the host's devices.allow, opened before the fork: no name resolved here
                messages.append(devcgroup.write_rules(plan, *allow))
            _ldcache(plan, rfs, exe_fd, messages, skipped)  # last: the one write the undo cannot take back
        except BaseException:
            problems = undo.run() + rfs.rollback()
            for p in problems:
                log.error(f"rollback: {p}")
            raise
        # success: the mounts stay; their fds are no longer needed (the parent logs the messages)
        undo.keep()
        return {"mounted": mounted, "symlinks": links, "messages": messages}
    finally:
        for fd in local_fds:
            posix.close(fd)
        rfs.close()
        host_dirs.close()


def _ldcache(plan: Plan, rfs: WritableRoot, exe_fd, messages: list[str], skipped: frozenset[str] | set[str] = frozenset()) -> None:
    """The ld.so.cache step; `skipped`: the plan's binds left out (a host directory), dropped from the merge."""
    mode = plan.ldcache.mode
    if mode == "none":
        return
    if mode not in ("merge", "ldconfig"):
        raise ApplyError(f"ld.so.cache: unknown update mode {mode!r} in plan")
    if rfs.readonly:
        messages.append(f"ld.so.cache: {plan.rootfs} is read-only; cache not updated")
        return
    try:
        _update_ldcache(plan, rfs, exe_fd, messages, skipped)
    except HostDirError as e:  # the image's /etc is the host's: its cache is not ours to write
        messages.append(f"warning: ld.so.cache: {e}; cache not updated")


def _update_ldcache(plan: Plan, rfs: WritableRoot, exe_fd, messages: list[str], skipped: frozenset[str] | set[str]) -> None:
    # preloaded by apply_plan: sys.modules lookups, no file is read in this namespace
    from pyxis_hook.apply import cacheupdate, confined
    from pyxis_hook.loader import ldconf, ldmerge

    if plan.ldcache.mode == "merge":
        update = plan.ldcache
        if skipped:
            update = replace(update, libs=tuple(r for r in update.libs
                                                if f"{r[0].rstrip('/')}/{r[1]}" not in skipped))
        try:
            # reads the image's ld.so.conf first: UnsafeLoaderConfig (not a CannotMerge) refuses the start
            messages.append(cacheupdate.update_container_cache(rfs, cacheupdate.libs_from_plan(update)))
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
                posix.close(exe_fd)
            return
    # the same reader as the merge's, first: glibc's ldconfig would block on a FIFO, open a
    # device as root or recurse through an include loop until its limits killed it
    ldconf.require_safe(rfs)
    _run_ldconfig(plan, rfs, exe_fd, messages)


def _run_ldconfig(plan: Plan, rfs: WritableRoot, exe_fd: int, messages: list[str]) -> None:
    from pyxis_hook.loader import cachefile  # preloaded: sys.modules lookups
    from pyxis_hook.apply import confined  # preloaded: sys.modules lookups

    dirs = tuple(dict.fromkeys(plan.ldcache.lib_dirs))
    try:
        etc = rfs.open("/etc", posix.O_PATH | posix.O_DIRECTORY)
    except RootPathError as e:
        if e.errno != errno.ENOENT:
            raise
    else:
        try:
            rfs.check_dir(etc, cachefile.CACHE)  # ldconfig writes the cache there: not in a host /etc
        finally:
            posix.close(etc)
    try:
        # rfs.path: the rootfs's name in this mount namespace; the runner checks it is still rfs.fd's inode
        host_devs = rfs.host_dirs.host_devices() if rfs.host_dirs is not None else frozenset()
        warnings = confined.run_ldconfig(rfs.path, exe_fd, dirs, root_fd=rfs.fd, owner=rfs.owner, host_devs=host_devs)
    except BaseException:
        # glibc's ldconfig exits on a failed write, chmod or rename and leaves its temp file
        problem = cachefile.remove_temp(rfs)
        if problem:
            log.error(f"rollback: {problem}")
        raise
    rfs.forget_dirs()  # ldconfig pointed links the image's configuration chose: paths through them may name others now
    messages.append(f"ld.so.cache: ldconfig ran for {', '.join(dirs) or '(configured dirs)'}")
    for line in warnings.strip().splitlines()[-5:]:
        messages.append(f"ldconfig: {line}")
    _relink(plan, rfs, messages)


def _relink(plan: Plan, rfs: WritableRoot, messages: list[str]) -> None:
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
        except HostDirError:
            pass  # reported when the links were made
        except RootPathError as e:
            if e.errno != errno.EEXIST:
                raise
