"""The directories ld.so tries for a library name, and the strings they are made of (glibc's `elf/dl-load.c`).

These are the rules that depend on no file: dynamic string tokens expanded
as `_dl_dst_substitute` does, a search-path string split as glibc splits
LD_LIBRARY_PATH, RPATH/RUNPATH elements filled in as `fillin_rpath` does,
and the order of the search itself (`search_order`).  They are kept apart
from the resolver that opens the candidates (`resolve`) because the
explaining tools (`diag/ldmodel.py`) walk the same order with a test of
their own: one model of the order, two walkers.  What a root's loader
contributes ($LIB, $PLATFORM, the system dirs, hwcaps subdirs) is
`loaderenv`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

if TYPE_CHECKING:  # hints only: the rules read a LoaderEnv, they never build one
    from pyxis_hook.loader.loaderenv import LoaderEnv

_DST_RE = re.compile(r"\$(?:\{(ORIGIN|PLATFORM|LIB)\}|(ORIGIN|PLATFORM|LIB)(?![A-Za-z0-9_]))")


def expand_dst(text: str, origin: str | None, lib: str | None, platform: str | None) -> str | None:
    """Expand $ORIGIN/$LIB/$PLATFORM (and ${...}) as `_dl_dst_substitute` does.

    `$ORIGINAL` and unknown `$FOO` stay literal; a known token without a value
    makes the whole element unusable, which the caller drops (None).
    """
    values = {"ORIGIN": origin, "LIB": lib, "PLATFORM": platform}
    missing = False

    def sub(m: re.Match) -> str:
        nonlocal missing
        value = values[m.group(1) or m.group(2)]
        if value is None:
            missing = True
            return ""
        return value

    out = _DST_RE.sub(sub, text)
    return None if missing else out


def split_search_path(value: str) -> tuple[str, ...]:
    """LD_LIBRARY_PATH / --library-path elements: glibc splits on both ':' and ';'."""
    return tuple(re.split(r"[:;]", value))


def fillin(elements: tuple[str, ...], origin: str | None, env: LoaderEnv) -> tuple[str, ...]:
    """`fillin_rpath`: expand DSTs, drop unexpandable ones, '' -> './', strip trailing '/', drop repeats."""
    out: list[str] = []
    for el in elements:
        d = expand_dst(el, origin, env.lib_token, env.platform) if "$" in el else el
        if d is None:
            continue
        if d == "":
            d = "."
        while len(d) > 1 and d.endswith("/"):
            d = d[:-1]
        if d not in out:
            out.append(d)
    return tuple(out)


def search_order(name: str, *, rpath: Iterable[tuple[tuple[str, ...], str]] = (),
                 ld_library_path: tuple[str, ...] = (), runpath: tuple[tuple[str, ...], str] | None = None,
                 cached: Callable[[], str | None] | None = None, system_dirs: tuple[str, ...] = (),
                 subdirs: tuple[str, ...] = ("",), nodeflib: bool = False) -> Iterator[tuple[str, str]]:
    """(path, how) in the order ld.so tries them for a name without '/' (glibc elf/dl-load.c `_dl_map_object`).

    The RPATH groups of the loading chain (given only when the loader has no
    RUNPATH), LD_LIBRARY_PATH, the loader's RUNPATH, the ld.so.cache's first
    hit (`cached`, asked only when reached; not one in a system dir under
    DF_1_NODEFLIB), then the system dirs (none under DF_1_NODEFLIB).  Every
    dir is tried with each of `subdirs` (glibc-hwcaps, legacy hwcap subdirs,
    "" for the dir itself).  The one model of the order: the resolver and
    ldcheck walk it, each with its own test of a candidate.
    """
    for dirs, how in rpath:
        yield from _in_dirs(name, dirs, subdirs, how)
    yield from _in_dirs(name, ld_library_path, subdirs, "LD_LIBRARY_PATH")
    if runpath is not None:
        yield from _in_dirs(name, runpath[0], subdirs, runpath[1])
    path = cached() if cached is not None else None
    if path is not None and not (nodeflib and any(path.startswith(d.rstrip("/") + "/") for d in system_dirs)):
        yield path, "ld.so.cache"
    if not nodeflib:
        yield from _in_dirs(name, system_dirs, subdirs, "default dir")


def _in_dirs(name: str, dirs: Iterable[str], subdirs: tuple[str, ...], how: str) -> Iterator[tuple[str, str]]:
    for d in dirs:
        base = d if d.endswith("/") else d + "/"
        for sub in subdirs:
            yield base + (sub + "/" if sub else "") + name, how
