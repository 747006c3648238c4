#!/usr/bin/env python3
"""Instruction counts of one steady container start per case, under valgrind's callgrind (load-independent).

    sudo python bench/callgrind.py [--tree DIR]

Uses run.py's fixtures (a fake 535 driver, fake GPU hosts, the small and
5,000-library images).  For each case: four warm-up starts (the node
artifact and the start image written), then one start under `valgrind
--tool=callgrind`; prints the instructions it executed, and those of a bare
`python -I -S -c pass` (with its teardown, which the hook skips).  `--tree`
times another checkout's hook with the same fixtures (an older commit, for a
before/after pair).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

#: (label, image, GPUs, env)
CASES = (
    ("1 GPU", "small", 1, bench.GPU_ENV),
    ("4 GPUs", "small", 4, bench.GPU_ENV),
    ("64 GPUs", "small", 64, bench.GPU_ENV),
    ("4 GPUs, 5k image", "5k", 4, bench.GPU_ENV),
    ("no GPU", "small", 4, ()),  # after the GPU starts, which wrote the start image's boot section
)


def instructions(argv: list[str], out: Path, **kw) -> float:
    """Millions of instructions `argv` executed under callgrind."""
    r = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", *argv], capture_output=True,
                       **kw)
    found = re.search(rb"Collected : (\d+)", r.stderr)
    if r.returncode or not found:
        raise SystemExit(r.stderr.decode(errors="replace")[-2000:])
    return int(found.group(1)) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", metavar="DIR", default=str(bench.REPO), help="the checkout whose hook is counted")
    ap.add_argument("--launcher", action="store_true",
                    help="count the hook as `pyxis-hook install` registers it (the launcher), not `python -I -S __main__.py`")
    args = ap.parse_args()
    if not shutil.which("valgrind"):
        ap.error("valgrind is not installed")
    main_py = str(Path(args.tree) / "pyxis_hook" / "__main__.py")
    hook = [bench.PY, "-I", "-S", main_py, "prestart"]
    work = Path(tempfile.mkdtemp(prefix="pyxis-callgrind-"))
    try:
        w = bench.World(work, None)
        if args.launcher:
            from pyxis_hook.engines.launcher import launcher_text

            (work / "launcher").write_text(launcher_text(bench.PY, main_py))
            (work / "launcher").chmod(0o755)
            hook = [str(work / "launcher"), "prestart"]
        for label, image, n, env in CASES:
            for _ in range(4):
                bench.case_hook(w, image, n, env, argv=hook)
            with bench._stand_in(w, image) as (base, root, proc):
                bundle = base / "bundle"
                bench.make_bundle(bundle, root, env=env)
                count = instructions(hook, work / "cg.out", input=bench._state(w, proc, bundle), env=w.hook_env(n, True))
            print(f"{label}: {count:.2f} M")
        print(f"bare python -I -S -c pass: {instructions([bench.PY, '-I', '-S', '-c', 'pass'], work / 'cg.out'):.2f} M")
    finally:
        ov = work / "ov"
        for d in ov.iterdir() if ov.exists() else ():
            subprocess.run(["umount", "-l", str(d / "mnt")], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
