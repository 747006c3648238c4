"""`python -m tests.fuzz [--cases N] [--seed S] [--minutes M] [TARGET...]` from the repository root.

Runs each target N cases (rounds with new seeds while --minutes last), prints
cases per target and every distinct crash signature, exits 1 when any.
The long form: `python -m tests.fuzz --cases 20000 --minutes 60`.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/ (fixtures)


def main() -> int:
    from tests.fuzz.runner import run_all
    from tests.fuzz.targets import TARGETS

    p = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=1000, help="cases per target per round (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=None, help="keep running rounds until this much time is spent")
    p.add_argument("targets", nargs="*", choices=[[], *TARGETS], metavar="TARGET", help=", ".join(TARGETS))
    a = p.parse_args()
    names = a.targets or list(TARGETS)
    total, crashes = run_all(names, a.cases, a.seed, None if a.minutes is None else a.minutes * 60)
    print(f"{total} cases, {sum(len(v) for v in crashes.values())} crash signatures")
    for name, found in crashes.items():
        for sig, example in found:
            print(f"CRASH {name}: {sig}\n    input: {example}")
    return 1 if crashes else 0


if __name__ == "__main__":
    sys.exit(main())
