"""The container's rootfs as its runtime set it up, found in the container's mount namespace and held as an fd.

Why: config.json lives in the bundle, a directory that may belong to someone
less privileged than the hook (a root runtime driven on a user-owned bundle),
and the runtime reads `root.path` once, at create.  By the time a prestart or
createRuntime hook reads it, the name may lead anywhere: a symlink swapped in
for `rootfs`, or `root.path` rewritten to `/`.  A hook that resolves it on the
host then makes mount points and rewrites ld.so.cache in a host directory (the
CVE-2024-0132/-0134 class).  NVIDIA's hook takes `filepath.Abs(root.path)` as
it finds it (nvidia-container-toolkit, `cmd/nvidia-container-runtime-hook/main.go`
`getRootfsPath`).

What the runtime set up is recorded where the bundle's owner cannot reach:
the container's mount namespace.

- Before pivot_root (runc and crun run prestart and createRuntime hooks after
  the container's mounts and before the pivot; runc's
  `libcontainer/rootfs_linux.go` `prepareRoot` bind-mounts the rootfs onto
  itself, crun does the same), the rootfs is a mount the runtime made in that
  namespace.  The namespace was copied from the runtime's, which is the
  hook's own (the runtime runs the hook), so a mount the runtime made is one
  the container's namespace has at a mount point more often than the hook's
  namespace has, and the rootfs is such a mount with no other one above it.
  `root.path` is resolved in the container's namespace (`/proc/<pid>/root`,
  chroot semantics, links followed as the runtime followed them) and must
  land on the root of that mount.
- After pivot_root (Apptainer's OCI engine runs createRuntime there), the
  container process's root directory `/proc/<pid>/root` is the rootfs, and
  `root.path` must name that same directory (st_dev, st_ino).

The fd found that way is the only handle used afterwards: planning reads the
image through `/proc/self/fd/<fd>` (`PinnedRoot.view`) and apply's child
builds its `RootFS` on the fd.  Anything else is one `RootfsError` line and
nothing is touched.
"""

from __future__ import annotations

import posix

from pyxis_hook import log
from pyxis_hook.apply.mounttable import mount_line, mount_points
from pyxis_hook.errors import PathError
from pyxis_hook.host.cgroup import parse_mountinfo, read_text
from pyxis_hook.kernel import lookup
from pyxis_hook.rootfs import RootFS
from pyxis_hook.spec import bundleperm

from pyxis_hook import pathnames
from pyxis_hook.errors import OciError
from pyxis_hook.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only
    from typing import Callable


class RootfsError(OciError):
    """The bundle's `root.path` is not the rootfs the runtime set up for the container."""


@record
class PinnedRoot:
    """The container's rootfs, opened once (O_PATH) in the container's mount namespace; the caller closes it."""

    fd: int
    #: its path inside the container's mount namespace: the mount point before pivot_root, "/" after
    ns_path: str
    #: True when the container process had already pivoted (its root directory is the rootfs)
    pivoted: bool
    #: this process's own mount table (`/proc/self/mountinfo`) as pinning read it, None when it read
    #: another's, and the container's (None after pivot_root, when pinning reads neither): the same
    #: start's other readers take them from here instead of reading them again
    own_table: str | None = None
    their_table: str | None = None

    @property
    def view(self) -> str:
        """A path reaching the pinned directory from this process, for code that reads by name."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        posix.close(self.fd)


def pin_rootfs(rootfs: str, pid: int, *, proc: str = "/proc", ref: int | str = "self") -> PinnedRoot:
    """Open the rootfs the runtime set up for container process `pid`; `rootfs` is the bundle's root.path.

    `ref`: a process in the mount namespace the container's was copied from
    (the runtime's): this hook itself for prestart, the runtime for a hook
    that runs inside the container's namespace (`hook_processes`).  Raises
    RootfsError (one line) when `rootfs` names anything else, or when the
    container process cannot be looked at.
    """
    where = f"{proc}/{pid}"
    try:
        root_fd = posix.open(f"{where}/root", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC)
        pivoted = not _same_file(posix.fstat(root_fd), posix.stat("/"))
    except OSError as e:
        raise RootfsError(f"container process {pid}: cannot open its root directory: {e.strerror}") from None
    try:
        if pivoted:
            _check_pivoted(rootfs, pid, root_fd)
            return PinnedRoot(fd=posix.dup(root_fd), ns_path="/", pivoted=True)
        theirs = read_text(f"{where}/mountinfo") or ""
        ours = read_text(f"{proc}/{ref}/mountinfo") or ""
        fd, mount_point = _runtime_mount(rootfs, pid, root_fd, where, proc, ref, theirs, ours)
        own = ours if (proc, str(ref)) == ("/proc", "self") else None
        return PinnedRoot(fd=fd, ns_path=mount_point, pivoted=False, own_table=own, their_table=theirs)
    finally:
        posix.close(root_fd)


def pin_bundle(bundle, pid: int, writable_bundle: str, label: str, *, ref: int | str = "self") -> PinnedRoot:
    """The bundle's writers checked (`spec.bundleperm`, a warning logged under `label`), then its rootfs pinned.

    What every hook does before it reads the image: prestart, and each CDI createContainer hook.
    """

    warning = bundleperm.check_bundle(bundle.path, bundle.config_path, writable_bundle)
    if warning:
        log.warning(f"{label}: {warning}")
    return pin_rootfs(bundle.rootfs, pid, ref=ref)


def hook_processes(state_pid: int, *, proc: str = "/proc") -> tuple[int, int | str]:
    """(the container's process, `pin_rootfs`'s `ref`) for a createContainer hook, as `proc` numbers them.

    Why not the state's pid: runc and crun run createContainer hooks from the
    container's init, inside its mount (and PID) namespace, before pivot_root
    (runc `libcontainer/rootfs_linux.go` `prepareRootfs`: state.Pid is
    `getpid()` there, 1 in a new PID namespace; crun `container.c`
    `container_init_setup`: pid 0).  The procfs at /proc is still the host's
    there, where that number is another process.  Such a hook is the init's
    child: the init is its parent as procfs numbers it (`PPid` of
    /proc/self/status), and the namespace the container's was copied from is
    that of the first ancestor outside it (the runtime that cloned the init).
    Any other state pid (Apptainer's OCI engine runs every hook in its own
    namespace on the host, with the container's host pid) is used as
    prestart uses it, with this process as the reference.
    """
    if state_pid not in (0, posix.getppid()):
        return state_pid, "self"
    try:
        init = _ppid("self", proc)
        ns = posix.stat(f"{proc}/{init}/ns/mnt").st_ino
        if ns != posix.stat(f"{proc}/self/ns/mnt").st_ino:
            raise RootfsError(f"the hook's parent, process {init}, is not in the hook's mount namespace: "
                              f"state pid {state_pid} does not name the container process")
        ref = init
        for _ in range(64):
            ref = _ppid(ref, proc)
            if ref <= 0:
                break
            if posix.stat(f"{proc}/{ref}/ns/mnt").st_ino != ns:
                return init, ref
    except OSError as e:
        raise RootfsError(f"cannot find the container process of this hook: {e.strerror}") from None
    raise RootfsError(f"no ancestor of container process {init} is outside its mount namespace: "
                      "cannot tell the mounts the runtime made")


def _ppid(pid: int | str, proc: str) -> int:
    """The parent of `pid` as `proc` numbers it (posix.getppid() answers in this PID namespace)."""
    with open(f"{proc}/{pid}/status", "rb") as f:
        for line in f.read(8192).splitlines():
            if line.startswith(b"PPid:"):
                return int(line.split()[1])
    raise OSError(0, f"no PPid in {proc}/{pid}/status")


def _same_file(a: posix.stat_result, b: posix.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _check_pivoted(rootfs: str, pid: int, root_fd: int) -> None:
    """After pivot_root: `rootfs`, resolved on the host as the runtime did, must be the process's root."""
    try:
        st = posix.stat(rootfs)
    except OSError as e:
        raise RootfsError(f"root.path {rootfs}: {e.strerror}") from None
    if not _same_file(st, posix.fstat(root_fd)):
        raise RootfsError(f"root.path {rootfs} is not the root directory of container process {pid} "
                          "(it has pivoted into another): not the rootfs the runtime set up")


def _runtime_mount(rootfs: str, pid: int, root_fd: int, where: str, proc: str, ref: int | str,
                   theirs: str, ours: str) -> tuple[int, str]:
    """Before pivot_root: (fd, mount point) of the runtime's rootfs mount that `rootfs` leads to.

    `theirs`, `ours`: the mount tables of the container and of `ref`."""

    with RootFS(f"{where}/root", fd=root_fd) as theirs_root:  # the container's mounts, chroot semantics
        try:
            fd = theirs_root.open(rootfs, posix.O_PATH | posix.O_DIRECTORY)
        except PathError as e:
            err = getattr(e, "errno", 0)  # a RootPathError keeps it
            why = posix.strerror(err) if err else str(e)
            raise RootfsError(f"root.path {rootfs}: not a directory in the mount namespace of container "
                              f"process {pid}: {why}") from None
    try:
        point, problem = _judge(fd, pid, proc, ref, theirs, ours)
        if problem:
            try:
                problem = f"it leads to {posix.readlink(f'{proc}/self/fd/{fd}')}: {problem}"
            except OSError:
                pass
            raise RootfsError(f"root.path {rootfs} is not the rootfs the runtime set up for container "
                              f"process {pid}: {problem}")
        return fd, point
    except OSError as e:
        posix.close(fd)
        raise RootfsError(f"root.path {rootfs}: cannot inspect it in container process {pid}: {e.strerror}") from None
    except BaseException:
        posix.close(fd)
        raise


def _judge(fd: int, pid: int, proc: str, ref: int | str, theirs: str, table: str) -> tuple[str, str | None]:
    """(mount point of the mount `fd` is on, why it is not the runtime's rootfs or None), from the container's
    mount table and `ref`'s."""

    mount_id = lookup.mount_id(fd, f"{proc}/self")
    up = posix.open("..", posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC, dir_fd=fd)
    try:
        is_mount_root = lookup.mount_id(up, f"{proc}/self") != mount_id  # '..' of a mount's root is on the mount below
    finally:
        posix.close(up)
    ours = mount_points(table)
    if not ours:  # never judge against an empty table: every mount would look like the runtime's
        raise RootfsError(f"cannot read the mount table of process {ref}, the namespace the container's "
                          "was copied from")
    line = mount_line(theirs, str(mount_id))
    if line is None:
        return "", f"it is on mount {mount_id}, which container process {pid} does not have"
    problem = runtime_mount_problem(line.split(" ", 5)[4], is_mount_root, mount_points(theirs).count, ours.count)
    return parse_mountinfo(line)[0].mount_point, problem


def runtime_mount_problem(point: str, is_mount_root: bool, theirs: Callable[[str], int],
                          ours: Callable[[str], int]) -> str | None:
    """Why the directory at the root (or not) of the mount at `point` is not a rootfs the runtime mounted.

    `theirs`/`ours`: how many mounts the container's and the hook's mount
    namespace have at a mount point (stacked mounts count each).  The
    container's namespace started as a copy of the hook's; a mount point it
    has more often is one the runtime mounted on.  None when it is the root
    of such a mount and no such mount lies above it.
    """
    if theirs(point) <= ours(point):
        return f"the mount it is on, at {point}, is also in the hook's own mount namespace: not one the runtime made"
    above = point
    while above != "/":
        above = pathnames.dirname(above)
        if theirs(above) > ours(above):
            return f"the mount it is on, at {point}, lies below {above}, a mount the runtime made"
    if not is_mount_root:
        return f"it is a directory inside the mount at {point}, not that mount's root"
    return None
