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
import posix
import stat

from pyxis_hook import pathnames
from pyxis_hook.errors import PathError
from pyxis_hook.kernel import lookup

MAX_SYMLINKS = 40
#: top-level directories of an image that do not exist for what reads the image's facts: the confined
#: ldconfig masks them (apply/confined.py), and a path that reaches one, however it gets there, is missing
HIDDEN = ("proc", "sys")
#: how often a component that changes type under us (dir <-> symlink) is re-examined before giving up
RACE_RETRIES = 8


def resolve_in_root(root: str, path: str, *, follow_last: bool = True) -> str:
    """Return the host path that `path` names when `root` is '/'.

    Missing components are kept as they are (callers decide whether a missing
    file is an error); so is a link whose text cannot be read (`self` of a
    procfs of another PID namespace), which the kernel cannot follow either.
    The result always starts with `root` (normalised).  Raises RootPathError
    on a symlink loop, on an error that is not 'missing', and when a component
    keeps changing between a link and something else while it is looked at
    (RACE_RETRIES times); a component that changes once is taken as it is then.
    """
    root = pathnames.normpath(pathnames.abspath(root))
    if root == "/":
        prefix = ""
    else:
        prefix = root
    todo = [c for c in path.split("/") if c not in ("", ".")]
    todo.reverse()
    done: list[str] = []
    links = changes = 0
    while todo:
        comp = todo.pop()
        if comp == "..":
            if done:
                done.pop()
            continue
        candidate = prefix + "/" + "/".join(done + [comp])
        is_last = not todo
        try:
            st = posix.lstat(candidate)
        except OSError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                done.append(comp)
                continue
            raise RootPathError(f"{candidate}: {e.strerror}", e.errno or 0) from None
        if stat.S_ISLNK(st.st_mode) and (follow_last or not is_last):
            try:
                target = posix.readlink(candidate)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR):  # gone, or a link nobody can follow: missing
                    done.append(comp)
                    continue
                if e.errno != errno.EINVAL:
                    raise RootPathError(f"{candidate}: {e.strerror}", e.errno or 0) from None
                changes += 1  # no longer a link: look at it again
                if changes > RACE_RETRIES:
                    raise path_error(path, root, errno.ELOOP, "changed while resolving: ") from None
                todo.append(comp)
                continue
            links += 1
            if links > MAX_SYMLINKS:
                raise RootPathError(f"{path}: too many levels of symbolic links inside {root}", errno.ELOOP)
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
    root = pathnames.normpath(pathnames.abspath(root))
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


def open_regular_path(path: str) -> int:
    """An O_RDONLY fd of the regular file at host path `path` (links followed); OSError for anything else.

    For the paths a user or an image puts in front of a diagnostic command
    (`ldcache --cache`, `ldd`, ldcheck on an image, pyxis.conf): the file is
    opened O_PATH and fstat'ed first, so a FIFO never blocks, a device's
    driver never sees an open(), and a directory is EISDIR; only then is the
    same inode opened for reading, through /proc/self/fd.
    """
    pfd = posix.open(path, posix.O_PATH | posix.O_CLOEXEC)
    try:
        mode = posix.fstat(pfd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return posix.open(f"/proc/self/fd/{pfd}", posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY | posix.O_CLOEXEC)
    finally:
        posix.close(pfd)


def read_regular_path(path: str, limit: int) -> bytes:
    """The bytes of the regular file at host path `path` (see `open_regular_path`), at most `limit`."""
    return _read_capped(open_regular_path(path), limit)


def _read_capped(fd: int, limit: int) -> bytes:
    """All of open file `fd` (closed here), or OSError(EFBIG) past `limit` bytes: the cap bounds memory.

    A file whose size already says so is refused before anything is read.
    """
    try:
        too_big = posix.fstat(fd).st_size > limit
    except BaseException:
        posix.close(fd)
        raise
    if too_big:
        posix.close(fd)
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return read_to_end(fd, limit)


#: a host procfs file larger than this is not read (a mountinfo of ~300,000 mounts): memory stays bounded
PROC_LIMIT = 64 << 20


def read_to_end(fd: int, limit: int, chunk: int = 1 << 16) -> bytes:
    """What open file `fd` (closed here) reads to its end, with `posix` calls; OSError(EFBIG) past `limit` bytes.

    `chunk`: the most one read asks for (a file read whole in one read is
    not copied again to be joined).

    Read to the end, not by its size: procfs and cgroupfs files say 0 and
    hand out a page or so per read.  No io stack (three objects a file), so
    the per-GPU and per-start reads of a container start cost one open, the
    reads and one close.
    """
    try:
        chunks, left = [], limit + 1  # one byte more tells a file that grew past the cap
        while left > 0 and (got := posix.read(fd, chunk if chunk < left else left)):
            chunks.append(got)
            left -= len(got)
    finally:
        posix.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"larger than {limit} bytes")
    return data


class RootPathError(PathError):
    """A PathError that keeps the errno, so callers can tell 'missing' from 'refused'."""

    def __init__(self, message: str, err: int = 0):
        super().__init__(message)
        self.errno = err


def path_error(path: str, root: str, e: OSError | int, what: str = "") -> RootPathError:
    err = e if isinstance(e, int) else (e.errno or 0)
    text = posix.strerror(err)
    if err == errno.ELOOP:
        text = "too many levels of symbolic links, or a symlink where none is allowed"
    if err == errno.EXDEV:
        text = "crosses a magic link or leaves the root"
    return RootPathError(f"{what}{path} (in {root}): {text}", err)


class RootFS:
    """A container rootfs opened once; every path is resolved relative to that fd, never by name.

    Semantics are chroot's (openat2 RESOLVE_IN_ROOT): absolute symlinks restart
    at the root, `..` at the root stays there, magic links (/proc/self/root)
    are refused.  With openat2 (kernel >= 5.6) the kernel does the walk; the
    fallback walks one component at a time with O_PATH|O_NOFOLLOW fds and
    readlinkat, splicing link text itself, so no kernel-level link is ever
    followed.  With `hidden` (HIDDEN: what reads the image's facts), those
    top-level directories are missing however a path reaches them, and every
    lookup is the walk.  This class only reads; creation (mount points, links, their
    rollback) is `apply.rootwrite.WritableRoot`, the writing half.
    """

    def __init__(self, path: str, *, fd: int | None = None, owner: tuple[int, int] | None = None,
                 use_openat2: bool | None = None, hidden: tuple[str, ...] = ()):
        """Open `path`; or, with `fd`, work on a copy of that directory fd and use `path` only as its name.

        `fd` is how a rootfs pinned elsewhere (`rootpin`) is used without
        resolving its name again: whatever `path` names by now, only the fd counts.
        `hidden`: the top-level directories every lookup treats as missing (HIDDEN or none).
        """
        self.path = pathnames.normpath(pathnames.abspath(path))
        try:
            self.fd = posix.open(self.path, posix.O_PATH | posix.O_DIRECTORY | posix.O_CLOEXEC) if fd is None else posix.dup(fd)
        except OSError as e:
            raise RootPathError(f"container rootfs {self.path}: {e.strerror}", e.errno or 0) from None
        self.owner = owner  # who gets what is created inside (WritableRoot, the cache file)
        self.hidden = hidden
        # openat2 cannot be told to leave a directory out: a RootFS that hides some walks
        self.use_openat2 = not hidden and (lookup.have_openat2() if use_openat2 is None else use_openat2)

    # -- lifetime -------------------------------------------------------
    def close(self) -> None:
        if self.fd >= 0:
            posix.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "RootFS":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def readonly(self) -> bool:
        """True when the filesystem holding the rootfs is mounted read-only."""
        return bool(posix.fstatvfs(self.fd).f_flag & posix.ST_RDONLY)

    # -- resolution -----------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0) -> int:
        """Open `path` inside the root (IN_ROOT semantics); the caller closes the fd.

        Whatever stops it is a RootPathError with the errno: ENOENT or ENOTDIR for a
        missing path (a hidden directory, a link that cannot be followed), ELOOP for a
        loop or for a component that keeps changing type while it is looked at.
        """
        if self.use_openat2:
            try:
                return lookup.openat2(self.fd, path, flags, mode,
                                      lookup.RESOLVE_IN_ROOT | lookup.RESOLVE_NO_MAGICLINKS)
            except lookup.SyscallError as e:
                if e.errno != errno.EAGAIN:
                    raise path_error(path, self.path, e.errno) from None
                # the kernel kept asking to retry (mounts or renames elsewhere racing each `..` step,
                # lookup.OPENAT2_TRIES times): the walk below takes `..` itself, one fd at a time, with
                # the same chroot semantics, so a busy host costs a slower lookup, never a failed start
        return self._open_walked(path, flags, mode, [], self.hidden)

    def _open_walked(self, path: str, flags: int, mode: int, names: list[str], hidden: tuple[str, ...]) -> int:
        """`open` by the component walk; `names` receives the resolved components (no link, no `..`)."""
        follow = not flags & posix.O_NOFOLLOW
        for _ in range(RACE_RETRIES):
            names.clear()
            parent, name = self._walk(path, follow_last=follow, create_mode=None, names=names, hidden=hidden)
            try:
                fd = posix.open(name or ".", flags | posix.O_NOFOLLOW | posix.O_CLOEXEC, mode, dir_fd=parent)
            except OSError as e:
                # O_NOFOLLOW met a link the walk did not see (ELOOP; ENOTDIR with O_DIRECTORY): walk again
                if follow and name and e.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(parent, name):
                    continue
                raise path_error(path, self.path, e) from None
            finally:
                posix.close(parent)
            st_mode = posix.fstat(fd).st_mode
            if follow and stat.S_ISLNK(st_mode):
                posix.close(fd)  # became a symlink between the walk and the open: walk again
                continue
            if hidden and not names and name in hidden and stat.S_ISDIR(st_mode):
                posix.close(fd)
                raise path_error(path, self.path, errno.ENOENT)
            if name:
                names.append(name)
            return fd
        raise path_error(path, self.path, errno.ELOOP, "changed while resolving: ")

    def exists(self, path: str) -> bool:
        try:
            posix.close(self.open(path, posix.O_PATH))
            return True
        except RootPathError as e:
            if e.errno in (errno.ENOENT, errno.ENOTDIR):
                return False
            raise

    @staticmethod
    def reopen(fd: int, flags: int) -> int:
        """The inode an O_PATH fd of this root holds, opened with `flags`: through the magic link of the
        hook's own procfs, also inside a container's mount namespace whose /proc is the container's."""
        return lookup.reopen(fd, flags)

    def open_regular(self, path: str) -> int:
        """An O_RDONLY fd of the regular file at `path`; anything else is a RootPathError.

        The image chooses what the name is, so it is opened O_PATH first and
        only a regular file is opened for reading, as the same inode through
        /proc/self/fd: a device node placed under a library's or a config
        file's name (a watchdog, a tape) never has its driver's open() run by
        root, and a FIFO never blocks.  Directories are EISDIR, so callers
        can treat one as ldconfig does.
        """
        pfd = self.open(path, posix.O_PATH)
        try:
            mode = posix.fstat(pfd).st_mode
            if stat.S_ISDIR(mode):
                raise RootPathError(f"{path} (in {self.path}): is a directory", errno.EISDIR)
            if not stat.S_ISREG(mode):
                raise RootPathError(f"{path} (in {self.path}): not a regular file", errno.EINVAL)
            try:
                return self.reopen(pfd, posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY)
            except OSError as e:
                raise path_error(path, self.path, e, "cannot open ") from None
        finally:
            posix.close(pfd)

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
            raise path_error(path, self.path, e, "cannot read ") from None

    def read_text(self, path: str, limit: int = 65536) -> str:
        """Read a small regular text file of the image; FIFOs, devices and huge files are refused."""
        return self.read_bytes(path, limit).decode("utf-8", "replace")

    def locate(self, path: str, *, hidden: tuple[str, ...] | None = None) -> tuple[int, str]:
        """(O_PATH fd of what `path` names, the path it resolves to: no symlink, no `..`).

        Always the component walk, openat2 or not: a caller that needs the
        resolved name gets it from the very fds it opened (relative includes
        of ld.so.conf), and a top-level directory named in `hidden` (this
        root's own by default; HIDDEN: /proc, /sys) is missing however the
        path reaches it, as in a view where they are masked.  A missing path
        is a RootPathError with ENOENT or ENOTDIR (see `open`).
        """
        names: list[str] = []
        fd = self._open_walked(path, posix.O_PATH, 0, names, self.hidden if hidden is None else hidden)
        return fd, "/" + "/".join(names)
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
                        posix.close(stack.pop())
                        resolved.pop()
                    continue
                cur = stack[-1] if stack else self.fd
                is_last = not todo
                for _ in range(RACE_RETRIES):
                    try:
                        target = posix.readlink(comp, dir_fd=cur)
                    except OSError as e:
                        if e.errno == errno.EINVAL:
                            target = None
                        elif e.errno == errno.ENOENT:
                            target = None
                            if (follow_last or not is_last) and _is_link(cur, comp):
                                # a link whose text nobody can read (`self` of a procfs of another
                                # PID namespace): the kernel cannot follow it either
                                raise path_error(path, self.path, e) from None
                            if not is_last:
                                if create_mode is None:
                                    raise path_error(path, self.path, e) from None
                                if not self._mkdir(cur, comp, create_mode, path):
                                    continue
                        else:
                            raise path_error(path, self.path, e) from None
                    if target is not None:
                        if is_last and not follow_last:
                            return self._own(stack, cur), comp
                        links += 1
                        if links > MAX_SYMLINKS:
                            raise path_error(path, self.path, errno.ELOOP)
                        if target.startswith("/"):
                            while stack:
                                posix.close(stack.pop())
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
                        raise path_error(path, self.path, errno.ENOENT)
                    break
                else:
                    raise path_error(path, self.path, errno.ELOOP, "changed while resolving: ")
            cur = stack[-1] if stack else self.fd
            return self._own(stack, cur), None
        finally:
            for fd in stack:
                posix.close(fd)

    def _mkdir(self, parent: int, name: str, mode: int, path: str) -> bool:
        """A reading RootFS creates nothing: `apply.rootwrite.WritableRoot` does."""
        raise path_error(path, self.path, errno.EROFS, "cannot create directory for ")

    @staticmethod
    def _own(stack: list[int], cur: int) -> int:
        """Hand the caller an fd of `cur` that survives the walk's cleanup."""
        return posix.dup(cur)

    def _open_dir(self, cur: int, comp: str, path: str) -> int | None:
        try:
            fd = posix.open(comp, posix.O_PATH | posix.O_NOFOLLOW | posix.O_DIRECTORY | posix.O_CLOEXEC, dir_fd=cur)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP, errno.ENOENT):
                try:
                    st = posix.stat(comp, dir_fd=cur, follow_symlinks=False)
                except OSError:
                    return None
                if stat.S_ISLNK(st.st_mode) or stat.S_ISDIR(st.st_mode):
                    return None  # changed type (and maybe back) since the open: look again
                raise path_error(path, self.path, errno.ENOTDIR) from None
            raise path_error(path, self.path, e) from None
        if not stat.S_ISDIR(posix.fstat(fd).st_mode):
            posix.close(fd)
            return None
        return fd


def _is_link(dir_fd: int, name: str) -> bool:
    """Whether `name` in `dir_fd` is a symlink now (False when it cannot be looked at)."""
    try:
        return stat.S_ISLNK(posix.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
