"""Host files mounted into a container by fd: opened and checked on the host, bound in the child, undone.

The mount half of apply (docs/security.md): every source is a host path
opened on the host before the child enters the container's mount
namespace and checked with fstat (a regular file, a directory or a socket
as the plan says; a char device with exactly the planned st_rdev, else
"invalid device node"); it is then mounted by fd onto a target fd that
`rootfs.RootFS` resolved inside the rootfs, never re-resolved by name.
With the new mount API the source is cloned on the host with its final
flags (open_tree + mount_setattr) and moved into place in one step, so no
read-write window exists; on older kernels it is bound and remounted
through /proc/self/fd, checking that the reopened target is the source
inode.  Every mount made is kept as an fd in `Undo`, so a failure later in
the start can take all of them back, newest first.
"""

from __future__ import annotations

import posix
import stat

from pyxis_hook import log, pathnames
from pyxis_hook.kernel import lookup, mountapi, syscall
from pyxis_hook.errors import ApplyError, PyxisHookError
from pyxis_hook.plan.build import DEV_OPTIONS, MountEdit, Plan
from pyxis_hook.record import record, replace
from pyxis_hook.apply.rootwrite import Entry

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pyxis_hook.rootfs import RootFS

#: mount option -> (MOUNT_ATTR_* for mount_setattr, MS_* for the legacy remount); the values
#: happen to be equal, the two names are kept so each call site says which API it speaks
_FLAGS = {"ro": (mountapi.MOUNT_ATTR_RDONLY, mountapi.MS_RDONLY), "nosuid": (mountapi.MOUNT_ATTR_NOSUID, mountapi.MS_NOSUID),
          "nodev": (mountapi.MOUNT_ATTR_NODEV, mountapi.MS_NODEV), "noexec": (mountapi.MOUNT_ATTR_NOEXEC, mountapi.MS_NOEXEC)}


@record
class Bind:
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
    #: `fd` is a mount of the namespace the binding process is in (`open_in_rootfs`), not a host file
    local: bool = False
    #: a device node: when its mount point cannot be made (a host /dev bound in) the start fails;
    #: any other bind is then skipped with a warning
    required: bool = False


def open_sources(plan: Plan, fds: list[int], clone: bool = False) -> list[Bind]:
    """The plan's device nodes and mounts opened on the host and checked to be what the plan says.

    `clone` (the new mount API): once every source passed its check, each
    is cloned (`clone_tree`) and its Bind made with its tree, one record a
    source (a 64-GPU start has ~70), not a second one by `replace`.
    """
    found: list[tuple[str, int, str, tuple[str, ...], str, str, bool]] = []
    for d in plan.devices:
        fd = open_host(d.host_path, fds)
        st = posix.fstat(fd)
        if not stat.S_ISCHR(st.st_mode) or st.st_rdev != posix.makedev(d.major, d.minor):
            got = f"{posix.major(st.st_rdev)}:{posix.minor(st.st_rdev)}" if stat.S_ISCHR(st.st_mode) else "not a char device"
            raise ApplyError(f"invalid device node {d.host_path}: expected c {d.major}:{d.minor}, found {got}")
        found.append((d.path, fd, "file", DEV_OPTIONS, d.host_path, "", True))
    for m in plan.mounts:
        if m.in_rootfs:
            continue  # opened in the container's mount namespace, by the child (`open_in_rootfs`)
        fd = open_host(m.host_path, fds)
        st = posix.fstat(fd)
        want = {"file": stat.S_ISREG, "dir": stat.S_ISDIR, "socket": stat.S_ISSOCK}.get(m.kind)
        if want is None:
            raise ApplyError(f"mount of {m.host_path}: unknown kind {m.kind!r}")
        if not want(st.st_mode):
            raise ApplyError(f"unexpected source file mode for {m.host_path}: not a {m.kind}")
        found.append((m.container_path, fd, "dir" if m.kind == "dir" else "file", m.options, m.host_path, m.covers,
                      False))
    # Bind's fields in order: container_path, fd, kind, options, host_path, tree, covers, local, required
    return [Bind(path, fd, kind, options, host, clone_tree(fd, options, host, fds) if clone else -1, covers, False,
                 required) for path, fd, kind, options, host, covers, required in found]


def open_in_rootfs(m: MountEdit, rfs: RootFS, fds: list[int]) -> Bind:
    """The source of an `in_rootfs` mount: the runtime's bind of a host file inside the rootfs, checked.

    Why the checks: the name is the image's.  It is opened inside the root
    without following its last component (a symlink of the image there is
    refused, never followed), must be a regular file, and must be a mount of
    its own (its mount differs from its directory's): the runtime's bind of
    the host's library, which the CDI spec asked for at that path.  A file
    of the image there instead (a spec whose mount did not happen) is one
    error line, not a bind of the image's file over another.
    """
    where = f"{m.host_path} (in the container)"
    fd = rfs.open(m.host_path, posix.O_PATH | posix.O_NOFOLLOW)
    fds.append(fd)
    if not stat.S_ISREG(posix.fstat(fd).st_mode):
        raise ApplyError(f"{where}: not a regular file: not the runtime's mount of the host's library "
                         f"that would cover {m.container_path}")
    parent = rfs.open(pathnames.dirname(m.host_path), posix.O_PATH | posix.O_DIRECTORY)
    try:
        own_mount = lookup.mount_id(fd) != lookup.mount_id(parent)
    finally:
        posix.close(parent)
    if not own_mount:
        raise ApplyError(f"{where}: a file of the image, not the runtime's mount of the host's library "
                         f"(the CDI spec's mount of it did not happen): {m.container_path} not covered")
    return Bind(m.container_path, fd, "file", m.options, m.host_path, covers=m.covers, local=True)


def clone(b: Bind, fds: list[int]) -> Bind:
    """`b` with its tree: a detached, final mount of its source (`clone_tree`)."""
    return replace(b, tree=clone_tree(b.fd, b.options, b.host_path, fds))


def clone_tree(fd: int, options: tuple[str, ...], what: str, fds: list[int]) -> int:
    """open_tree(OPEN_TREE_CLONE) + mount_setattr(flags, MS_PRIVATE) of source `fd`: a detached, final mount.

    Its fd is appended to `fds` (closed by whoever owns them).
    """
    attrs = 0
    for o in options:
        attrs |= _FLAGS.get(o, (0, 0))[0]
    tree = mountapi.open_tree(fd, "", mountapi.OPEN_TREE_CLONE | mountapi.OPEN_TREE_CLOEXEC | syscall.AT_EMPTY_PATH, what=what)
    fds.append(tree)
    mountapi.mount_setattr(tree, "", syscall.AT_EMPTY_PATH, attrs, 0, mountapi.MS_PRIVATE, what=what)
    return tree


def open_host(path: str, fds: list[int]) -> int:
    """O_PATH fd of a host source; host paths are trusted, symlinks among them (driver-root) are followed."""
    try:
        fd = posix.open(path, posix.O_PATH | posix.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{path}: {e.strerror}") from None
    fds.append(fd)
    return fd


class Undo:
    """Mounts made so far (as fds of the mount roots), undone newest first.

    An fd added with `owned=False` stays its caller's to close (a clone's
    tree, closed with the other host fds by `apply_plan`): undo uses it and
    never closes it.
    """

    def __init__(self) -> None:
        self.mount_fds: list[tuple[int, str, bool]] = []

    def add(self, fd: int, path: str, owned: bool = True) -> None:
        self.mount_fds.append((fd, path, owned))

    def run(self) -> list[str]:
        problems = []
        while self.mount_fds:
            fd, path, owned = self.mount_fds.pop()
            try:
                mountapi.umount2(lookup.proc_fd_path(fd), mountapi.MNT_DETACH, what=path)
            except (ApplyError, syscall.SyscallError) as e:
                problems.append(str(e))
            finally:
                if owned:
                    posix.close(fd)
        return problems

    def keep(self) -> None:
        """The mounts stay: close the fds undo owns and forget them all."""
        for fd, _path, owned in self.mount_fds:
            if owned:
                posix.close(fd)
        self.mount_fds = []



def same_file(a: int, b: int) -> bool:
    """Whether two fds are the same inode (a second hook run finds its own mount there)."""
    sa, sb = posix.fstat(a), posix.fstat(b)
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def bind(b: Bind, entry: Entry, undo: Undo) -> int:
    """Put source `b` onto the target entry with its flags; return the new mount's fd (for undo).

    A clone's tree fd, once moved, is the new mount's: undo borrows it (its
    owner, the list of fds `clone` put it in, closes it), no copy per mount.
    """
    if b.tree >= 0:
        mountapi.move_mount(b.tree, "", entry.fd, "", mountapi.MOVE_MOUNT_F_EMPTY_PATH | mountapi.MOVE_MOUNT_T_EMPTY_PATH,
                          what=entry.path)
        undo.add(b.tree, entry.path, owned=False)
        return b.tree
    # legacy: the host fd belongs to another mount namespace and cannot be a bind source here,
    # so open the same host path in this one (runc's namespace is a copy of the host's, before
    # pivot_root) and insist it is the very inode checked on the host.  A local source is a mount
    # of this namespace already: bound through its own fd.
    try:
        src = posix.dup(b.fd) if b.local else posix.open(b.host_path, posix.O_PATH | posix.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{b.host_path}: not reachable in the container mount namespace ({e.strerror}): "
                         "without the new mount API (open_tree, Linux >= 5.2) a host file is bound by its name "
                         "there, which a runtime that has already run pivot_root hides") from None
    try:
        want, got = posix.fstat(b.fd), posix.fstat(src)
        if (want.st_dev, want.st_ino) != (got.st_dev, got.st_ino):
            raise ApplyError(f"{b.host_path}: is another file in the container mount namespace")
        flags = 0
        for o in b.options:
            flags |= _FLAGS.get(o, (0, 0))[1]
        mountapi.mount(lookup.proc_fd_path(src), lookup.proc_fd_path(entry.fd), None, mountapi.MS_BIND, what=entry.path)
    finally:
        posix.close(src)
    top = reopen_mounted(entry, undo)
    got = posix.fstat(top)
    if (want.st_dev, want.st_ino) != (got.st_dev, got.st_ino):
        raise ApplyError(f"{entry.path}: the mount point changed while mounting {b.host_path}")
    target = lookup.proc_fd_path(top)
    mountapi.mount(None, target, None, mountapi.MS_REMOUNT | mountapi.MS_BIND | flags, what=entry.path)
    mountapi.mount(None, target, None, mountapi.MS_PRIVATE, what=entry.path)
    return top


def reopen_mounted(entry: Entry, undo: Undo) -> int:
    """Reopen `entry` to get the mount just made on it; if that fails, the mount is undone here.

    Until the reopened fd is in `undo` the new mount has no handle: undo it
    by the parent dir fd and name (no symlink followed), so a failed reopen
    leaves nothing mounted.
    """
    try:
        top = entry.reopen()
    except (OSError, PyxisHookError) as e:
        try:
            mountapi.umount2(f"{lookup.proc_fd_path(entry.parent_fd)}/{entry.name}",
                           mountapi.MNT_DETACH | mountapi.UMOUNT_NOFOLLOW, what=entry.path)
        except (ApplyError, syscall.SyscallError) as u:
            log.error(f"rollback: {u}")
        if isinstance(e, PyxisHookError):
            raise
        raise ApplyError(f"{entry.path}: cannot reopen after mounting: {e.strerror}") from None
    undo.add(top, entry.path)
    return top
