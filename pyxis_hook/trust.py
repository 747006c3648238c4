"""The hook's cache files (the node artifact, the start image): the rule for trusting one, and writing one.

A cache file is trusted when it, and the directory holding it, are owned by
the owner of the installed package's files as this process sees them, and
writable by nobody else (no group or other write bit).  The hook already
runs that owner's code, so trusting that owner's files asks for no more
(docs/security.md, "Files kept between starts").  Inside a user namespace
root's files and the package's show the same overflow owner, so the rule
holds there too: an ordinary user's start reads what root built.
"""

import posix

_owner: list[int] = []


def package_owner() -> int:
    """The uid that owns this package's directory, as this process sees it (stat'ed once)."""
    if not _owner:
        _owner.append(posix.stat(__file__.rpartition("/")[0] or "/").st_uid)
    return _owner[0]


def why_untrusted(st) -> str:
    """Why a file or directory with stat result `st` may not hold what the hook acts on ("" when it may)."""
    owner = package_owner()
    if st.st_uid != owner:
        return f"owned by uid {st.st_uid}, not by the package's owner (uid {owner})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {st.st_mode & 0o7777:04o})"
    return ""


def open_trusted(path: str) -> tuple[int, str]:
    """(a read-only fd of the cache file at `path`, "") when it and its directory pass the rule, else (-1, why not).

    The last component is not followed and must be a regular file; the
    caller closes the fd.
    """
    directory = path.rpartition("/")[0] or "/"
    try:
        why = why_untrusted(posix.stat(directory))
    except OSError as e:
        return -1, f"{directory}: {e.strerror}"
    if why:
        return -1, f"{directory}: {why}"
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK)
    except OSError as e:
        return -1, f"{path}: {e.strerror}"
    st = posix.fstat(fd)
    why = "not a regular file" if st.st_mode & 0o170000 != 0o100000 else why_untrusted(st)
    if why:
        posix.close(fd)
        return -1, f"{path}: {why}"
    return fd, ""


#: the uid the kernel shows for an unmapped owner in a user namespace (kernel.overflowuid's default)
OVERFLOW_UID = 65534


def may_write() -> bool:
    """Whether this process may write cache files: only as the package's owner (what others wrote, no start trusts).

    Never as the overflow uid: in a user namespace that maps neither root
    nor us, root's files and our own show as that uid, and it is nobody's.
    """
    return posix.geteuid() == package_owner() != OVERFLOW_UID


def write_whole(path: str, data: bytes, mode: int = 0o644) -> None:
    """Put `data` at `path` whole or not at all: a temp file beside it (this process's own name, made
    O_EXCL|O_NOFOLLOW), `mode` whatever the umask, fsync'ed, renamed over `path`.  Raises OSError; the
    temp file is gone then."""
    directory, _, name = path.rpartition("/")
    tmp = f"{directory}/.{name}.{posix.getpid()}.tmp"
    fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC, mode)
    try:
        try:
            posix.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
            posix.fsync(fd)
        finally:
            posix.close(fd)
        posix.rename(tmp, path)
    except BaseException:
        try:
            posix.unlink(tmp)
        except OSError:
            pass
        raise
