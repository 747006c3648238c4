"""`pyxis-hook ldcache [--root DIR | --cache FILE] [--json]`: print an ld.so.cache like `ldconfig -p`.

Unlike `ldconfig -p` this never runs anything from the root and reads the
root's cache, not the host's (a container image's or the driver root's);
`--root DIR` shows the file as `/etc/ld.so.cache`, as `ldconfig -r DIR -p` does.
"""

from __future__ import annotations

import os
import sys

from pyxis_hook.errors import UsageError

DEFAULT_CACHE = "/etc/ld.so.cache"


def add_arguments(parser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--root", metavar="DIR",
                       help="read DIR/etc/ld.so.cache (symlinks confined to DIR); default: the driver root")
    where.add_argument("--cache", metavar="FILE", help="read this cache file (shown as given)")
    parser.add_argument("--json", action="store_true", help="print JSON (schemas/ldcache.schema.json)")
    parser.add_argument("--glibc", metavar="X.Y", default="2.36",
                        help="reproduce the wording of this glibc's ldconfig (default 2.36)")


def to_json(cache, shown_path: str) -> dict:
    """The JSON document `--json` prints (schema: schemas/ldcache.schema.json)."""
    from pyxis_hook.loader.cacheprint import describe_flags

    return {
        "cache": shown_path,
        "format": cache.fmt,
        "endian": cache.endian,
        "generator": cache.generator,
        "entries": [
            {
                "key": e.key,
                "value": e.value,
                "flags": e.flags,
                "description": describe_flags(e.flags),
                "hwcap": e.hwcap,
                "hwcaps_subdir": e.hwcap_name if e.is_hwcaps else None,
                "isa_level": e.isa_level if e.is_hwcaps else None,
            }
            for e in cache.entries
        ],
    }


def _glibc_version(text: str) -> tuple[int, int]:
    try:
        major, minor = text.split(".", 1)
        return int(major), int(minor)
    except ValueError:
        raise UsageError(f"--glibc {text}: expected a version like 2.36") from None


def run(args, config) -> int:
    from pyxis_hook.loader.cacheprint import format_ldconfig_p
    from pyxis_hook.loader.ldcache import read_cache
    from pyxis_hook.rootfs import resolve_in_root

    glibc = _glibc_version(args.glibc)
    if args.cache:
        host_path, shown = args.cache, args.cache
    else:
        root = args.root if args.root is not None else config.driver_root
        host_path, shown = resolve_in_root(root, DEFAULT_CACHE), DEFAULT_CACHE
    cache = read_cache(host_path)
    if args.json:
        import json

        text = json.dumps(to_json(cache, shown), indent=2) + "\n"
    else:
        text = format_ldconfig_p(cache, shown, glibc=glibc)
    # bytes out: cache strings are file names, not necessarily UTF-8 (surrogateescape round trip)
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
    else:
        sys.stdout.flush()
        buffer.write(os.fsencode(text))
        buffer.flush()
    return 0
