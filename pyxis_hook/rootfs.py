"""Paths inside a root (a container rootfs or the host's driver-root) that never escape it.

`resolve_in_root` is the string-level walk glibc's and the kernel's chroot
semantics imply: absolute symlinks restart at the root, `..` at the root stays
at the root (as openat2's RESOLVE_IN_ROOT does), a chain of more than 40 links
is a loop.  It is used for *reading* (discovery, ldd, ldcheck).  Code that
*writes or mounts* inside a container must use the fd-based helpers, which do
not re-resolve names after checking them.
"""

from __future__ import annotations

import errno
import os
import stat

from pyxis_hook.errors import PathError

MAX_SYMLINKS = 40


def resolve_in_root(root: str, path: str, *, follow_last: bool = True) -> str:
    """Return the host path that `path` names when `root` is '/'.

    Missing components are kept as they are (callers decide whether a missing
    file is an error).  The result always starts with `root` (normalised).
    Raises PathError on a symlink loop.
    """
    root = os.path.normpath(os.path.abspath(root))
    if root == "/":
        prefix = ""
    else:
        prefix = root
    todo = [c for c in path.split("/") if c not in ("", ".")]
    todo.reverse()
    done: list[str] = []
    links = 0
    while todo:
        comp = todo.pop()
        if comp == "..":
            if done:
                done.pop()
            continue
        candidate = prefix + "/" + "/".join(done + [comp])
        is_last = not todo
        try:
            st = os.lstat(candidate)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                done.append(comp)
                continue
            raise PathError(f"{candidate}: {e.strerror}") from None
        if stat.S_ISLNK(st.st_mode) and (follow_last or not is_last):
            links += 1
            if links > MAX_SYMLINKS:
                raise PathError(f"{path}: too many levels of symbolic links inside {root}")
            target = os.readlink(candidate)
            parts = [c for c in target.split("/") if c not in ("", ".")]
            if target.startswith("/"):
                done = []
            todo.extend(reversed(parts))
            continue
        done.append(comp)
    return (prefix + "/" + "/".join(done)) if done else (prefix or "/")


def try_resolve_in_root(root: str, path: str) -> str | None:
    """`resolve_in_root`, None for a path that loops or cannot be walked (for checks, not errors)."""
    try:
        return resolve_in_root(root, path)
    except PathError:
        return None


def to_root_relative(root: str, host_path: str) -> str:
    """Inverse of resolve_in_root's prefixing: '/ROOT/usr/lib/x' -> '/usr/lib/x'."""
    root = os.path.normpath(os.path.abspath(root))
    if root == "/":
        return host_path
    if host_path == root:
        return "/"
    if not host_path.startswith(root + "/"):
        raise PathError(f"{host_path} is not inside {root}")
    return host_path[len(root):]


# --------------------------------------------------------------------------
# fd-based access for writes and mounts
# --------------------------------------------------------------------------

#: how often a component that changes type under us (dir <-> symlink) is re-examined before giving up
_RACE_RETRIES = 8


def open_regular_path(path: str) -> int:
    """An O_RDONLY fd of the regular file at host path `path` (links followed); OSError for anything else.

    For the paths a user or an image puts in front of a diagnostic command
    (`ldcache --cache`, `ldd`, ldcheck on an image, pyxis.conf): the file is
    opened O_PATH and fstat'ed first, so a FIFO never blocks, a device's
    driver never sees an open(), and a directory is EISDIR; only then is the
    same inode opened for reading, through /proc/self/fd.
    """
    pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        mode = os.fstat(pfd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    finally:
        os.close(pfd)


def read_regular_path(path: str, limit: int) -> bytes:
    """The bytes of the regular file at host path `path` (see `open_regular_path`), at most `limit`."""
    return _read_capped(open_regular_path(path), limit)


def _read_capped(fd: int, limit: int) -> bytes:
    """All of open file `fd` (closed here), or OSError(EFBIG) past `limit` bytes: the cap bounds memory."""
    try:
        if os.fstat(fd).st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes")
        chunks, left = [], limit + 1  # one byte more tells a file that grew past the cap
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


class RootPathError(PathError):
    """A PathError that keeps the errno, so callers can tell 'missing' from 'refused'."""

    def __init__(self, message: str, err: int = 0):
        super().__init__(message)
        self.errno = err


class _Created:
    """Something RootFS created, remembered by (parent fd, name, inode) so rollback removes only that."""

    __slots__ = ("parent_fd", "name", "kind", "dev", "ino", "old_target")

    def __init__(self, parent_fd: int, name: str, kind: str, st: os.stat_result, old_target: str | None = None):
        self.parent_fd = parent_fd
        self.name = name
        self.kind = kind  # dir | file | symlink
        self.dev = st.st_dev
        self.ino = st.st_ino
        self.old_target = old_target  # a symlink we replaced (restored on rollback)


class Entry:
    """A mount target: an O_PATH fd of it plus its parent fd and name (to reopen it after mounting)."""

    __slots__ = ("parent_fd", "name", "fd", "created", "path")

    def __init__(self, parent_fd: int, name: str, fd: int, created: bool, path: str):
        self.parent_fd = parent_fd
        self.name = name
        self.fd = fd
        self.created = created
        self.path = path

    def reopen(self) -> int:
        """A fresh O_PATH fd of the name: after a mount it refers to the mount on top."""
        return os.open(self.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.parent_fd)

    def close(self) -> None:
        for fd in (self.fd, self.parent_fd):
            try:
                os.close(fd)
            except OSError:
                pass


def _temp_symlink(parent: int, name: str, target: str) -> str:
    """Create a symlink to `target` under a fresh hidden name next to `name`; return that name."""
    for _ in range(16):
        tmp = f".{name[:200]}.pyxis-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.symlink(target, tmp, dir_fd=parent)
            return tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), name)


def _err(path: str, root: str, e: OSError | int, what: str = "") -> RootPathError:
    err = e if isinstance(e, int) else (e.errno or 0)
    text = os.strerror(err)
    if err == errno.ELOOP:
        text = "too many levels of symbolic links, or a symlink where none is allowed"
    if err == errno.EXDEV:
        text = "crosses a magic link or leaves the root"
    if err == errno.EAGAIN:  # only openat2 answers it, after kernel.openat2's retries
        from pyxis_hook.apply import kernel  # loaded: RootFS used openat2

        text = kernel.BUSY
    return RootPathError(f"{what}{path} (in {root}): {text}", err)


class RootFS:
    """A container rootfs opened once; every path is resolved relative to that fd, never by name.

    Semantics are chroot's (openat2 RESOLVE_IN_ROOT): absolute symlinks restart
    at the root, `..` at the root stays there, magic links (/proc/self/root)
    are refused.  With openat2 (kernel >= 5.6) the kernel does the walk; the
    fallback walks one component at a time with O_PATH|O_NOFOLLOW fds and
    readlinkat, splicing link text itself, so no kernel-level link is ever
    followed.  Creation (`ensure_*`, `symlink`) uses the component walk for
    missing parents, mkdirat/openat(O_CREAT|O_EXCL|O_NOFOLLOW) relative to the
    verified parent fd and an fstat afterwards (the CVE-2024-0132/0133/0134
    class), and remembers what it created so `rollback` can remove exactly that.
    """

    def __init__(self, path: str, *, fd: int | None = None, owner: tuple[int, int] | None = None,
                 use_openat2: bool | None = None):
        """Open `path`; or, with `fd`, work on a copy of that directory fd and use `path` only as its name.

        `fd` is how a rootfs pinned elsewhere (`rootpin`) is used without
        resolving its name again: whatever `path` names by now, only the fd counts.
        """
        from pyxis_hook.apply import kernel

        self.path = os.path.normpath(os.path.abspath(path))
        try:
            self.fd = os.open(self.path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) if fd is None else os.dup(fd)
        except OSError as e:
            raise RootPathError(f"container rootfs {self.path}: {e.strerror}", e.errno or 0) from None
        self.owner = owner
        self.use_openat2 = kernel.have_openat2() if use_openat2 is None else use_openat2
        self.created: list[_Created] = []

    # -- lifetime -------------------------------------------------------
    def close(self) -> None:
        for c in self.created:
            try:
                os.close(c.parent_fd)
            except OSError:
                pass
        self.created = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "RootFS":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def readonly(self) -> bool:
        """True when the filesystem holding the rootfs is mounted read-only."""
        return bool(os.fstatvfs(self.fd).f_flag & os.ST_RDONLY)

    # -- resolution -----------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """Open `path` inside the root (IN_ROOT semantics); the caller closes the fd."""
        if self.use_openat2:
            from pyxis_hook.apply import kernel

            try:
                return kernel.openat2(self.fd, path, flags, mode,
                                      kernel.RESOLVE_IN_ROOT | kernel.RESOLVE_NO_MAGICLINKS)
            except kernel.SyscallError as e:
                raise _err(path, self.path, e.errno) from None
        nofollow = bool(flags & os.O_NOFOLLOW)
        for _ in range(_RACE_RETRIES):
            parent, name = self._walk(path, follow_last=not nofollow, create_mode=None)
            try:
                fd = os.open(name or ".", flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent)
            except OSError as e:
                raise _err(path, self.path, e) from None
            finally:
                os.close(parent)
            if nofollow or not stat.S_ISLNK(os.fstat(fd).st_mode):
                return fd
            os.close(fd)  # became a symlink between the walk and the open: walk again
        raise _err(path, self.path, errno.ELOOP, "changed while resolving: ")

    def exists(self, path: str) -> bool:
        try:
            os.close(self.open(path, os.O_PATH))
            return True
        except RootPathError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise

    def open_regular(self, path: str) -> int:
        """An O_RDONLY fd of the regular file at `path`; anything else is a RootPathError.

        The image chooses what the name is, so it is opened O_PATH first and
        only a regular file is opened for reading, as the same inode through
        /proc/self/fd: a device node placed under a library's or a config
        file's name (a watchdog, a tape) never has its driver's open() run by
        root, and a FIFO never blocks.  Directories are EISDIR, so callers
        can treat one as ldconfig does.
        """
        pfd = self.open(path, os.O_PATH)
        try:
            mode = os.fstat(pfd).st_mode
            if stat.S_ISDIR(mode):
                raise RootPathError(f"{path} (in {self.path}): is a directory", errno.EISDIR)
            if not stat.S_ISREG(mode):
                raise RootPathError(f"{path} (in {self.path}): not a regular file", errno.EINVAL)
            try:
                return os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
            except OSError as e:
                raise _err(path, self.path, e, "cannot open ") from None
        finally:
            os.close(pfd)

    def read_bytes(self, path: str, limit: int) -> bytes:
        """Read a regular file of the image, at most `limit` bytes; anything else is a RootPathError.

        `open_regular` refuses FIFOs, devices (/dev/zero would never end) and
        directories before anything is read; the cap bounds memory.
        """
        fd = self.open_regular(path)
        try:
            return _read_capped(fd, limit)
        except OSError as e:
            if e.errno == errno.EFBIG:
                raise RootPathError(f"{path} (in {self.path}): larger than {limit} bytes", errno.EFBIG) from None
            raise _err(path, self.path, e, "cannot read ") from None

    def read_text(self, path: str, limit: int = 65536) -> str:
        """Read a small regular text file of the image; FIFOs, devices and huge files are refused."""
        return self.read_bytes(path, limit).decode("utf-8", "replace")

    def locate(self, path: str, *, hidden: tuple[str, ...] = ()) -> tuple[int, str]:
        """(O_PATH fd of what `path` names, the path it resolves to: no symlink, no `..`).

        Always the component walk, openat2 or not: a caller that needs the
        resolved name gets it from the very fds it opened (relative includes
        of ld.so.conf), and a top-level directory named in `hidden` (/proc,
        /sys) is missing however the path reaches it, as in a view where
        they are masked.  A missing path is a RootPathError with ENOENT.
        """
        for _ in range(_RACE_RETRIES):
            names: list[str] = []
            parent, name = self._walk(path, follow_last=True, create_mode=None, names=names, hidden=hidden)
            if name is None:
                return parent, "/" + "/".join(names)
            try:
                fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
            except OSError as e:
                raise _err(path, self.path, e) from None
            finally:
                os.close(parent)
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                os.close(fd)
                continue  # became a symlink between the walk and the open: walk again
            if not names and name in hidden and stat.S_ISDIR(mode):
                os.close(fd)
                raise _err(path, self.path, errno.ENOENT)
            return fd, "/" + "/".join([*names, name])
        raise _err(path, self.path, errno.ELOOP, "changed while resolving: ")

    def _walk(self, path: str, *, follow_last: bool, create_mode: int | None,
              names: list[str] | None = None, hidden: tuple[str, ...] = ()) -> tuple[int, str | None]:
        """Resolve all but the last component; return (owned parent dir fd, last name or None).

        None means the path names a directory reached through `..` or `/`.
        With `create_mode`, missing intermediate directories are created.
        `names`, when given, receives the parent's resolved components (no
        symlink, no `..`); a top-level directory named in `hidden` is missing.
        """
        todo = [c for c in path.split("/") if c not in ("", ".")]
        todo.reverse()
        stack: list[int] = []
        resolved = [] if names is None else names
        links = 0
        try:
            while todo:
                comp = todo.pop()
                if comp == "..":
                    if stack:
                        os.close(stack.pop())
                        resolved.pop()
                    continue
                cur = stack[-1] if stack else self.fd
                is_last = not todo
                for _ in range(_RACE_RETRIES):
                    try:
                        target = os.readlink(comp, dir_fd=cur)
                    except OSError as e:
                        if e.errno == errno.EINVAL:
                            target = None
                        elif e.errno == errno.ENOENT:
                            target = None
                            if not is_last:
                                if create_mode is None:
                                    raise _err(path, self.path, e) from None
                                if not self._mkdir(cur, comp, create_mode, path):
                                    continue
                        else:
                            raise _err(path, self.path, e) from None
                    if target is not None:
                        if is_last and not follow_last:
                            return self._own(stack, cur), comp
                        links += 1
                        if links > MAX_SYMLINKS:
                            raise _err(path, self.path, errno.ELOOP)
                        if target.startswith("/"):
                            while stack:
                                os.close(stack.pop())
                            resolved.clear()
                        todo.extend(reversed([c for c in target.split("/") if c not in ("", ".")]))
                        break
                    if is_last:
                        return self._own(stack, cur), comp
                    fd = self._open_dir(cur, comp, path)
                    if fd is None:
                        continue  # changed type under us: look again
                    stack.append(fd)
                    resolved.append(comp)
                    if len(resolved) == 1 and comp in hidden:
                        raise _err(path, self.path, errno.ENOENT)
                    break
                else:
                    raise _err(path, self.path, errno.ELOOP, "changed while resolving: ")
            cur = stack[-1] if stack else self.fd
            return self._own(stack, cur), None
        finally:
            for fd in stack:
                os.close(fd)

    @staticmethod
    def _own(stack: list[int], cur: int) -> int:
        """Hand the caller an fd of `cur` that survives the walk's cleanup."""
        return os.dup(cur)

    def _open_dir(self, cur: int, comp: str, path: str) -> int | None:
        try:
            fd = os.open(comp, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
                try:
                    st = os.stat(comp, dir_fd=cur, follow_symlinks=False)
                except OSError:
                    return None
                if stat.S_ISLNK(st.st_mode):
                    return None
                raise _err(path, self.path, errno.ENOTDIR) from None
            raise _err(path, self.path, e) from None
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        return fd

    def _mkdir(self, parent: int, name: str, mode: int, path: str) -> bool:
        """mkdirat relative to a verified fd; False when someone else made it first."""
        try:
            os.mkdir(name, mode, dir_fd=parent)
        except FileExistsError:
            return False
        except OSError as e:
            raise _err(path, self.path, e, "cannot create directory for ") from None
        self._record(parent, name, "dir", path)
        return True

    def _record(self, parent: int, name: str, kind: str, path: str, old_target: str | None = None,
                at: str | None = None) -> None:
        """Remember what was just created at `at` (default `name`), then give it to the rootfs owner.

        Recorded *before* the chown, so a chown that fails still leaves the
        entry for rollback to remove.  `at` is a temporary name that the
        caller is about to rename to `name`.
        """
        at = at or name
        try:
            st = os.stat(at, dir_fd=parent, follow_symlinks=False)
            self.created.append(_Created(os.dup(parent), name, kind, st, old_target))
            if self.owner and (st.st_uid, st.st_gid) != self.owner:
                os.chown(at, self.owner[0], self.owner[1], dir_fd=parent, follow_symlinks=False)
        except OSError as e:
            raise _err(path, self.path, e, "cannot record or chown created ") from None

    def _parent(self, path: str, create_mode: int | None) -> tuple[int, str | None]:
        """Parent fd + last name: openat2 for an existing parent, else the creating walk."""
        parts = [c for c in path.split("/") if c not in ("", ".")]
        if self.use_openat2 and parts and parts[-1] != "..":
            try:
                return self.open("/".join(parts[:-1]) or "/", os.O_PATH | os.O_DIRECTORY), parts[-1]
            except RootPathError as e:
                if e.errno not in (errno.ENOENT,):
                    raise _err(path, self.path, e.errno) from None  # name the whole path
        return self._walk(path, follow_last=False, create_mode=create_mode)

    # -- creation ---------------------------------------------------------
    def ensure_entry(self, path: str, kind: str = "file", mode: int | None = None) -> Entry:
        """Make sure a mount point of `kind` ("file" or "dir") exists at `path`; return it as an Entry.

        An existing entry of the right type is reused; a symlink at the target is
        refused (mounting over it would follow it), as is a type mismatch.
        """
        if mode is None:
            mode = 0o755 if kind == "dir" else 0o644
        parent, name = self._parent(path, create_mode=0o755)
        try:
            if name is None:
                if kind != "dir":
                    raise RootPathError(f"{path} (in {self.path}): is a directory", errno.EISDIR)
                return Entry(parent, ".", os.open(".", os.O_PATH | os.O_CLOEXEC, dir_fd=parent), False, path)
            for _ in range(_RACE_RETRIES):
                created = False
                try:
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except FileNotFoundError:
                    created = self._create(parent, name, kind, mode, path)
                    if not created:
                        continue
                    st = os.stat(name, dir_fd=parent, follow_symlinks=False)
                except OSError as e:
                    raise _err(path, self.path, e) from None
                self._check_type(st, kind, path)
                try:
                    fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
                except FileNotFoundError:
                    continue  # removed between stat and open: look again
                except OSError as e:
                    raise _err(path, self.path, e) from None
                fst = os.fstat(fd)
                if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
                    os.close(fd)  # replaced between stat and open: look again
                    continue
                return Entry(parent, name, fd, created, path)
            raise _err(path, self.path, errno.ELOOP, "changed while resolving: ")
        except BaseException:
            os.close(parent)
            raise

    def ensure_file(self, path: str, mode: int = 0o644) -> int:
        """An O_PATH fd of a file mount point at `path`, created (empty) if missing."""
        e = self.ensure_entry(path, "file", mode)
        os.close(e.parent_fd)
        return e.fd

    def ensure_dir(self, path: str, mode: int = 0o755) -> int:
        """An O_PATH fd of a directory at `path`, created (with missing parents) if missing."""
        e = self.ensure_entry(path, "dir", mode)
        os.close(e.parent_fd)
        return e.fd

    def _create(self, parent: int, name: str, kind: str, mode: int, path: str) -> bool:
        fd = None
        try:
            if kind == "dir":
                os.mkdir(name, mode, dir_fd=parent)
            else:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                             dir_fd=parent)
        except FileExistsError:
            return False
        except OSError as e:
            raise _err(path, self.path, e, "cannot create mount point ") from None
        try:
            self._record(parent, name, kind, path)  # first: whatever fails next, rollback removes it
        finally:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError as e:
                    raise _err(path, self.path, e, "cannot create mount point ") from None
        return True

    def _check_type(self, st: os.stat_result, kind: str, path: str) -> None:
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
                old = os.readlink(name, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise RootPathError(f"{path} (in {self.path}): exists and is not a symlink", errno.EEXIST) from None
                raise _err(path, self.path, e) from None
            if old == target:
                return False
            if old is None:
                try:
                    os.symlink(target, name, dir_fd=parent)
                except OSError as e:
                    raise _err(path, self.path, e, "cannot create symlink ") from None
                self._record(parent, name, "symlink", path)
                return True
            # replace atomically: the image's link stays in place until the new one is complete
            try:
                tmp = _temp_symlink(parent, name, target)
            except OSError as e:
                raise _err(path, self.path, e, "cannot create symlink ") from None
            recorded = len(self.created)
            try:
                self._record(parent, name, "symlink", path, old, at=tmp)
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except BaseException as e:
                try:
                    os.unlink(tmp, dir_fd=parent)
                except OSError:
                    pass
                while len(self.created) > recorded:  # nothing of ours is at `name`: forget it
                    os.close(self.created.pop().parent_fd)
                if isinstance(e, OSError):
                    raise _err(path, self.path, e, "cannot replace symlink ") from None
                raise
            return True
        finally:
            os.close(parent)

    def rollback(self) -> list[str]:
        """Remove what this RootFS created, newest first; return one line per thing it could not undo.

        Each entry is removed only if the same inode is still there, so a file
        someone else put in its place is left alone.
        """
        problems = []
        while self.created:
            c = self.created.pop()
            try:
                st = os.stat(c.name, dir_fd=c.parent_fd, follow_symlinks=False)
                if (st.st_dev, st.st_ino) == (c.dev, c.ino):
                    if c.kind == "dir":
                        os.rmdir(c.name, dir_fd=c.parent_fd)
                    elif c.old_target is not None:  # put the image's link back in one rename
                        tmp = _temp_symlink(c.parent_fd, c.name, c.old_target)
                        try:
                            os.replace(tmp, c.name, src_dir_fd=c.parent_fd, dst_dir_fd=c.parent_fd)
                        except OSError:
                            os.unlink(tmp, dir_fd=c.parent_fd)
                            raise
                    else:
                        os.unlink(c.name, dir_fd=c.parent_fd)
            except OSError as e:
                problems.append(f"cannot remove {c.name} created in {self.path}: {e.strerror}")
            finally:
                os.close(c.parent_fd)
        return problems
