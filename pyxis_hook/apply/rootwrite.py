"""The writing half of a rootfs: mount points, links and their rollback, all relative to verified fds.

Creation uses the component walk for missing parents, mkdirat/openat(O_CREAT|O_EXCL|O_NOFOLLOW)
relative to the verified parent fd and an fstat afterwards (the CVE-2024-0132/0133/0134 class:
a name the image swaps between a check and a use never leads out of the rootfs), and remembers
what it created so `rollback` removes exactly that.  Only apply's child writes into a container.
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
    `owns_parent` False: the parent fd is the one the WritableRoot keeps to
    remove the file on rollback, and it closes it; the entry only borrows it.
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

    def check_dir(self, dir_fd: int, path: str) -> None:
        """Raise HostDirError when `path`'s directory, open as `dir_fd`, is a host directory bound in.

        Called before every creation (mount point, missing parent dir,
        link, the cache's temp file), on the very fd the creation is
        relative to: nothing is created there, and nothing before it was
        (what the walk creates lies below the directory it checked).
        """
        if self.host_dirs is None:
            return
        try:
            why = self.host_dirs.why(dir_fd, self.fd)
        except OSError as e:
            raise path_error(path, self.path, e, "cannot tell whose directory holds ") from None
        if why:
            raise HostDirError(f"{path} (in {self.path}): not created: {why}", errno.EXDEV)

    def close(self) -> None:
        for c in self.created:
            try:
                posix.close(c.parent_fd)
            except OSError:
                pass
        self.created = []
        super().close()

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
                at: str | None = None, keep_parent: bool = False) -> posix.stat_result:
        """Remember what was just created at `at` (default `name`), then give it to the rootfs owner.

        Recorded *before* the chown, so a chown that fails still leaves the
        entry for rollback to remove.  `at` is a temporary name that the
        caller is about to rename to `name`.  Returns its stat (before the chown: the
        inode, type and device, which a chown does not change).  The record
        holds a copy of `parent`, or with `keep_parent` that fd itself, which
        the caller then no longer closes (`_holds`).
        """
        at = at or name
        try:
            st = posix.stat(at, dir_fd=parent, follow_symlinks=False)
            self.created.append(_Created(parent if keep_parent else posix.dup(parent), name, kind, st, old_target))
            if self.owner and (st.st_uid, st.st_gid) != self.owner:
                posix.chown(at, self.owner[0], self.owner[1], dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            raise path_error(path, self.path, e, "cannot record or chown created ") from None
        return st
    def _holds(self, fd: int) -> bool:
        """Whether a record of what was created holds `fd` itself (`keep_parent`): closed by `close`/`rollback`.

        Open fds are distinct numbers, so a record's fd equal to `fd` is that
        very fd, never a copy of it.
        """
        return any(c.parent_fd == fd for c in self.created)

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
        """Parent fd + last name: openat2 for an existing parent, else the creating walk."""
        parts = [c for c in path.split("/") if c not in ("", ".")]
        if self.use_openat2 and parts and parts[-1] != "..":
            try:
                return self.open("/".join(parts[:-1]) or "/", posix.O_PATH | posix.O_DIRECTORY), parts[-1]
            except RootPathError as e:
                if e.errno not in (errno.ENOENT,):
                    raise path_error(path, self.path, e.errno) from None  # name the whole path
        return self._walk(path, follow_last=False, create_mode=create_mode)
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
        """
        if mode is None:
            mode = 0o755 if kind == "dir" else 0o644
        parent, name = self._parent(path, create_mode=0o755)
        try:
            if name is None:
                if kind != "dir":
                    raise RootPathError(f"{path} (in {self.path}): is a directory", errno.EISDIR)
                return Entry(parent, ".", posix.open(".", posix.O_PATH | posix.O_CLOEXEC, dir_fd=parent), False, path)
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
                return Entry(parent, name, fd, created, path)
            raise path_error(path, self.path, errno.ELOOP, "changed while resolving: ")
        except BaseException:
            if not self._holds(parent):
                posix.close(parent)
            raise
    def ensure_file(self, path: str, mode: int = 0o644) -> int:
        """An O_PATH fd of a file mount point at `path`, created (empty) if missing."""
        e = self.ensure_entry(path, "file", mode)
        if e.owns_parent:
            posix.close(e.parent_fd)
        return e.fd
    def ensure_dir(self, path: str, mode: int = 0o755) -> int:
        """An O_PATH fd of a directory at `path`, created (with missing parents) if missing."""
        e = self.ensure_entry(path, "dir", mode)
        if e.owns_parent:
            posix.close(e.parent_fd)
        return e.fd
    def _create(self, parent: int, name: str, kind: str, mode: int,
                path: str, checked: bool = False) -> tuple[posix.stat_result, int | None] | None:
        """Make the mount point: its stat and, for a file, the read-only fd that created it.

        None when someone else made one there first.  The file's own fd is
        the mount target (no reopen by name: nothing can swap the inode
        under it); a directory has none (mkdirat returns no fd).  A file's
        record keeps `parent` itself (`keep_parent`: ensure_entry's entry
        borrows it).  `checked`: `check_dir` was asked already.
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
            st = self._record(parent, name, kind, path, keep_parent=fd is not None)
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
        EEXIST RootPathError the caller may choose to ignore.
        """
        parent, name = self._parent(path, create_mode=0o755)
        try:
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
                while len(self.created) > recorded:  # nothing of ours is at `name`: forget it
                    posix.close(self.created.pop().parent_fd)
                if isinstance(e, OSError):
                    raise path_error(path, self.path, e, "cannot replace symlink ") from None
                raise
            return True
        finally:
            posix.close(parent)
    def rollback(self) -> list[str]:
        """Remove what this RootFS created, newest first; return one line per thing it could not undo.

        Each entry is removed only if the same inode is still there, so a file
        someone else put in its place is left alone.
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
            finally:
                posix.close(c.parent_fd)
        return problems
