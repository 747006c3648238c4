"""The inventory's records: the host driver's files per capability, and the GPUs.

`DriverFile`, `NonDriverDep` and `Inventory` are what host/discovery.py builds,
host/artifact.py caches on disk and the planning code reads.  The per-container path
loads only this module (and the artifact's), never discovery's code: the live
facts an artifact load re-checks (`ipc_files`, `refresh_live`) are here.
"""

from __future__ import annotations
from pyxis_hook import pathnames
from pyxis_hook.host import daemons
from pyxis_hook import log
from pyxis_hook.host.gpus import HostGpus
from pyxis_hook.record import record, replace
from pyxis_hook.rootfs import to_root_relative

KINDS = ("lib", "lib32", "bin", "firmware", "ipc", "icd")

_VERSION_RE = r"\d{3}\.\d+(?:\.\d+)?"  # driver versions: 470.256.02, 535.104.05, 550.54
VERSIONED_RE = rf"^(lib[^/]*\.so)\.({_VERSION_RE})$"


@record
class DriverFile:
    """One host file (or socket/dir) the driver provides.

    `path` is where it is inside the driver root after resolving symlinks
    there (``/usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.535.309.01``),
    except for firmware and ICD files, which keep the path they are listed
    under (where the container's loaders look for them); `host_path` is the
    file itself as an absolute host path, always resolved inside the driver
    root.  `name` is the file name it gets in the container (the
    versioned file for libraries, never a link).  `links` are the symlinks
    to make next to it, as (link name, target) in the same directory: the
    SONAME link, the `.so` link when the host has one, LNC's extras.
    `inject` is False for what is listed but not injected by default (ICD
    files without `graphics-config-files`).
    """

    kind: str
    capability: str
    path: str
    host_path: str
    name: str
    soname: str | None = None
    elfclass: int | None = None
    links: tuple[tuple[str, str], ...] = ()
    source: str = ""
    needed: tuple[str, ...] = ()
    inject: bool = True

    def to_dict(self) -> dict:
        return {
            "kind": self.kind, "capability": self.capability, "path": self.path,
            "host_path": self.host_path, "name": self.name, "soname": self.soname,
            "elfclass": self.elfclass, "links": [list(x) for x in self.links], "source": self.source,
            "needed": list(self.needed), "inject": self.inject,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "DriverFile":
        return cls(kind=d["kind"], capability=d["capability"], path=d["path"], host_path=d["host_path"],
                   name=d["name"], soname=d["soname"], elfclass=d["elfclass"],
                   links=tuple((str(a), str(b)) for a, b in d["links"]), source=d["source"],
                   needed=tuple(d["needed"]), inject=bool(d["inject"]))


@record
class NonDriverDep:
    """A DT_NEEDED of a driver library that the driver does not ship (libX11.so.6).

    Recorded so `ldcheck`/`list` can say an image without it cannot load the
    library; never injected.  `host_path` is where the driver root's cache
    has it (None: nowhere).
    """

    name: str
    needed_by: tuple[str, ...]
    capability: str
    elfclass: int
    host_path: str | None = None

    def to_dict(self) -> dict:
        return {"name": self.name, "needed_by": list(self.needed_by), "capability": self.capability,
                "elfclass": self.elfclass, "host_path": self.host_path}

    @classmethod
    def from_dict(cls, d: dict) -> "NonDriverDep":
        return cls(name=d["name"], needed_by=tuple(d["needed_by"]), capability=d["capability"],
                   elfclass=d["elfclass"], host_path=d["host_path"])


@record
class Inventory:
    """Everything the driver root offers, per capability, plus the host's GPUs.

    `missing` are "capability: name" strings for prefix-list entries the host
    lacks (warnings, not errors).  `errors` are the problems that make the
    inventory unusable for injection (no driver, libnvidia-tls without its
    ABI note); `discover(strict=True)` raises the first one as DriverError.
    `sources` are the stat signatures (path, st_dev, st_ino, st_size,
    st_mtime_ns) of every file the result came from, for the node artifact's freshness.
    """

    driver_version: str | None
    cuda_version: int | None
    host: HostGpus
    files: tuple[DriverFile, ...]
    missing: tuple[str, ...] = ()
    non_driver_deps: tuple[NonDriverDep, ...] = ()
    warnings: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    driver_root: str = "/"
    version_source: str = ""  # "procfs" | "files" | ""
    other_versions: tuple[str, ...] = ()
    sources: tuple[tuple[str, int, int, int, int], ...] = ()

    @property
    def usable(self) -> bool:
        return not self.errors and self.driver_version is not None

    def deps_for(self, capabilities) -> tuple[NonDriverDep, ...]:
        """The non-driver dependencies of the libraries `capabilities` get, each (name, class) once.

        A dependency of a library two capabilities share (550's libnvidia-gpucomp
        serves compute and graphics) is recorded once per capability; a request
        for either hears of it, a request for both hears of it once.
        """
        wanted = set(capabilities)
        out: dict[tuple[str, int], NonDriverDep] = {}
        for d in self.non_driver_deps:
            if d.capability in wanted:
                out.setdefault((d.name, d.elfclass), d)
        return tuple(out.values())

    def select(self, capabilities, *, kinds=KINDS, include_uninjected: bool = False) -> tuple[DriverFile, ...]:
        """The files a request for `capabilities` gets, each host file once.

        32-bit libraries come only with `compat32`, and then for the other
        requested capabilities; GSP firmware comes with any capability (the
        kernel module needs it whatever the container does; LNC); ICD files
        only when marked `inject` unless `include_uninjected`.
        """
        wanted = set(capabilities)
        out: list[DriverFile] = []
        seen: set[tuple[str, str]] = set()
        for f in self.files:
            if f.kind not in kinds:
                continue
            if f.capability not in wanted and not (f.kind == "firmware" and wanted):
                continue
            if f.kind == "lib32" and "compat32" not in wanted:
                continue
            if not f.inject and not include_uninjected:
                continue
            key = (f.kind, f.host_path)
            if key in seen:
                continue
            seen.add(key)
            out.append(f)
        return tuple(out)

    def to_dict(self) -> dict:
        """Plain JSON-able dict (schemas/inventory.schema.json); inverse of `from_dict`."""
        return {
            "driver_version": self.driver_version,
            "cuda_version": self.cuda_version,
            "host": self.host.to_dict(),
            "files": [f.to_dict() for f in self.files],
            "missing": list(self.missing),
            "non_driver_deps": [d.to_dict() for d in self.non_driver_deps],
            "warnings": list(self.warnings),
            "errors": list(self.errors),
            "driver_root": self.driver_root,
            "version_source": self.version_source,
            "other_versions": list(self.other_versions),
            "sources": [list(s) for s in self.sources],
        }

    @classmethod
    def from_dict(cls, d: dict, host: HostGpus | None = None) -> "Inventory":
        """Rebuild from `to_dict()`; KeyError/TypeError/ValueError on a malformed dict.

        With fresh GPU facts `host`, the saved ones are not rebuilt (two records
        a GPU that a start would throw away): the result is `with_host` of the
        saved inventory, its own warnings kept after the fresh host's.
        """
        warnings = tuple(d["warnings"])
        if host is None:
            host = HostGpus.from_dict(d["host"])
        else:
            warnings = _warnings_with(host, warnings, d["host"]["warnings"])
        return cls(
            driver_version=d["driver_version"],
            cuda_version=d["cuda_version"],
            host=host,
            files=tuple(DriverFile.from_dict(f) for f in d["files"]),
            missing=tuple(d["missing"]),
            non_driver_deps=tuple(NonDriverDep.from_dict(x) for x in d["non_driver_deps"]),
            warnings=warnings,
            errors=tuple(d["errors"]),
            driver_root=d["driver_root"],
            version_source=d["version_source"],
            other_versions=tuple(d["other_versions"]),
            sources=tuple((str(p), int(a), int(b), int(c), int(e)) for p, a, b, c, e in d["sources"]),
        )


def version_key(value: str) -> tuple[int, ...]:
    """Dotted numeric value with trailing zero components dropped (`11` == `11.0`), for ordering versions."""
    parts = [int(p) for p in value.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def driver_major(version: str | None) -> int | None:
    """535 of "535.104.05"; None when unknown or not a dotted number."""
    head = (version or "").split(".")[0]
    return int(head) if head.isdigit() and len(head) < 10 else None


def with_host(inv: Inventory, host: HostGpus) -> Inventory:
    """The same driver files with fresh GPU facts (GPUs and MIG change without a driver change)."""
    return replace(inv, host=host, warnings=_warnings_with(host, inv.warnings, inv.host.warnings))


def _warnings_with(host: HostGpus, warnings, old_host_warnings) -> tuple[str, ...]:
    """An inventory's `warnings` with `host`'s in place of those its former GPU facts gave."""
    old = set(old_host_warnings)
    return tuple(host.warnings) + tuple(w for w in warnings if w not in old)


def ipc_files(root: str, mps_pipe_dir: str, warn=log.debug) -> list[DriverFile]:
    """Daemon sockets and the MPS pipe dir inside `root`, where they exist (`daemons.ipc_paths`), as files.

    Here, not in discovery: a node artifact load re-checks them every time (`refresh_live`), and the
    per-container path must not load discovery's code for that.
    """
    return [DriverFile(kind="ipc", capability=cap, path=to_root_relative(root, real), host_path=real,
                       name=pathnames.basename(real), source=source)
            for cap, real, source in daemons.ipc_paths(root, mps_pipe_dir, warn)]


def refresh_live(inv: Inventory, config) -> Inventory:
    """`inv` with the IPC sockets and MPS dir as they are now (the GPUs, the other live facts, are
    given to `Inventory.from_dict` when the node artifact is read).

    Daemons (persistenced, fabricmanager, MPS) start and stop at any time, so
    a node artifact must not freeze their sockets; re-checking them is a few stats.
    """
    files = tuple(f for f in inv.files if f.kind != "ipc") + tuple(ipc_files(inv.driver_root, config.mps_pipe_dir))
    return replace(inv, files=files)
