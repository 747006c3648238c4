"""`pyxis-hook ldd [--root ROOT] [--library-path P] [--inhibit-cache] [--json] FILE...`

Prints what `ldd FILE` (glibc's `LD_TRACE_LOADED_OBJECTS=1 ld.so FILE`) would
print if FILE were run with ROOT as '/', without running anything from ROOT:
the search rules, system dirs and ld.so.cache are those of ROOT's loader.
Load addresses and the vDSO line are omitted.  Like glibc, a missing library
is a `=> not found` line and exit status 0; a candidate that makes the load
fail (too short, bad header) ends that file with glibc's
`error while loading shared libraries` message and exit status 127.
The host's LD_LIBRARY_PATH is deliberately ignored: use --library-path.
"""

from __future__ import annotations

import sys

LOAD_FAILED_EXIT = 127


def add_arguments(parser) -> None:
    parser.add_argument("--root", metavar="ROOT", default="/",
                        help="resolve inside ROOT (symlinks confined to it); default /")
    parser.add_argument("--library-path", metavar="PATH", default="",
                        help="as ld.so --library-path / LD_LIBRARY_PATH (':' or ';' separated)")
    parser.add_argument("--inhibit-cache", action="store_true", help="ignore ROOT's /etc/ld.so.cache")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/ldd.schema.json)")
    parser.add_argument("files", nargs="+", metavar="FILE", help="root-relative path of an executable or library")


def _one(args, path: str) -> tuple[dict, str]:
    """Resolve one file: (the JSON document's per-file object, what ldd prints on stdout for it).

    The stdout text is `resolve.format_ldd` of the dependencies, the one
    formatter of ldd lines; a file whose load fails prints nothing there.
    """
    from pyxis_hook.loader.elf import read_elf
    from pyxis_hook.errors import ElfError
    from pyxis_hook.loader.loaderenv import DEFAULT_RTLD, loader_env_for_root
    from pyxis_hook.loader.resolve import LoadFailed, format_ldd, resolve_tree
    from pyxis_hook.rootfs import resolve_in_root

    import os

    if os.path.normpath(args.root) == "/" and not path.startswith("/"):
        path = os.path.abspath(path)  # as ld.so, which opens a relative FILE from the cwd
    result: dict = {"file": path, "root": args.root, "interpreter": None, "statically_linked": False,
                    "search": None, "dependencies": [], "error": None}
    try:
        info = read_elf(resolve_in_root(args.root, path))
    except ElfError as e:
        result["error"] = {"name": path, "reason": _reason(str(e), resolve_in_root(args.root, path))}
        return result, ""
    interp = info.interp or DEFAULT_RTLD.get((info.elfclass, info.machine), "/lib64/ld-linux-x86-64.so.2")
    env = loader_env_for_root(args.root, elfclass=info.elfclass, machine=info.machine, interp=interp,
                              ld_library_path=args.library_path,
                              inhibit_cache=args.inhibit_cache)
    result["interpreter"] = interp
    result["search"] = {
        "system_dirs": list(env.system_dirs),
        "hwcaps": list(env.hwcaps),
        "legacy_subdirs": list(env.legacy_subdirs),
        "ld_library_path": env.ld_library_path,
        "cache": env.cache is not None,
        "lib": env.lib_token,
        "platform": env.platform,
        "glibc_version": ".".join(map(str, env.glibc_version)) if env.glibc_version else None,
    }
    try:
        deps = resolve_tree(env, path)
    except LoadFailed as e:
        result["error"] = {"name": e.name, "reason": e.reason}
        return result, ""
    for d in deps:
        if d.error is not None:
            result["error"] = {"name": d.name, "reason": d.error}
            return result, ""
        result["dependencies"].append({"name": d.name, "path": d.path, "how": d.how, "needed_by": d.needed_by,
                                       "soname": d.soname, "interpreter": d.interpreter})
    result["statically_linked"] = not info.dynamic or not info.needed
    return result, format_ldd(deps, main_is_dynamic=not result["statically_linked"])


def _reason(message: str, host_path: str) -> str:
    """Our ElfError text minus the leading file name, for glibc-style lines."""
    prefix = host_path + ": "
    return message[len(prefix):] if message.startswith(prefix) else message


def error_text(result: dict) -> str:
    """glibc's message for a file whose load fails ("" when it loads)."""
    err = result["error"]
    if err is None:
        return ""
    return f"{result['file']}: error while loading shared libraries: {err['name']}: {err['reason']}\n"


def run(args, config) -> int:
    done = [_one(args, f) for f in args.files]
    results = [r for r, _ in done]
    rc = LOAD_FAILED_EXIT if any(r["error"] for r in results) else 0
    if args.json:
        import json

        sys.stdout.write(json.dumps({"files": results}, indent=2) + "\n")
        return rc
    for r, out in done:
        err = error_text(r)
        if len(results) > 1:
            sys.stdout.write(f"{r['file']}:\n")
        sys.stdout.write(out)
        sys.stdout.flush()
        if err:
            sys.stderr.write(err)
    return rc
