"""Containers on a fresh overlay each, run by real runc with the hook under `hook.py` (one fault armed).

The image is one lower dir per test module; each start gets its own upper
dir on its own small tmpfs, as under podman/enroot, so what a start left
in the container's writable layer is exactly the upper dir's content.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

from e2e.conftest import Host, Result, fresh_rootfs, make_host, mount_table, run_container
from fixtures.container import make_bundle

HOOK = Path(__file__).resolve().parent / "hook.py"


def fault_hook(conf: Path, fault: str = "", stage: str = "prestart", timeout: int | None = None) -> dict:
    """The hook entry for config.json: `hook.py` in place of pyxis_hook/__main__.py, PYXIS_FAULT in its env."""
    entry = {"path": sys.executable, "args": [sys.executable, "-I", "-S", str(HOOK), stage],
             "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"PYXIS_HOOK_CONFIG={conf}", f"PYXIS_FAULT={fault}"]}
    if timeout is not None:
        entry["timeout"] = timeout
    return entry


def host_and_image(base: Path) -> tuple[Host, dict[str, Path], Path]:
    """A fake GPU host in `base` with a conf per ld.so.cache mode, and an image (a lower dir)."""
    host = make_host(base)
    confs = {}
    for mode in ("merge", "ldconfig"):
        host.conf = base / f"pyxis-{mode}.conf"
        confs[mode] = host.write_conf(ldcache=mode)
    return host, confs, fresh_rootfs(base / "image")


def start(where: Path, rootfs: Path, hook: dict, env: tuple[str, ...], script: str, *,
          readonly: bool = False, name: str = "") -> Result:
    """`runc run` a bundle in `where` over `rootfs` with `hook` as its one prestart hook."""
    bundle = make_bundle(where / "bundle", rootfs, env=env, args=("/bin/sh", "-c", script),
                         hooks={"prestart": [hook]}, readonly=readonly)
    return run_container("runc", bundle, name or f"pyxis-fault-{os.getpid()}-{where.name[-24:]}")


def upper_files(upper: Path) -> dict[str, tuple]:
    """What a start left in the writable layer: every entry but directories (a copy-up of a
    directory a file was created and removed in is the overlay's doing, not a leftover), by type
    and link target or size."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(upper):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            if stat.S_ISDIR(st.st_mode):
                continue
            kind = stat.S_IFMT(st.st_mode)
            out[os.path.relpath(p, upper)] = (kind, os.readlink(p) if stat.S_ISLNK(st.st_mode) else st.st_size)
    return out


def mounts_under(d: Path) -> list[str]:
    """The host namespace's mounts below `d` (other tests on the machine mount elsewhere meanwhile)."""
    return [m for m in mount_table() if m.startswith(f"{d}/")]


def hook_errors(stderr: str) -> list[str]:
    """Our error lines in runc's output, which quotes the hook's stderr with Go escapes."""
    text = stderr.replace("\\n", "\n").replace('\\"', '"')
    return [line for line in text.splitlines() if "pyxis-hook: error:" in line]


def snapshots(d: Path) -> list[dict]:
    """The node artifacts in `d`, parsed (a corrupt one fails the caller's json.loads)."""
    return [json.loads(p.read_text()) for p in sorted(d.glob("inventory-*.json"))]
