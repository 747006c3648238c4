"""The container's /proc/driver/nvidia: a read-only tmpfs with the plan's files and the selected GPUs' dirs.

The kernel module's procfs directory lists every GPU of the host; a
container should see its own.  The plan carries the files to show (a
patched `params`, the version, ...) and the GPUs whose dirs to bind; here
the GPU dirs are opened on the host (`open_gpu_dirs`, before the fork) and
the view is built in the child (`mount_view`): a tmpfs filled, the dirs
bound by fd (`apply.mounts`), then made read-only.  It is information only:
what a container may open is decided by its device nodes and its cgroup.
"""

from __future__ import annotations

import posix

from pyxis_hook.kernel import lookup, mountapi, syscall
from pyxis_hook.apply.mounts import Bind, Undo, bind, clone_tree, reopen_mounted
from pyxis_hook.errors import ApplyError, PathError
from pyxis_hook.host import gpus
from pyxis_hook.plan.build import PROC_OPTIONS, Plan
from pyxis_hook.apply.rootwrite import Entry, WritableRoot

#: what a /proc/driver/nvidia file name in a plan may hold (no '/', checked again here: the plan is data)
_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.+-")

#: the name of a proc-view bind that is the host's whole gpus/ dir (bus ids never look like this)
ALL_GPUS = "gpus"


def open_gpu_dirs(plan: Plan, fds: list[int], messages: list[str], clone: bool = False) -> list[Bind]:
    """The GPU dirs the /proc view binds: one per selected GPU, or one of the whole gpus/ dir.

    When the selection is every GPU the host lists (`all`, or a node's whole
    allocation), binding the host's gpus/ directory once shows the container
    the same entries as binding each one, for one mount instead of N (so
    many GPUs cost a start little more than one: docs/decisions/2026-12-07-start-costs.md).
    That dir is then the live procfs one: a GPU added to or
    removed from the host later shows there too.  The view is information
    only: what a container may open is decided by the device nodes and the
    cgroup, never by these dirs.  `clone`: each comes with its tree, as
    `mounts.open_sources` makes them.
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
            fd = posix.open(gpus_dir, posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd >= 0:
            fds.append(fd)
            if sorted(posix.listdir(fd)) == sorted(view.gpu_dirs):
                return [Bind(ALL_GPUS, fd, "dir", PROC_OPTIONS, gpus_dir,
                             clone_tree(fd, PROC_OPTIONS, gpus_dir, fds) if clone else -1)]
    out = []
    for bus in view.gpu_dirs:
        path = f"{gpus_dir}/{bus}"
        try:
            fd = posix.open(path, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
        except OSError as e:
            # less access, never more: the view is still made, without this GPU's entry
            messages.append(f"{path}: {e.strerror}; not bound into /proc/driver/nvidia/gpus")
            continue
        fds.append(fd)
        out.append(Bind(bus, fd, "dir", PROC_OPTIONS, path, clone_tree(fd, PROC_OPTIONS, path, fds) if clone else -1))
    return out



def _is_our_view(rfs: WritableRoot, target: str, view) -> bool:
    """A previous run for this container already covered the procfs dir: its params is our patched copy.

    The kernel's own /proc/driver/nvidia/params says `ModifyDeviceFiles: 1`
    on a node where the module manages nodes; only our view holds exactly
    the plan's text (and lives on another filesystem than /proc).
    """
    want = dict(view.files).get("params")
    if want is None:
        return False
    def dev(path: str) -> int:
        fd = rfs.open(path, posix.O_PATH)
        try:
            return posix.fstat(fd).st_dev
        finally:
            posix.close(fd)

    try:
        if dev(target) == dev("/proc"):
            return False
        return rfs.read_text(f"{target}/params", 1 << 20) == want
    except (OSError, PathError):
        return False


def mount_view(plan: Plan, rfs: WritableRoot, gpu_dirs, undo: Undo, new_api: bool, messages: list[str]) -> list[str]:
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
        base = mountapi.MOUNT_ATTR_NOSUID | mountapi.MOUNT_ATTR_NODEV | mountapi.MOUNT_ATTR_NOEXEC
        if new_api:
            fsfd = mountapi.fsopen("tmpfs")
            try:
                mountapi.fsconfig_string(fsfd, "mode", "0555")
                mountapi.fsconfig_string(fsfd, "size", "1m")
                mountapi.fsconfig_create(fsfd)
                mnt = mountapi.fsmount(fsfd, base)
            finally:
                posix.close(fsfd)
            try:
                mountapi.move_mount(mnt, "", entry.fd, "", mountapi.MOVE_MOUNT_F_EMPTY_PATH | mountapi.MOVE_MOUNT_T_EMPTY_PATH,
                                  what=target)
            except BaseException:
                posix.close(mnt)
                raise
            undo.add(mnt, target)
        else:
            mountapi.mount("tmpfs", lookup.proc_fd_path(entry.fd), "tmpfs",
                         mountapi.MS_NOSUID | mountapi.MS_NODEV | mountapi.MS_NOEXEC, "mode=0555,size=1m", what=target)
            mnt = reopen_mounted(entry, undo)
        for name, content in view.files:
            fd = posix.open(name, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC, 0o444, dir_fd=mnt)
            try:
                posix.write(fd, content.encode())
            finally:
                posix.close(fd)
        done = [target]
        if gpu_dirs:
            posix.mkdir("gpus", 0o555, dir_fd=mnt)
            gfd = posix.open("gpus", posix.O_PATH | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=mnt)
            try:
                if gpu_dirs[0].container_path == ALL_GPUS:  # every GPU: the host's gpus/ dir itself
                    sub = Entry(posix.dup(mnt), "gpus", posix.dup(gfd), True, f"{target}/gpus")
                    try:
                        bind(gpu_dirs[0], sub, undo)
                    finally:
                        sub.close()
                    done.append(sub.path)
                    gpu_dirs = ()
                for b in gpu_dirs:
                    bus = b.container_path
                    posix.mkdir(bus, 0o555, dir_fd=gfd)
                    sub = Entry(posix.dup(gfd), bus,
                                posix.open(bus, posix.O_PATH | posix.O_DIRECTORY | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=gfd),
                                True, f"{target}/gpus/{bus}")
                    try:
                        bind(b, sub, undo)
                    finally:
                        sub.close()
                    done.append(sub.path)
            finally:
                posix.close(gfd)
        # populated: now make the tmpfs itself read-only
        if new_api:
            mountapi.mount_setattr(mnt, "", syscall.AT_EMPTY_PATH, mountapi.MOUNT_ATTR_RDONLY, 0, 0, what=target)
        else:
            mountapi.mount(None, lookup.proc_fd_path(mnt), None,
                         mountapi.MS_REMOUNT | mountapi.MS_RDONLY | mountapi.MS_NOSUID | mountapi.MS_NODEV | mountapi.MS_NOEXEC,
                         "mode=0555", what=target)
        return done
    finally:
        entry.close()
