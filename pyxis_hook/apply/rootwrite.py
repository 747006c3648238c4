"""The writing half of a rootfs: mount points, links and their rollback, all relative to verified fds.

Creation uses the component walk for missing parents, mkdirat/openat(O_CREAT|O_EXCL|O_NOFOLLOW)
relative to the verified parent fd and an fstat afterwards (the CVE-2024-0132/0133/0134 class:
a name the image swaps between a check and a use never leads out of the rootfs), and remembers
what it created so `rollback` removes exactly that.  Only apply's child writes into a container.

A start puts many entries into few directories (a 4-GPU start: 14 mount points and 5 links
into /dev, usr/lib/<triplet>, usr/bin and a firmware dir), so each parent directory is
resolved once (IN_ROOT, as every lookup) and its O_PATH fd kept in a table by the path that
named it (`_parent`): the next entry there is made relative to the same verified fd, and
`check_dir`'s verdict on that fd (an fd keeps its mount) is asked once.  What could make a kept
fd name another directory than its path does now is a mount over a directory on the way, or a
link replaced on the way: the table is forgotten whenever a directory entry is handed out (the
only place a directory mount goes, `ensure_entry`), whenever a link of the image is replaced
(`symlink`), and after the confined ldconfig ran (it points links the image's configuration
chooses: apply's child calls `forget_dirs`).  A forgotten fd stays open while a record of what was created in it may need it;
every kept fd is closed once, by `rollback` or `close`.
"""

from __future__ import annotations

import errno
import posix
import stat

from pyxis_hook.apply.hostdirs import HostDirs
from pyxis_hook.rootfs import RACE_RETRIES, RootFS, RootPathError, path_error
from pyxis_hook.errors import PyxisHookError


class HostDirError(RootPathError):
    """Something would be created in a host directory bound into the container: it is not."""


class _Created:
    """Something RootFS created, remembered by (parent fd, name, inode) so rollback removes only that."""

    __slots__ = ("parent_fd", "name", "kind", "dev", "ino", "old_target")

    def __init__(self, parent_fd: int, name: str, kind: str, st: posix.stat_result, old_target: str | None = None):
        self.parent_fd = parent_fd
        self.name = name
        self.kind = kind  # dir | file | symlink
        self.dev = st.st_dev
        self.ino = st.st_ino
        self.old_target = old_target  # a symlink we replaced (restored on rollback)


class Entry:
    """A mount target: an fd of it plus its parent fd and name (to reopen it after mounting).

    The fd is O_PATH, or for a file made here the read-only fd that made it.
    `owns_parent` False: the parent fd is one the WritableRoot keeps (its
    table of directories, `_parent`) and closes; the entry only borrows it.
    """

    __slots__ = ("parent_fd", "name", "fd", "created", "path", "owns_parent")

    def __init__(self, parent_fd: int, name: str, fd: int, created: bool, path: str, owns_parent: bool = True):
        self.parent_fd = parent_fd
        self.name = name
        self.fd = fd
        self.created = created
        self.path = path
        self.owns_parent = owns_parent

    def reopen(self) -> int:
        """A fresh O_PATH fd of the name: after a mount it refers to the mount on top."""
        return posix.open(self.name, posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=self.parent_fd)

    def close(self) -> None:
        for fd in (self.fd, self.parent_fd) if self.owns_parent else (self.fd,):
            try:
                posix.close(fd)
            except OSError:
                pass


def _temp_symlink(parent: int, name: str, target: str) -> str:
    """Create a symlink to `target` under a fresh hidden name next to `name`; return that name."""
    for _ in range(16):
        tmp = f".{name[:200]}.pyxis-{posix.getpid()}-{posix.urandom(4).hex()}"
        try:
            posix.symlink(target, tmp, dir_fd=parent)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, posix.strerror(errno.EEXIST), name)


class WritableRoot(RootFS):
    """A RootFS that may create inside the root (`ensure_*`, `symlink`) and undo it (`rollback`)."""

    def __init__(self, path: str, *, fd: int | None = None, owner: tuple[int, int] | None = None,
                 use_openat2: bool | None = None, host_dirs: HostDirs | None = None):
        super().__init__(path, fd=fd, owner=owner, use_openat2=use_openat2)
        self.created: list[_Created] = []
        #: asked before anything is created in a directory (`check_dir`); None: no host dir is bound in
        self.host_dirs = host_dirs
        #: a parent directory's path (its components joined) -> the O_PATH fd it named when resolved
        self._dirs: dict[str, int] = {}
        #: every directory fd this root keeps (the table's, forgotten ones, records' copies): closed once
        self._kept: set[int] = set()
        #: `check_dir`'s answer per kept fd (an fd stays on its mount: the answer cannot change)
        self._verdicts: dict[int, str | None] = {}

    def check_dir(self, dir_fd: int, path: str) -> None:
        """Raise HostDirError when `path`'s directory, open as `dir_fd`, is a host directory bound in.

        Called before every creation (mount point, missing parent dir,
        link, the cache's temp file), on the very fd the creation is
        relative to: nothing is created there, and nothing before it was
        (what the walk creates lies below the directory it checked).
        """
        if self.host_dirs is None:
            return
        if dir_fd in self._verdicts:
            why = self._verdicts[dir_fd]
        else:
            try:
                why = self.host_dirs.why(dir_fd, self.fd)
            except OSError as e:
                raise path_error(path, self.path, e, "cannot tell whose directory holds ") from None
            if dir_fd in self._kept:  # only a kept fd's number cannot stand for another directory later
                self._verdicts[dir_fd] = why
        if why:
            raise HostDirError(f"{path} (in {self.path}): not created: {why}", errno.EXDEV)

    def close(self) -> None:
        self.created = []
        self._release()
        super().close()

    def _keep(self, fd: int) -> int:
        """`fd` (a directory of this root) kept until `rollback`/`close`; a copy when it is not ours to keep."""
        if fd not in self._kept:
            fd = posix.dup(fd)
            self._kept.add(fd)
        return fd

    def forget_dirs(self, in_use: int | None = None) -> None:
        """Resolve every parent directory again from now on: a mount or a link may have changed what paths name.

        A forgotten fd that a record of what was created names, or that the
        caller still uses (`in_use`: the parent of the entry it is handing
        out), stays open until `rollback` or `close`; the others are closed
        now, so a plan that alternates directory and file entries does not
        hold a parent fd per entry until the end.
        """
        self._dirs.clear()
        needed = {c.parent_fd for c in self.created}
        if in_use is not None:
            needed.add(in_use)
        for fd in self._kept - needed:
            self._kept.discard(fd)
            self._verdicts.pop(fd, None)
            try:
                posix.close(fd)
            except OSError:
                pass

    def _release(self) -> None:
        """Close every kept directory fd, once."""
        self._dirs.clear()
        self._verdicts.clear()
        kept, self._kept = self._kept, set()
        for fd in kept:
            try:
                posix.close(fd)
            except OSError:
                pass

    def __enter__(self) -> "WritableRoot":
        return self

    def _mkdir(self, parent: int, name: str, mode: int, path: str) -> bool:
        """mkdirat relative to a verified fd; False when someone else made it first."""
        self.check_dir(parent, path)
        try:
            posix.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:
            return False
        except OSError as e:
            raise path_error(path, self.path, e, "cannot create directory for ") from None
        self._record(parent, name, "dir", path)
        return True
    def _record(self, parent: int, name: str, kind: str, path: str, old_target: str | None = None,
                at: str | None = None, made_fd: int | None = None) -> posix.stat_result:
        """Remember what was just created at `at` (default `name`), then give it to the rootfs owner.

        Recorded *before* the chown, so a chown that fails still leaves the
        entry for rollback to remove.  `at` is a temporary name that the
        caller is about to rename to `name`.  Returns its stat (before the chown: the
        inode, type and device, which a chown does not change).  `made_fd`:
        the fd that created it (a file), asked by fd rather than by name.  The
        record names `parent` as kept (`_keep`: the very fd when it is one of
        the table's, else a copy).
        """
        at = at or name
        try:
            st = posix.fstat(made_fd) if made_fd is not None else posix.stat(at, dir_fd=parent, follow_symlinks=False)
            self.created.append(_Created(self._keep(parent), name, kind, st, old_target))
            if self.owner and (st.st_uid, st.st_gid) != self.owner:
                if made_fd is not None:
                    posix.fchown(made_fd, self.owner[0], self.owner[1])
                else:
                    posix.chown(at, self.owner[0], self.owner[1], dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            raise path_error(path, self.path, e, "cannot record or chown created ") from None
        return st

    def _may_create(self, parent: int, path: str) -> bool:
        """Whether `check_dir` lets a mount point be made in `parent` (any error there: False, the caller looks first).

        Looking first is the way every target went before: an existing one is
        reused without this check, a missing one gets it again in `_create`,
        which then raises what it raised.
        """
        try:
            self.check_dir(parent, path)
        except PyxisHookError:
            return False
        return True

    def _parent(self, path: str, create_mode: int | None) -> tuple[int, str | None]:
        """A kept parent fd + last name: the table's, else openat2 for an existing parent, else the creating walk.

        The fd is the root's (`_kept`): callers borrow it and never close it.
        """
        parts = [c for c in path.split("/") if c not in ("", ".")]
        if not parts or parts[-1] == "..":
            fd, name = self._walk(path, follow_last=False, create_mode=create_mode)
            self._kept.add(fd)
            return fd, name
        name = parts.pop()
        where = "/".join(parts)
        fd = self._dirs.get(where)
        if fd is not None:
            return fd, name
        if self.use_openat2:
            try:
                fd = self.open(where or "/", posix.O_PATH | posix.O_DIRECTORY)
            except RootPathError as e:
                if e.errno not in (errno.ENOENT,):
                    raise path_error(path, self.path, e.errno) from None  # name the whole path
        if fd is None:
            fd, _last = self._walk(path, follow_last=False, create_mode=create_mode)  # `name`: not `..`, not a link
        self._kept.add(fd)
        self._dirs[where] = fd
        return fd, name
    # -- creation ---------------------------------------------------------
    def ensure_entry(self, path: str, kind: str = "file", mode: int | None = None) -> Entry:
        """Make sure a mount point of `kind` ("file" or "dir") exists at `path`; return it as an Entry.

        An existing entry of the right type is reused; a symlink at the target is
        refused (mounting over it would follow it), as is a type mismatch.

        Where `check_dir` allows creating, the mount point is first made
        outright (O_EXCL): on a start the usual target is missing, and a stat
        to find that out first is a syscall and an exception per device node.
        EEXIST (for a name that exists the kernel answers that before asking
        whether it could create one, on a read-only or full filesystem too)
        goes the way it always went, stat first; a host directory is never
        created in, and what already stands in one is still reused.

        The entry borrows its parent fd from the root's table (`_parent`).  A
        directory entry is where a directory mount goes, which changes what
        every path through it names: handing one out forgets the table
        (`forget_dirs`), and the caller mounts on it before it asks for
        another path.
        """
        if mode is None:
            mode = 0o755 if kind == "dir" else 0o644
        parent, name = self._parent(path, create_mode=0o755)
        if kind == "dir":
            self.forget_dirs(in_use=parent)
        if name is None:
            if kind != "dir":
                raise RootPathError(f"{path} (in {self.path}): is a directory", errno.EISDIR)
            return Entry(parent, ".", posix.open(".", posix.O_PATH | posix.O_CLOEXEC, dir_fd=parent), False, path,
                         owns_parent=False)
        outright = self._may_create(parent, path)
        for _ in range(RACE_RETRIES):
            created = False
            made = None
            if outright:
                outright = False  # once: from then on what is there is looked at first, as always
                made = self._create(parent, name, kind, mode, path, checked=True)
            if made is None:
                try:
                    st = posix.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    made = self._create(parent, name, kind, mode, path)
                    if made is None:
                        continue
                except OSError as e:
                    raise path_error(path, self.path, e) from None
            if made is not None:
                st, made_fd = made
                if made_fd is not None:  # a file made here: the fd that made it is the mount point
                    return Entry(parent, name, made_fd, True, path, owns_parent=False)
                created = True  # a directory: the open below must find the inode just made
            self._check_type(st, kind, path)
            try:
                fd = posix.open(name, posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=parent)
            except FileNotFoundError:
                continue  # removed between stat and open: look again
            except OSError as e:
                raise path_error(path, self.path, e) from None
            fst = posix.fstat(fd)
            if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                posix.close(fd)  # replaced between stat and open: look again
                continue
            return Entry(parent, name, fd, created, path, owns_parent=False)
        raise path_error(path, self.path, errno.ELOOP, "changed while resolving: ")
    def ensure_file(self, path: str, mode: int = 0o644) -> int:
        """An O_PATH fd of a file mount point at `path`, created (empty) if missing."""
        return self.ensure_entry(path, "file", mode).fd
    def ensure_dir(self, path: str, mode: int = 0o755) -> int:
        """An O_PATH fd of a directory at `path`, created (with missing parents) if missing."""
        return self.ensure_entry(path, "dir", mode).fd
    def _create(self, parent: int, name: str, kind: str, mode: int,
                path: str, checked: bool = False) -> tuple[posix.stat_result, int | None] | None:
        """Make the mount point: its stat and, for a file, the read-only fd that created it.

        None when someone else made one there first.  The file's own fd is
        the mount target (no reopen by name: nothing can swap the inode
        under it), and what its record is taken from (fstat, not a stat by
        name); a directory has none (mkdirat returns no fd).  `checked`:
        `check_dir` was asked already.
        """
        if not checked:
            self.check_dir(parent, path)
        fd = None
        try:
            if kind == "dir":
                posix.mkdir(name, mode, dir_fd=parent)
            else:
                fd = posix.open(name, posix.O_RDONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC, mode,
                                dir_fd=parent)
        except FileExistsError:
            return None
        except OSError as e:
            raise path_error(path, self.path, e, "cannot create mount point ") from None
        try:
            # first: whatever fails next, rollback removes it
            st = self._record(parent, name, kind, path, made_fd=fd)
        except BaseException:
            if fd is not None:
                posix.close(fd)
            raise
        return st, fd
    def _check_type(self, st: posix.stat_result, kind: str, path: str) -> None:
        if stat.S_ISLNK(st.st_mode):
            raise RootPathError(f"{path} (in {self.path}): is a symlink in the image; refusing to mount over it",
                                errno.ELOOP)
        if kind == "dir" and not stat.S_ISDIR(st.st_mode):
            raise RootPathError(f"{path} (in {self.path}): exists and is not a directory", errno.ENOTDIR)
        if kind != "dir" and stat.S_ISDIR(st.st_mode):
            raise RootPathError(f"{path} (in {self.path}): exists and is a directory", errno.EISDIR)
    def symlink(self, path: str, target: str) -> bool:
        """Create symlink `path` -> `target`; True if something changed.

        A link that already points at `target` is kept; a link pointing elsewhere
        is replaced (and restored by rollback); any other existing file is an
        EEXIST RootPathError the caller may choose to ignore.  Replacing a
        link forgets the root's table of directories (`forget_dirs`): a path
        through the old link named another directory.
        """
        parent, name = self._parent(path, create_mode=0o755)
        if name is None:
            raise RootPathError(f"{path} (in {self.path}): is a directory", errno.EISDIR)
        old = None
        try:
            old = posix.readlink(name, dir_fd=parent)
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno == errno.EINVAL:
                raise RootPathError(f"{path} (in {self.path}): exists and is not a symlink", errno.EEXIST) from None
            raise path_error(path, self.path, e) from None
        if old == target:
            return False
        self.check_dir(parent, path)  # a new link, or the image's replaced: both write the directory
        if old is None:
            try:
                posix.symlink(target, name, dir_fd=parent)
            except OSError as e:
                raise path_error(path, self.path, e, "cannot create symlink ") from None
            self._record(parent, name, "symlink", path)
            return True
        # replace atomically: the image's link stays in place until the new one is complete
        try:
            tmp = _temp_symlink(parent, name, target)
        except OSError as e:
            raise path_error(path, self.path, e, "cannot create symlink ") from None
        recorded = len(self.created)
        try:
            self._record(parent, name, "symlink", path, old, at=tmp)
            posix.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException as e:
            try:
                posix.unlink(tmp, dir_fd=parent)
            except OSError:
                pass
            del self.created[recorded:]  # nothing of ours is at `name`: forget it (its fd is kept)
            if isinstance(e, OSError):
                raise path_error(path, self.path, e, "cannot replace symlink ") from None
            raise
        self.forget_dirs()
        return True
    def rollback(self) -> list[str]:
        """Remove what this RootFS created, newest first; return one line per thing it could not undo.

        Each entry is removed only if the same inode is still there, so a file
        someone else put in its place is left alone.  Then every directory fd
        the root kept is closed, once (records share them).
        """
        problems = []
        while self.created:
            c = self.created.pop()
            try:
                st = posix.stat(c.name, dir_fd=c.parent_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (c.dev, c.ino):
                    if c.kind == "dir":
                        posix.rmdir(c.name, dir_fd=c.parent_fd)
                    elif c.old_target is not None:  # put the image's link back in one rename
                        tmp = _temp_symlink(c.parent_fd, c.name, c.old_target)
                        try:
                            posix.replace(tmp, c.name, src_dir_fd=c.parent_fd, dst_dir_fd=c.parent_fd)
                        except OSError:
                            posix.unlink(tmp, dir_fd=c.parent_fd)
                            raise
                    else:
                        posix.unlink(c.name, dir_fd=c.parent_fd)
            except OSError as e:
                problems.append(f"cannot remove {c.name} created in {self.path}: {e.strerror}")
        self._release()
        return problems
