"""cabi.py: ctypes' own classes built from _ctypes behave as ctypes' (sizes, values, errno)."""

from __future__ import annotations

import ctypes
import errno
import os
import subprocess
import sys

import pytest

from pyxis_hook import cabi


@pytest.mark.parametrize("name", ["c_int", "c_uint", "c_long", "c_ulong", "c_uint32", "c_uint64", "c_char_p",
                                  "c_void_p", "c_size_t", "c_short"])
def test_each_type_has_ctypes_size_and_value(name):
    ours = getattr(cabi, name) if hasattr(cabi, name) else cabi.made(name)
    theirs = getattr(ctypes, name)
    assert cabi.sizeof(ours) == ctypes.sizeof(theirs)
    sample = b"x" if name == "c_char_p" else 7
    assert ours(sample).value == theirs(sample).value


def test_a_libc_function_returns_its_value_and_keeps_errno():
    getpid = cabi.libc_function("getpid", cabi.c_int)
    assert getpid() == os.getpid()
    close = cabi.libc_function("close", cabi.c_int)
    cabi.set_errno(0)
    assert close(cabi.c_int(-1)) == -1
    assert cabi.get_errno() == errno.EBADF


def test_functions_share_one_class_and_keep_each_its_return_type():
    """As ctypes.CDLL's: one function-pointer class, a `restype` per function (a long is not cut to an int)."""
    labs = cabi.libc_function("labs", cabi.c_long)
    iabs = cabi.libc_function("abs", cabi.c_int)
    assert type(labs) is type(iabs)
    assert labs(cabi.c_long(-(1 << 40))) == 1 << 40
    assert iabs(cabi.c_int(-5)) == 5


def test_structures_pass_by_reference():
    class Pair(cabi.Structure):
        _fields_ = [("a", cabi.c_uint64), ("b", cabi.c_uint64)]

    p = Pair(1, 2)
    memcpy = cabi.libc_function("memcpy", cabi.made("c_void_p"))
    q = Pair(0, 0)
    memcpy(cabi.byref(q), cabi.byref(p), cabi.c_size_t(cabi.sizeof(p)))
    assert (q.a, q.b) == (1, 2)


def test_kernel_does_not_import_ctypes():
    code = "import sys, pyxis_hook.kernel.lookup, pyxis_hook.kernel.mountapi, pyxis_hook.kernel.namespaces; print('ctypes' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "False"


def test_the_rare_types_are_made_once_when_first_asked_for():
    """Importing the syscall modules (every GPU start does) makes none; each is made once, then the same class."""
    code = ("from pyxis_hook import cabi\nfrom pyxis_hook.kernel import lookup, mountapi, namespaces, process\n"
            "before = sorted(cabi._MADE)\n"
            "caps = process.capget()\n"
            "again = process.capget()\n"
            "short = cabi.made('c_short')\n"
            "print(before, sorted(cabi._MADE), caps == again, short is cabi.made('c_short'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] ['_CapData', '_CapHeader', 'c_short'] True True"
