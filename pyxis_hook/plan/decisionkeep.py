"""Keeping a decision after a miss: what a start served from the decision cache never runs.

`plan.decisions` finds a decision; when it has none, the start plans
(`plan.prepare`), reading the container's env through an `ObservedEnv`,
and then keeps its decision here: what the request read of the env, the
code that made it, the inventory's currency, the plan.  This module is
loaded with the planner's modules (the start image's `plan` tier), so a
start that takes its plan from the cache does not execute it.
"""

from __future__ import annotations

import posix
import sys

from pyxis_hook import pathnames
from pyxis_hook.errors import SnapshotError
from pyxis_hook.host import snapshot
from pyxis_hook.plan import build, decisions

#: decisions kept per file (per value of the inputs other than the env)
VARIANTS = 8
#: decision files kept in the snapshot dir (the newest)
KEEP_FILES = 64


class ObservedEnv(dict):
    """A container env that records what a decision reads of it.

    Each variable looked up (`get`, `[]`, `in`): its value, or None when
    absent; each family listed (`envreads.prefixed`): its members.  Any other
    way of reading the whole env (iterating, comparing, copying) marks it
    `whole`: such a decision then depends on every variable.
    """

    def __init__(self, env) -> None:
        super().__init__(env)
        self.seen: dict[str, str | None] = {}
        self.families: dict[str, tuple[tuple[str, str], ...]] = {}
        self.whole = False

    def get(self, name, default=None):
        value = dict.get(self, name)
        self.seen[name] = value
        return default if value is None else value

    def __getitem__(self, name):
        value = dict.get(self, name)
        self.seen[name] = value
        if value is None:
            raise KeyError(name)
        return value

    def __contains__(self, name) -> bool:
        value = dict.get(self, name)
        self.seen[name] = value
        return value is not None

    def prefixed(self, prefix: str) -> dict[str, str]:
        found = {k: v for k, v in dict.items(self) if k.startswith(prefix)}
        self.families[prefix] = tuple(sorted(found.items()))
        return found

    def _all(self):
        self.whole = True
        return self

    def __iter__(self):
        return dict.__iter__(self._all())

    def __len__(self) -> int:
        return dict.__len__(self._all())

    def __eq__(self, other) -> bool:
        return dict.__eq__(self._all(), other)

    def __ne__(self, other) -> bool:
        return dict.__ne__(self._all(), other)

    __hash__ = None  # as dict's

    def keys(self):
        return dict.keys(self._all())

    def items(self):
        return dict.items(self._all())

    def values(self):
        return dict.values(self._all())

    def copy(self):
        return dict(dict.items(self._all()))

    def observed(self) -> tuple:
        """What was read, as plain values: ("whole", env) or ("read", variables, families)."""
        if self.whole:
            return ("whole", tuple(sorted(dict.items(self))))
        return ("read", tuple(sorted(self.seen.items())), tuple(sorted(self.families.items())))


def _code() -> tuple[tuple[str, int, int], ...]:
    """The `startimage.code_signature` of this package's modules loaded now: the code a decision was made by."""
    from pyxis_hook import startimage

    files = (getattr(module, "__file__", None) or "" for name, module in list(sys.modules.items())
             if name.startswith("pyxis_hook."))
    return startimage.code_signature(f for f in files if f.endswith(".py"))


def save(lookup, env: ObservedEnv, inventory, files, facts, plan, allocated: bool, snapshot_seen: list) -> str:
    """Keep this start's decision after `lookup` had none; `env` what the request read.

    A line for the debug log; never raises.
    """
    if not snapshot_seen or snapshot_seen[-1] != lookup.snap:
        # built by this start, or replaced since the key was made: the next start keeps it
        return "decisions: not kept: the inventory is not the snapshot this start's key names"
    try:
        variant = (env.observed(), _code(), snapshot.currency(inventory),
                   build.link_paths(files, facts), facts.link_occupants, decisions._encode(plan), allocated)
        # the newest first; one per env reading and code (two installs sharing a snapshot dir keep theirs)
        variants = [variant] + [v for v in lookup.variants if v[:2] != variant[:2]][:VARIANTS - 1]
        snapshot.keep(lookup.path, decisions.FORMAT, (lookup.key, variants))
    except (OSError, SnapshotError, ValueError) as e:
        return f"decisions: not kept: {getattr(e, 'strerror', None) or e}"
    _prune(pathnames.dirname(lookup.path))
    return f"decisions: kept in {lookup.path}"


def _prune(directory: str) -> None:
    """Keep the KEEP_FILES newest decision files (each start of a new shape adds one)."""
    try:
        names = [n for n in posix.listdir(directory) if n.startswith(decisions._PREFIX) and n.endswith(".bin")]
        if len(names) <= KEEP_FILES:
            return
        dated = sorted((posix.stat(pathnames.join(directory, n)).st_mtime_ns, n) for n in names)
        for _, name in dated[:len(names) - KEEP_FILES]:
            posix.unlink(pathnames.join(directory, name))
    except OSError:
        pass  # another start pruned first, or the dir went away: the next save tries again
