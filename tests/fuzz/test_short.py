"""The short form of the fuzz suite: every target, a few hundred cases each, a fixed seed.

The long form is `python -m tests.fuzz --cases 20000 --minutes 60` (docs in tests/fuzz/__main__.py).
"""

from __future__ import annotations

import pytest

from tests.fuzz.runner import run_target
from tests.fuzz.targets import TARGETS

CASES = {"elf-dynamic": 150, "ld-so-conf": 150}


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_fuzz_target_raises_only_our_errors(name):
    n, crashes = run_target(name, CASES.get(name, 300), seed=20261203)
    assert crashes == []
    assert n >= CASES.get(name, 300) // 2  # the target really ran (hypothesis may stop early on small spaces)
