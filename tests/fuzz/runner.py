"""Run fuzz targets with hypothesis outside pytest, counting cases and collecting crash signatures."""

from __future__ import annotations

import os
import signal
import time
import traceback

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings

from tests.fuzz.targets import TARGETS

_PKG = os.sep + "pyxis_hook" + os.sep

#: a case that runs longer than this is a hang (a crash of its own kind)
CASE_LIMIT_S = 10


class CaseTimeout(Exception):
    """A parser took longer than CASE_LIMIT_S on one input."""


def _alarm(*_):
    raise CaseTimeout(f"one case ran over {CASE_LIMIT_S} s")


def signature(exc: BaseException) -> str:
    """`Type at file:line in function` of the innermost frame in pyxis_hook (else the innermost frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if _PKG in f.filename] or frames
    f = ours[-1] if ours else None
    where = f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" if f else "?"
    return f"{type(exc).__name__} at {where}"


def run_target(name: str, cases: int, seed: int) -> tuple[int, list[tuple[str, str]]]:
    """Run `cases` generated inputs through target `name`; (cases run, [(signature, repr of the input)])."""
    target = TARGETS[name]
    count = 0
    crashes: list[tuple[str, str]] = []
    last_input: list[object] = [None]

    def body(x):
        nonlocal count
        count += 1
        last_input[0] = x
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.alarm(CASE_LIMIT_S)
        try:
            target.run(x)
        except target.allowed:
            pass
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, old)

    test = settings(max_examples=cases, deadline=None, database=None, derandomize=False,
                    phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
                    report_multiple_bugs=False)(given(target.strategy)(body))
    test = hseed(seed)(test)
    try:
        test()
    except Exception as e:  # noqa: BLE001 — a crash: record it and go on
        crashes.append((signature(e), repr(last_input[0])[:300]))
    return count, crashes


def run_all(names: list[str], cases: int, seed: int, budget_s: float | None = None,
            report=print) -> tuple[int, dict[str, list[tuple[str, str]]]]:
    """Every target in `names`, `cases` each, rounds with new seeds until `budget_s` (if given) is spent."""
    total = 0
    crashes: dict[str, list[tuple[str, str]]] = {}
    start = time.monotonic()
    round_ = 0
    while True:
        for name in names:
            t0 = time.monotonic()
            n, found = run_target(name, cases, seed + round_)
            total += n
            for sig, example in found:
                if sig not in {s for s, _ in crashes.get(name, [])}:
                    crashes.setdefault(name, []).append((sig, example))
            report(f"{name:16} {n:8} cases {time.monotonic() - t0:7.1f} s  crashes: {len(crashes.get(name, []))}")
        round_ += 1
        if budget_s is None or time.monotonic() - start >= budget_s:
            return total, crashes
