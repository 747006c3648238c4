"""The decision cache: a GPU start whose inputs are all as an earlier start found them applies that start's plan.

Why: the planner is pure (`spec.request`, `plan.build`), but reaching it is
most of a start's own work: the inventory snapshot parsed into records,
the request's and the planner's modules executed from the start image,
the request resolved and the plan built.  A start served from here loads
none of that code (bench/README.md has the figures).

What a decision depends on, and how a start checks each input without
the planning modules (a decision is used only when every one is equal):
- the configuration (every key) and this package's version and code (the
  file signature of each of its modules loaded when the decision was made:
  an edited install keeps its version string);
- the driver files: the identity of the snapshot file (`snapshot.identity`)
  and the checks a snapshot load makes (`snapshot.stale_reason`: where the
  driver root leads, each source file's stat signature, the driver version);
- the GPUs, MIG devices and nodes, as the looks discovery made on this
  start (`gpumemo.start_gpus`: equal looks decide an equal `HostGpus`;
  without them, the `HostGpus` itself), the daemons' sockets (`daemons.ipc_paths`) and
  the /proc/driver/nvidia texts the container's view copies;
- the GPUs the hook's device cgroup allows and the env after the task view
  (`prepare.confinement`), the annotations and the privileged flag;
- of the container's env, what the request read (`decisionkeep.ObservedEnv`): the value
  or absence of each variable it looked up and each family it listed
  (`envreads.prefixed`), so a job's other variables (SLURM_JOB_ID, PATH) do not
  make another decision;
- the container's rootfs facts (`container_facts`) and what the image holds
  at the driver libraries' link paths.

A request naming a MIG device by UUID asks NVML on every start and is never
cached.  `plan` always decides afresh; tests check that a decision from here
equals a fresh one.

Where: `<snapshot-dir>/decisions-<digest>.bin`, one file per value of every
input but the env and the code, holding up to `decisionkeep.VARIANTS` decisions that differ
in what the request read of the env or in the code that made them (the
newest first).  It is trusted as the snapshot
is (a regular file of root's or ours, not writable by group or others, in
such a directory) and written atomically (tmp + rename); the directory
keeps the `decisionkeep.KEEP_FILES` newest.  Anything else (missing, corrupt, written by
another Python or version) is a miss, never an error.
"""

from __future__ import annotations

import marshal

from pyxis_hook import __version__, log, pathnames
from pyxis_hook.errors import SnapshotError
from pyxis_hook.plan import build
from pyxis_hook.record import replace

#: the files' own layout: bumped when an entry changes shape
FORMAT = b"pyxis-hook decisions 3\n"
#: a decision file larger than this is not read (a plan for 64 GPUs is ~60 KB)
_READ_LIMIT = 8 << 20
_PREFIX = "decisions-"

#: the records a plan is made of, by name: how a stored plan is rebuilt
_PLAN_RECORDS = {c.__name__: c for c in (build.Plan, build.DeviceEdit, build.MountEdit, build.SymlinkEdit,
                                          build.CgroupRule, build.ProcDriverView, build.LdcacheUpdate)}


def _matches(observed: tuple, env) -> bool:
    """Whether `env` (a plain dict) reads as it did for the decision that `observed`."""
    if observed[0] == "whole":
        return tuple(sorted(env.items())) == observed[1]
    _, seen, families = observed
    for name, value in seen:
        if env.get(name) != value:
            return False
    for prefix, members in families:
        if tuple(sorted((k, v) for k, v in env.items() if k.startswith(prefix))) != members:
            return False
    return True


_PLAIN = frozenset({str, int, bool, type(None)})


def _encode(value):
    """A record as marshal's plain values: [its class's name, *its fields], a field holding records encoded too.

    Records hold no lists, so a list is always an encoded record; a tuple
    whose first item is one holds only records (a plan's edits).  A record
    of plain values only (a GPU, a device node: two a GPU on every start)
    is read and checked by C loops (`map`), not by a comprehension.
    """
    fields = getattr(type(value), "__record_fields__", None)
    if fields is None:
        if type(value) is tuple and value and getattr(type(value[0]), "__record_fields__", None) is not None:
            return tuple([_encode(v) for v in value])
        return value
    values = list(map(value.__getattribute__, type(value).__record_shape__[3]))  # no itertools: an import
    if _PLAIN.issuperset(map(type, values)):
        return [type(value).__name__, *values]
    return [type(value).__name__, *[v if type(v) in _PLAIN else _encode(v) for v in values]]


def _decode(value):
    """The plan `_encode` gave: only lists and tuples of lists are looked into (not at all when all is plain)."""
    if _PLAIN.issuperset(map(type, value)):  # a device node's edit: name and plain fields
        return _PLAN_RECORDS[value[0]](*value[1:])
    return _PLAN_RECORDS[value[0]](*[_decode(v) if type(v) is list else
                                     tuple([_decode(r) for r in v]) if type(v) is tuple and v and type(v[0]) is list else v
                                     for v in value[1:]])


class Lookup:
    """One start's question to the cache: its key and the decision when there is one (`decisionkeep.save` after a miss)."""

    def __init__(self, config, host, env, annotations, privileged: bool, allowed, view: str, proc_files,
                 gpu_looks: bytes | None = None) -> None:
        """`gpu_looks`: what discovery found when it decided `host` (`gpumemo.start_gpus`), which then stands
        for `host` in the key: equal looks give an equal HostGpus, and comparing them costs no records."""
        from pyxis_hook.host import daemons, snapshot
        from pyxis_hook.plan.container import container_facts

        self.config = config
        self.host = host
        self.view = view
        self.env = env
        self.why = ""
        self.variants: list = []
        self.facts = container_facts(view)  # without the driver files: the links' occupants are checked per decision
        try:
            snap: tuple | None = snapshot.identity(config)
        except SnapshotError as e:
            snap = None
            self.why = f"no snapshot ({e})"
        self.snap = snap
        root = pathnames.realpath(config.driver_root)
        ipc = daemons.ipc_paths(root, config.mps_pipe_dir, log.debug)
        self.root = root
        self.key = marshal.dumps((
            __version__, _encode(config), snap, _encode(host) if gpu_looks is None else gpu_looks, ipc,
            tuple(sorted(annotations.items())), bool(privileged),
            None if allowed is None else tuple(sorted(allowed)),
            _encode(replace(self.facts, rootfs="")), proc_files,
        ))
        self.path = snapshot.kept_path(config, _PREFIX, self.key)
        if snap is not None:
            self.variants = self._read()

    def _read(self) -> list:
        from pyxis_hook.host import snapshot

        try:
            key, variants = snapshot.load_kept(self.path, FORMAT, _READ_LIMIT)
            if key != self.key:
                raise ValueError("another start's inputs (a digest collision)")
            if not isinstance(variants, list):
                raise ValueError("not a list")
        except SnapshotError as e:
            self.why = str(e)
            return []
        except (ValueError, TypeError) as e:
            self.why = f"{self.path}: not used: {e}"
            return []
        return variants

    def plan(self) -> tuple | None:
        """(the cached plan, whether its GPUs are the scheduler's allocation) for this start, or None (`why` says why).

        The plan names the rootfs of the start that made it: the caller puts its own.
        """
        from pyxis_hook import startimage
        from pyxis_hook.host import snapshot
        from pyxis_hook.plan.container import link_occupants

        env = self.env
        for variant in self.variants:
            try:
                observed, code, currency, link_paths, occupants, plan, allocated = variant
                if not _matches(observed, env):
                    continue
                if not startimage.same_code(code):  # made by an edited install, or another install of the package
                    self.why = f"{self.path}: made by other code than this package's"
                    continue
                stale = snapshot.stale_reason(currency, self.config, self.host, self.root)
                if stale:
                    self.why = f"{self.path}: stale: {stale}"
                    return None
                if link_occupants(self.view, link_paths) != occupants:
                    continue
                decided = (_decode(plan), bool(allocated))
            except (ValueError, TypeError, KeyError, IndexError) as e:
                self.why = f"{self.path}: not used: corrupt: {type(e).__name__}: {e}"
                return None
            self.why = f"decisions from {self.path}"
            return decided
        if self.variants and not self.why:
            self.why = f"{self.path}: no decision for this env"
        return None
