"""The container's /etc/ld.so.cache on disk: replaced whole through glibc's temp name, or left as it was.

Both ways the hook updates a container's cache write glibc's temp name
`/etc/ld.so.cache~` first and rename it over the cache (glibc's elf/cache.c
save_cache: temp name = cache name + "~").  A write that fails half-way (a
full disk or quota on the container's upper dir, EIO) must not leave that
file in the image:

* the merge (`write_cache`) removes its temp file on every failure path:
  the write, fchown, fchmod, close or rename;
* glibc's ldconfig exits on a failed write, chmod or rename without
  removing its temp file, so apply calls `remove_temp` after a failed
  confined run.  ldconfig writes the cache last (after its SONAME links), so
  a successful run leaves no temp file either: removing one after a failure
  leaves what a successful run would have left, minus the new cache.

Everything goes through the `/etc` directory fd opened inside the rootfs
(`RootFS.open`, chroot semantics): no name is resolved on the host, and a
symlink or directory at the temp name is never followed or removed.
"""

from __future__ import annotations

import errno
import posix
import stat

from pyxis_hook.errors import LdCacheError, PathError

CACHE = "/etc/ld.so.cache"
#: glibc's temp name for CACHE, in /etc (elf/cache.c: cache name + "~")
TEMP_NAME = "ld.so.cache~"


def write_cache(rfs, data: bytes) -> None:
    """Write `data` as the rootfs's /etc/ld.so.cache: to ld.so.cache~ in /etc's dir fd, then rename it.

    The temp file is created O_CREAT|O_EXCL|O_NOFOLLOW (a leftover of an
    interrupted run is removed first, as ldconfig truncates its own), owned
    by the rootfs owner, mode 0644.  On any failure after it exists it is
    removed again before the LdCacheError, so the image keeps its old cache
    and nothing else.
    """
    etc = rfs.open("/etc", posix.O_PATH | posix.O_DIRECTORY)
    try:
        check = getattr(rfs, "check_dir", None)  # a WritableRoot: is this /etc a host directory bound in?
        if check is not None:
            check(etc, CACHE)
        fd = _create_temp(etc)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[posix.write(fd, view):]
                if rfs.owner:
                    posix.fchown(fd, *rfs.owner)
                posix.fchmod(fd, 0o644)
            finally:
                posix.close(fd)
            posix.rename(TEMP_NAME, "ld.so.cache", src_dir_fd=etc, dst_dir_fd=etc)
        except OSError as e:
            left = _unlink_temp(etc)
            raise LdCacheError(f"{CACHE} (in {rfs.path}): cannot write: {e.strerror}"
                               + (f"; {left}" if left else "")) from None
        except BaseException:
            _unlink_temp(etc)
            raise
    except OSError as e:  # creating the temp file
        raise LdCacheError(f"{CACHE} (in {rfs.path}): cannot write: {e.strerror}") from None
    finally:
        posix.close(etc)


def _create_temp(etc: int) -> int:
    flags = posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC
    try:
        return posix.open(TEMP_NAME, flags, 0o644, dir_fd=etc)
    except FileExistsError:
        posix.unlink(TEMP_NAME, dir_fd=etc)  # a leftover of an interrupted run (ldconfig truncates it too)
    return posix.open(TEMP_NAME, flags, 0o644, dir_fd=etc)


def _unlink_temp(etc: int) -> str | None:
    """Remove the temp file in `etc` if it is a regular file; a line saying why not when that fails."""
    try:
        st = posix.stat(TEMP_NAME, dir_fd=etc, follow_symlinks=False)
        if stat.S_ISREG(st.st_mode):
            posix.unlink(TEMP_NAME, dir_fd=etc)
    except FileNotFoundError:
        pass
    except OSError as e:
        return f"cannot remove {CACHE}~: {e.strerror}"
    return None


def remove_temp(rfs) -> str | None:
    """After a failed cache update: remove /etc/ld.so.cache~ (a regular file only) from the rootfs.

    Never raises (it runs while another error is on its way to the user);
    returns a line for the log when the file could not be removed.
    """
    try:
        etc = rfs.open("/etc", posix.O_PATH | posix.O_DIRECTORY)
    except PathError as e:
        if getattr(e, "errno", 0) in (errno.ENOENT, errno.ENOTDIR):
            return None  # no /etc: no temp file either
        return f"cannot remove {CACHE}~: {e}"
    try:
        return _unlink_temp(etc)
    finally:
        posix.close(etc)
