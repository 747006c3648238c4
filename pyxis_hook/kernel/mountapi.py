"""The mount syscalls, old and new: mount/umount2, open_tree, move_mount, mount_setattr, fsopen/fsconfig/fsmount.

Each changes the mount table of the caller's mount namespace, so only
apply/ imports this module (setup.cfg's kernel contract).  Each raises
`syscall.SyscallError` naming the call and its target (`what` where given).
"""

from __future__ import annotations

import errno as _errno
import posix

from pyxis_hook import cabi
from pyxis_hook.kernel import syscall

# --- constants (linux/mount.h) ---
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

MNT_DETACH = 2
UMOUNT_NOFOLLOW = 8

AT_RECURSIVE = 0x8000  # open_tree/mount_setattr: the whole subtree of mounts

OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = posix.O_CLOEXEC

MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOVE_MOUNT_T_EMPTY_PATH = 0x40

MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_NOEXEC = 0x8

FSOPEN_CLOEXEC = 0x1
FSCONFIG_SET_STRING = 1
FSCONFIG_CMD_CREATE = 6
FSMOUNT_CLOEXEC = 0x1

#: Feature switch: None = not probed yet; tests set False to exercise the fallbacks.
HAVE_NEW_MOUNT_API: bool | None = None

_path = syscall.encode_path


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None,
          what: str = "") -> None:
    r = syscall.call("mount", cabi.c_char_p(_path(source)), cabi.c_char_p(_path(target)),
                     cabi.c_char_p(_path(fstype)), cabi.c_ulong(flags), cabi.c_char_p(_path(data)))
    if r != 0:
        raise syscall.syscall_error("mount", what or target)


def umount2(target: str, flags: int = MNT_DETACH, what: str = "") -> None:
    if syscall.call("umount2", cabi.c_char_p(_path(target)), cabi.c_int(flags)) != 0:
        raise syscall.syscall_error("umount", what or target)


def open_tree(dirfd: int, path: str, flags: int, what: str = "") -> int:
    r = syscall.call("open_tree", cabi.c_int(dirfd), syscall.path_arg(path), cabi.c_uint(flags))
    if r < 0:
        raise syscall.syscall_error("open_tree", what or path)
    return r


def move_mount(from_dirfd: int, from_path: str, to_dirfd: int, to_path: str, flags: int,
               what: str = "") -> None:
    r = syscall.call("move_mount", cabi.c_int(from_dirfd), syscall.path_arg(from_path),
                     cabi.c_int(to_dirfd), syscall.path_arg(to_path), cabi.c_uint(flags))
    if r != 0:
        raise syscall.syscall_error("move_mount", what or to_path)


class _MountAttr(cabi.Structure):
    _fields_ = [("attr_set", cabi.c_uint64), ("attr_clr", cabi.c_uint64),
                ("propagation", cabi.c_uint64), ("userns_fd", cabi.c_uint64)]


def mount_setattr(dirfd: int, path: str, flags: int, attr_set: int = 0, attr_clr: int = 0,
                  propagation: int = 0, what: str = "") -> None:
    attr = _MountAttr(attr_set, attr_clr, propagation, 0)
    r = syscall.call("mount_setattr", cabi.c_int(dirfd), syscall.path_arg(path), cabi.c_uint(flags),
                     cabi.byref(attr), cabi.c_size_t(cabi.sizeof(attr)))
    if r != 0:
        raise syscall.syscall_error("mount_setattr", what or path)


def fsopen(fstype: str) -> int:
    r = syscall.call("fsopen", cabi.c_char_p(_path(fstype)), cabi.c_uint(FSOPEN_CLOEXEC))
    if r < 0:
        raise syscall.syscall_error("fsopen", fstype)
    return r


def fsconfig_string(fsfd: int, key: str, value: str) -> None:
    r = syscall.call("fsconfig", cabi.c_int(fsfd), cabi.c_uint(FSCONFIG_SET_STRING),
                     cabi.c_char_p(_path(key)), cabi.c_char_p(_path(value)), cabi.c_int(0))
    if r != 0:
        raise syscall.syscall_error("fsconfig", f"{key}={value}")


def fsconfig_create(fsfd: int) -> None:
    r = syscall.call("fsconfig", cabi.c_int(fsfd), cabi.c_uint(FSCONFIG_CMD_CREATE),
                     cabi.c_char_p(None), cabi.c_char_p(None), cabi.c_int(0))
    if r != 0:
        raise syscall.syscall_error("fsconfig", "create")


def fsmount(fsfd: int, attr_flags: int) -> int:
    r = syscall.call("fsmount", cabi.c_int(fsfd), cabi.c_uint(FSMOUNT_CLOEXEC), cabi.c_uint(attr_flags))
    if r < 0:
        raise syscall.syscall_error("fsmount", "")
    return r


def have_new_mount_api() -> bool:
    """Probe open_tree/move_mount/mount_setattr (kernel >= 5.12 for mount_setattr)."""
    global HAVE_NEW_MOUNT_API
    if HAVE_NEW_MOUNT_API is None:
        ok = True
        for name, args in (("open_tree", (cabi.c_int(-1), cabi.c_char_p(b""), cabi.c_uint(0))),
                           ("mount_setattr", (cabi.c_int(-1), cabi.c_char_p(b""), cabi.c_uint(0),
                                              cabi.c_char_p(None), cabi.c_size_t(0)))):
            if syscall.call(name, *args) < 0 and cabi.get_errno() in (_errno.ENOSYS, _errno.EPERM):
                ok = False
        HAVE_NEW_MOUNT_API = ok
    return HAVE_NEW_MOUNT_API
