"""The image's loader configuration files, reached as the confined ldconfig reaches them, within a budget.

Why its own module: `ldconf` says what an ld.so.conf tree *means* (glibc's
`parse_conf` and its includes, elf/ldconfig.c); this is the one place that
touches the image to get the bytes, and the image is hostile.  glibc's
ldconfig reads with `fopen` (elf/ldconfig.c parse_conf) and lists include
directories with glob(3), which lstat's the last component
(posix/glob.c): a FIFO blocks it, a device node runs its driver's open()
as root, `/dev/zero` never ends, and nothing bounds the work.  `Tree` reads
the same files without any of that:

* every path is resolved by `RootFS.locate`'s fd walk, so a symlink in an
  image never leads out of it and `..` at the root stays there (as in the
  kernel); a name is handed on under its resolved directory;
* the root's `/proc` and `/sys` are absent (`rootfs.HIDDEN`, the rule every
  reader of the image's facts follows), as in the confined ldconfig's view
  (apply/confined.py masks them with empty tmpfs): no lookup reaches
  `/proc/kmsg` and no listing walks `/sys`;
* a file's type is taken from the O_PATH fd the walk opened, and only a
  regular file is opened for reading, as that same inode: a FIFO never
  blocks and a device's driver never sees an open();
* the work is bounded: CONF_LIMIT bytes in all, MAX_ENTRIES paths and
  directory entries looked at, MAX_SECONDS of wall clock.

Whatever stops a read raises `Stop` with one of the kinds below (what
`ldconf.LdSoConf.stop` reports); the kinds in `UNSAFE` are the ones where
glibc's ldconfig must not run either.
"""

from __future__ import annotations

import errno
import posix
import stat
import time

from pyxis_hook.rootfs import HIDDEN, RootFS, RootPathError, read_to_end

#: the configuration files' bytes, all together (Debian's whole tree is < 1 KiB)
CONF_LIMIT = 1 << 20
#: paths resolved plus directory entries listed by include patterns, all together
MAX_ENTRIES = 10000
#: wall-clock bound of one read (a slow or hostile filesystem under the rootfs)
MAX_SECONDS = 5.0
#: directories a read keeps open to look up entries in them (`Tree.held`); more are walked to again
MAX_HELD = 16
#: what one read(2) of a configuration file asks for after the first (which asks for its size)
_CHUNK = 1 << 16

#: why a read stopped (`ldconf.LdSoConf.stop`; "" when it did not)
NOT_REGULAR = "not-regular"  # a FIFO or socket: ldconfig's fopen blocks (FIFO) or fails
DEVICE = "device"  # a character or block device: ldconfig's open() would run its driver as root
LOOP = "include-loop"  # a file includes itself: ldconfig recurses until it runs out of fds or CPU
LIMIT = "limit"  # more than one of the limits allows (these, and ldconf's on includes)
UNREADABLE = "unreadable"  # a symlink loop, a name too long, an error: ldconfig warns and skips it
UNMODELLED = "unmodelled"  # a `[...]` pattern in apply's child: read on with a wider match, not stopped
#: the kinds after which glibc's ldconfig must not run on the image either
UNSAFE = frozenset((NOT_REGULAR, DEVICE, LOOP, LIMIT))


class Stop(Exception):
    """The read ends here: `kind` is one of the constants above, `reason` one line naming the file."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


class Tree:
    """The root as the confined ldconfig sees it, read through one RootFS, within the read's budget.

    The directories `dir_path` found stay open (O_PATH, up to MAX_HELD, in
    `held` by resolved name until `close`): listing one, looking up an entry
    in it or opening a configuration file in it then starts from that fd
    instead of walking the path from the root again (`include
    /etc/ld.so.conf.d/*.conf` would otherwise resolve `/etc` four times).
    """

    def __init__(self, rfs: RootFS) -> None:
        self.rfs = rfs
        self.steps = 0
        self.bytes = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        self.held: dict[str, int] = {}

    def close(self) -> None:
        for fd in self.held.values():
            posix.close(fd)
        self.held.clear()

    def _dir_fd(self, base: str) -> tuple[int, bool] | None:
        """(O_PATH fd of the resolved directory `base`, whether the caller closes it); None when unreachable."""
        fd = self.held.get(base)
        if fd is not None:
            return fd, False
        found = self.locate(base, strict=False)
        return None if found is None else (found[0], True)

    def tick(self) -> None:
        """Count one path resolved or directory entry looked at; LIMIT past the budget or the deadline."""
        self.steps += 1
        if self.steps > MAX_ENTRIES:
            raise Stop(LIMIT, f"include patterns in {self.rfs.path} look at more than {MAX_ENTRIES} paths "
                               "and directory entries")
        if time.monotonic() > self.deadline:
            raise Stop(LIMIT, f"reading the loader configuration in {self.rfs.path} took more than "
                               f"{MAX_SECONDS:g} s")

    def locate(self, path: str, *, strict: bool) -> tuple[int, str] | None:
        """(O_PATH fd, resolved path), None where ldconfig finds nothing (missing, under /proc or /sys).

        Any other error is a stop when `strict` (a file ldconfig would fail
        to open), no match otherwise (glob ignores what it cannot read).
        """
        self.tick()
        try:
            return self.rfs.locate(path, hidden=HIDDEN)
        except RootPathError as e:
            if strict and e.errno not in (errno.ENOENT, errno.ENOTDIR):
                raise Stop(UNREADABLE, str(e)) from None
            return None

    def read(self, path: str, via: str) -> tuple[tuple[int, int], bytes] | None:
        """((st_dev, st_ino), bytes) of the configuration file `path`; None when missing or a directory.

        The type is taken from the fd the walk opened (O_PATH), and only a
        regular file is opened for reading, as that same inode: a FIFO never
        blocks and a device's driver never sees an open().
        """
        found = self._in_held(path)
        if found is None:
            found = self.locate(path, strict=True)
            if found is None:
                return None
        fd = found[0]
        try:
            st = posix.fstat(fd)
            if stat.S_ISDIR(st.st_mode):
                return None
            if not stat.S_ISREG(st.st_mode):
                kind = DEVICE if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else NOT_REGULAR
                raise Stop(kind, f"{path} (in {self.rfs.path}){via}: {_file_type(st.st_mode)}, "
                                  "not a configuration file")
            left = CONF_LIMIT - self.bytes
            if st.st_size > left:
                raise Stop(LIMIT, f"{path} (in {self.rfs.path}){via}: the configuration files are larger "
                                   f"than {CONF_LIMIT} bytes in all")
            try:
                # reads sized by the file (+1 to see it grew), not by the whole budget: a 1 MiB request is a
                # 1 MiB buffer (mmap, munmap)
                data = read_to_end(self.rfs.reopen(fd, posix.O_RDONLY | posix.O_NONBLOCK | posix.O_NOCTTY), left,
                                   min(max(st.st_size + 1, 4096), _CHUNK))
            except OSError as e:
                if e.errno == errno.EFBIG:
                    raise Stop(LIMIT, f"{path} (in {self.rfs.path}){via}: the configuration files are larger "
                                       f"than {CONF_LIMIT} bytes in all") from None
                raise Stop(UNREADABLE, f"{path} (in {self.rfs.path}){via}: {e.strerror}") from None
            self.bytes += len(data)
            return (st.st_dev, st.st_ino), data
        finally:
            posix.close(fd)

    def _in_held(self, path: str) -> tuple[int, str] | None:
        """`locate(path)` for a plain entry of a held directory: one open, no walk; None: walk instead.

        Only a name that is neither a symlink (opened O_NOFOLLOW, its type
        read from the fd) nor `.`/`..` nor a masked top-level directory is
        taken this way; the walk handles everything else.
        """
        base, _, name = path.rpartition("/")
        fd = self.held.get(base or "/")
        if fd is None or name in ("", ".", "..") or (not base and name in HIDDEN):
            return None
        self.tick()
        try:
            own = posix.open(name, posix.O_PATH | posix.O_NOFOLLOW | posix.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return None  # the walk says what ldconfig would make of it
        try:
            link = stat.S_ISLNK(posix.fstat(own).st_mode)
        except OSError:
            link = True  # the walk says what ldconfig would make of it
        if link:
            posix.close(own)
            return None
        return own, path

    def dir_path(self, path: str) -> str | None:
        """The resolved name of directory `path`, None when it is not one ldconfig can reach.

        The directory stays open in `held` (while there is room) for what is looked up in it next.
        """
        found = self.locate(path, strict=False)
        if found is None:
            return None
        fd, real = found
        if not stat.S_ISDIR(posix.fstat(fd).st_mode):
            posix.close(fd)
            return None
        if real in self.held or len(self.held) >= MAX_HELD:
            posix.close(fd)
        else:
            self.held[real] = fd
        return real

    def lexists(self, base: str, name: str) -> bool:
        """Whether directory `base` (resolved) has an entry `name`, a dangling link too (glob's lstat)."""
        if base == "/" and name in HIDDEN:
            return False
        found = self._dir_fd(base)
        if found is None:
            return False
        fd, own = found
        try:
            posix.stat(name, dir_fd=fd, follow_symlinks=False)
            return True
        except OSError:
            return False
        finally:
            if own:
                posix.close(fd)

    def entries(self, base: str) -> list[str]:
        """Names in directory `base` (resolved), as readdir gives them; each one counts (`tick`).

        `/proc` and `/sys` are left out of the root's; what glob(3) makes of
        the names (the pattern, the leading dot) is `ldconf`'s.  A directory
        that cannot be listed has no names, as in glob.
        """
        found = self._dir_fd(base)
        if found is None:
            return []
        fd, own = found
        out = []
        try:
            dfd = posix.open(".", posix.O_RDONLY | posix.O_DIRECTORY | posix.O_CLOEXEC, dir_fd=fd)
        except OSError:
            return []
        finally:
            if own:
                posix.close(fd)
        try:
            with posix.scandir(dfd) as entries:
                for entry in entries:
                    self.tick()
                    name = entry.name
                    if base == "/" and name in HIDDEN:
                        continue
                    out.append(name)
        except OSError:
            return []
        finally:
            posix.close(dfd)
        return out


def _file_type(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "not a regular file"
