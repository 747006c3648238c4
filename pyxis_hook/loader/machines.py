"""The one per-machine table: what glibc, ldconfig and Debian's multiarch say about each CPU.

Discovery (which cache entries and ELF objects are the driver's), the merge
(the flags ldconfig writes), the container's library dirs and ldcheck (which
loader an image runs) all ask the same row, so a machine is added in one place.
Rows follow glibc 2.36: `sysdeps/unix/sysv/linux/*/ldconfig.h` (the loader
paths), `elf/readelflib.c` (the ABI byte ldconfig writes), `sysdeps/*/dl-cache.h`
(`_dl_cache_check_flags`, the flags a loader accepts: `cachelookup.LOADER_FLAGS`).
Imports nothing: it sits on the hook's path (plan.container).
"""

from __future__ import annotations

from pyxis_hook.record import record


@record
class Machine:
    """One `uname -m` machine and its 32-bit companion (fields ending in 32; None where it has none).

    `em`: ELF e_machine of its objects; `abi`: the ABI byte ldconfig ORs into a
    library's cache flags (readelflib.c, `FLAG_*_LIB64`: 0x0300 on x86-64);
    `triplet`: Debian's multiarch dir name; `loader`: glibc's ld.so path
    (the RTLD of an object without PT_INTERP); `cache_loader`: that loader's
    `cachelookup.LOADER_FLAGS` key.  `merge32`: whether the merge models what
    ldconfig writes for a 32-bit library here (i386: yes; armhf's flags
    depend on the float ABI in e_flags, which the merge does not read).
    """

    name: str
    em: int
    abi: int
    triplet: str
    loader: str
    cache_loader: str
    em32: int | None = None
    abi32: int | None = None
    triplet32: str | None = None
    loader32: str | None = None
    cache_loader32: str = "generic"
    merge32: bool = False


#: the machines NVIDIA ships a Linux driver for
MACHINES: dict[str, Machine] = {
    "x86_64": Machine("x86_64", em=62, abi=0x0300, triplet="x86_64-linux-gnu",
                      loader="/lib64/ld-linux-x86-64.so.2", cache_loader="x86_64",
                      em32=3, abi32=0x0000, triplet32="i386-linux-gnu", loader32="/lib/ld-linux.so.2",
                      cache_loader32="i386", merge32=True),
    "aarch64": Machine("aarch64", em=183, abi=0x0A00, triplet="aarch64-linux-gnu",
                       loader="/lib/ld-linux-aarch64.so.1", cache_loader="aarch64",
                       em32=40, abi32=0x0900, cache_loader32="armhf"),
    "ppc64le": Machine("ppc64le", em=21, abi=0x0500, triplet="powerpc64le-linux-gnu",
                       loader="/lib64/ld64.so.2", cache_loader="ppc64le"),
}

#: the ABI byte ldconfig writes for a 64-bit library of machines without a driver row (readelflib.c)
OTHER_ABI = {"s390x": 0x0400, "riscv64": 0x1000}


def machine(name: str) -> Machine | None:
    """The row of `name` (`os.uname().machine`), None for a machine NVIDIA ships no driver for."""
    return MACHINES.get(name)


def triplets(name: str) -> tuple[str, str | None]:
    """(multiarch triplet, 32-bit companion's or None) of `name`; `<name>-linux-gnu` for one without a row."""
    row = MACHINES.get(name)
    return (row.triplet, row.triplet32) if row is not None else (f"{name}-linux-gnu", None)


def lib_dirs(name: str, elfclass: int) -> tuple[str, ...]:
    """Debian's and RHEL's library dirs of a class on `name`, the multiarch ones first."""
    triplet, triplet32 = triplets(name)
    if elfclass == 64:
        return (f"/lib/{triplet}", f"/usr/lib/{triplet}", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
    return ((f"/lib/{triplet32}", f"/usr/lib/{triplet32}") if triplet32 else ()) + ("/lib", "/usr/lib")


def abi_byte(name: str) -> int:
    """The ABI byte ldconfig ORs into a 64-bit library's flags on `name` (0: none known)."""
    row = MACHINES.get(name)
    return row.abi if row is not None else OTHER_ABI.get(name, 0)
