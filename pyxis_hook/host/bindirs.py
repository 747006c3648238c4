"""Where a driver installed under a prefix keeps its binaries: next to its libraries.

A driver under a prefix (`/usr/local/nvidia`, `/opt/nvidia`, a GKE-style
`/home/kubernetes/bin/nvidia`, a driver container's tree) is known to the
loader only through `ld.so.conf.d`, so its libraries are found; its binaries
(`<prefix>/bin/nvidia-smi`) are on no default `path`, and libnvidia-container
and the toolkit, which search `PATH` only, miss them.  Installers put
binaries and libraries under one prefix (NVIDIA's .run installer:
`--prefix`/`--utility-prefix` hold `bin` and `lib`/`lib64`), so the prefix
of the directory a driver library was found in names the binaries' too.

Pure path arithmetic: the caller resolves each directory inside the driver
root and takes only regular executables from it.
"""

from __future__ import annotations

#: directory names that end a prefix's library part: `<prefix>/lib64`, `<prefix>/lib/<triplet>`,
#: Debian's `<prefix>/lib/<triplet>/nvidia/current` (the last such component counts, so a prefix
#: may itself hold one: `/var/lib/nvidia/lib64`)
LIB_DIR_NAMES = frozenset(("lib", "lib64", "lib32", "libx32"))

#: what a prefix holds binaries in, searched in this order
PREFIX_BIN_SUBDIRS = ("bin", "sbin")


def driver_prefix(lib_dir: str) -> str | None:
    """The prefix of an absolute library directory: what precedes its last `lib*` component.

    `/usr/local/nvidia/lib64` -> `/usr/local/nvidia`; `/usr/lib/x86_64-linux-gnu` -> `/usr`;
    `/lib64` -> `/`; None when no component names a library dir (no prefix to tell).
    """
    parts = [p for p in lib_dir.split("/") if p]
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in LIB_DIR_NAMES:
            return "/" + "/".join(parts[:i])
    return None


def prefix_bin_dirs(lib_dirs) -> list[str]:
    """`<prefix>/bin`, `<prefix>/sbin` of each library dir's prefix, in first-seen order, each once."""
    out: dict[str, None] = {}
    for d in lib_dirs:
        prefix = driver_prefix(d)
        if prefix is None:
            continue
        for sub in PREFIX_BIN_SUBDIRS:
            out.setdefault(prefix.rstrip("/") + "/" + sub, None)
    return list(out)
