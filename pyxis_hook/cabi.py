"""The C types and libc calls the syscall wrappers (`pyxis_hook.kernel`) and `sysrecord` need, built from `_ctypes` directly.

A GPU start does not `import ctypes` (docs/decisions/2026-12-07-start-costs.md):
its `__init__` defines some 40 types and imports `struct`, `types` and
`ctypes._endian` for byte-swapped structures the hook never uses, and the
syscall wrappers need eight simple types, `Structure` and one kind of
function pointer.  These are the classes ctypes itself defines
(`ctypes/__init__.py`: each simple type is a `_SimpleCData` subclass naming
its struct code in `_type_`; `CDLL` makes its functions as `CFuncPtr`
subclasses with `FUNCFLAG_CDECL | FUNCFLAG_USE_ERRNO`), so they behave
identically, `get_errno` included.
"""

from _ctypes import (  # noqa: F401 - re-exported: the wrappers' vocabulary
    FUNCFLAG_CDECL,
    FUNCFLAG_USE_ERRNO,
    CFuncPtr,
    Structure,
    _SimpleCData,
    byref,
    dlopen,
    get_errno,
    resize,
    set_errno,
    sizeof,
)


def _simple(name: str, code: str) -> type:
    """A simple C type, as ctypes defines it: a `_SimpleCData` subclass with its struct code."""
    return type(name, (_SimpleCData,), {"_type_": code})


# each ctypes type made is a cost of the start (docs/decisions/2026-12-07-start-costs.md):
# the types every GPU start passes are made here, the few only a rare path needs by `made`
# (the ldconfig runner's poll, capget/capset)
c_int = _simple("c_int", "i")
c_uint = _simple("c_uint", "I")
c_long = _simple("c_long", "l")
c_ulong = _simple("c_ulong", "L")
c_char_p = _simple("c_char_p", "z")  # also the NULL of any pointer argument: c_char_p(None)
# LP64, every architecture the hook supports (syscall.ARCH_NR): the aliases ctypes itself makes
# there (its `for kind in [c_ushort, c_uint, c_ulong, c_ulonglong]` by size), one class less each
c_uint32 = c_uint
c_uint64 = c_ulong
c_size_t = c_ulong

#: the types `made` has made, by name: each once per process
_MADE: dict[str, type] = {}

#: what `made` knows how to make: a simple type's struct code
_SIMPLE_CODES = {"c_short": "h", "c_void_p": "P"}


def made(name: str, fields: "list | None" = None) -> type:
    """The C type `name`, made on first use: a simple type (`c_short`, `c_void_p`) or a Structure of `fields`.

    Making one imports nothing, so a path that runs in the container's
    namespace (the ldconfig runner, the confined child) may ask for it there.
    """
    kind = _MADE.get(name)
    if kind is None:
        if fields is None:
            kind = _simple(name, _SIMPLE_CODES[name])
        else:
            kind = type(name, (Structure,), {"_fields_": fields})
        _MADE[name] = kind
    return kind


class _Handle:
    """What CFuncPtr reads a library from (a `ctypes.CDLL` is such an object: its `_handle`)."""

    def __init__(self, handle: int):
        self._handle = handle


#: the process's own symbols (dlopen(NULL): the interpreter and the libc it links), as
#: `ctypes.CDLL(None)` opens them on Linux (mode 0; `_ctypes.dlopen` adds RTLD_NOW)
_LIBC = _Handle(dlopen(None, 0))


class _LibcFunction(CFuncPtr):
    """The one function-pointer class, as a `ctypes.CDLL` makes one `_FuncPtr` class per library.

    Each function is an instance with its own `restype`, as CDLL's are: a
    class per function would cost a ctypes type's creation each
    (docs/decisions/2026-12-07-start-costs.md).
    """

    _flags_ = FUNCFLAG_CDECL | FUNCFLAG_USE_ERRNO
    _restype_ = c_int


def libc_function(name: str, restype: type):
    """A libc function returning `restype` that keeps errno for `get_errno` (ctypes' `use_errno=True`)."""
    fn = _LibcFunction((name, _LIBC))  # type: ignore[arg-type]  # CFuncPtr reads only `_handle`
    fn.restype = restype
    return fn
