#!/usr/bin/env python3
"""N containers started at once by runc with the hook: the hook's own time and runc's under load.

    sudo python bench/herd.py [--n 100] [--gpus 4] [--driver-root DIR --driver-version V] [--work DIR]

Two herds of N `runc run` starts, each container on its own fresh overlay
of a small glibc image and asking for one GPU (NVIDIA_VISIBLE_DEVICES=i
mod --gpus): `cold`, the snapshot directory empty at the start (every hook
may find no inventory and build one), then `warm`, with the snapshot the
cold herd left.  The hook's time is its own wall time as runc runs it (a
bash wrapper records its start and end: no fork around it); `runc run` is
the whole start, hook included, queued behind the others.  Printed per
herd: p50/p95/max of both, failures, mounts leaked on the host, snapshot
files left.  The driver is the fake 535 tree from tests/fixtures unless
--driver-root names another.  No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from fixtures.container import make_rootfs  # noqa: E402
from fixtures.fakedriver import make_fake_driver  # noqa: E402
from fixtures.herd import read_times, run_herd, timed_hook  # noqa: E402
from fixtures.hosttree import fake_gpus, make_host_tree  # noqa: E402

PY = os.path.realpath(sys.executable)
#: the hook as `pyxis-hook hookd` registers it (bench/README.md, "Hook command")
HOOK = {"path": PY, "args": [PY, "-I", "-S", str(REPO / "pyxis_hook" / "__main__.py"), "prestart"]}
DRIVER_VERSION = "535.216.03"


def percentiles(xs: list[float]) -> tuple[float, float, float]:
    """(p50, p95, max) in ms; p95 by linear interpolation (statistics' inclusive method)."""
    ms = sorted(x * 1000 for x in xs)
    if len(ms) == 1:
        return ms[0], ms[0], ms[0]
    return statistics.median(ms), statistics.quantiles(ms, n=20, method="inclusive")[18], ms[-1]


def herd(work: Path, label: str, image: Path, conf: Path, n: int, gpus: int, snapshot_dir: Path) -> list[str]:
    """Run one herd; return its table rows."""
    base = work / label
    base.mkdir()
    env = ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"PYXIS_HOOK_CONFIG={conf}"]
    timer = work / "timer.sh"
    starts, leaked = run_herd(
        image, base, n, hook=lambda i, where: timed_hook({**HOOK, "env": env}, timer, where / "hook-times"),
        env=lambda i: (f"NVIDIA_VISIBLE_DEVICES={i % gpus}", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
        script="true", name=f"pyxis-bench-{label}")
    hook_s, runc_s, failed = [], [], []
    for s in starts:
        runc_s.append(s.seconds)
        times = s.where / "hook-times"
        if times.exists():
            seconds, _rc = read_times(times)
            hook_s.append(seconds)
        if s.rc != 0:
            failed.append(f"  container {s.index}: {s.stderr.strip().splitlines()[-1] if s.stderr.strip() else s.rc}")
    snaps = [p.name for p in snapshot_dir.iterdir() if not p.name.startswith(".")] if snapshot_dir.is_dir() else []  # not the build lock
    rows = []
    for what, xs in (("hook", hook_s), ("runc run", runc_s)):
        p50, p95, top = percentiles(xs) if xs else (float("nan"),) * 3
        rows.append(f"| {label} | {what} | {len(xs)} | {p50:.1f} | {p95:.1f} | {top:.1f} |")
    print(f"{label}: {n} starts, {len(failed)} failed, {len(leaked)} mounts leaked, "
          f"{len(snaps)} snapshot file(s) left: {', '.join(sorted(snaps)) or '-'}")
    for line in failed[:5] + [f"  leaked: {m}" for m in leaked[:5]]:
        print(line)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pyxis-hook under a herd of concurrent runc starts")
    ap.add_argument("--n", type=int, default=20, help="containers started at once (default 20)")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs of the fake host (default 4)")
    ap.add_argument("--driver-root", help="driver tree to use (default: the fake 535 driver of tests/fixtures)")
    ap.add_argument("--driver-version", default=DRIVER_VERSION,
                    help=f"the kernel module's version the fake host reports (default {DRIVER_VERSION})")
    ap.add_argument("--work", help="where to build everything (default: a temp dir)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("run as root (overlay mounts, runc)")
    if args.n < 1 or args.gpus < 1:
        ap.error("--n and --gpus must be at least 1")
    work = Path(args.work or tempfile.mkdtemp(prefix="pyxis-herd-"))
    work.mkdir(parents=True, exist_ok=True)
    driver = Path(args.driver_root) if args.driver_root else make_fake_driver(work / "driver", version=args.driver_version)
    tree = make_host_tree(work / "host", gpus=fake_gpus(args.gpus), driver_version=args.driver_version)
    snapshot_dir = work / "snapshot"
    snapshot_dir.mkdir(mode=0o755)
    conf = work / "pyxis.conf"
    conf.write_text("\n".join([f'driver-root = "{driver}"', f'dev-root = "{tree.dev_root}"',
                               f'proc-root = "{tree.proc_root}"', f'snapshot-dir = "{snapshot_dir}"',
                               'log-level = "warning"', ""]))
    image = make_rootfs(work / "image", gputest=False)
    rows = ["| herd | time of | starts | p50 ms | p95 ms | max ms |", "|---|---|---:|---:|---:|---:|"]
    for label in ("cold", "warm"):
        rows += herd(work, label, image, conf, args.n, args.gpus, snapshot_dir)
    print(f"work dir: {work}\n")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
