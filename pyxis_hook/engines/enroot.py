"""enroot hook mode: the container as enroot describes it -> a synthetic bundle -> the same Plan.

enroot is not an OCI runtime: its hooks (`/etc/enroot/hooks.d/*.sh`) run
before the container switches root, inside the container's mount namespace,
with `ENROOT_PID` (the container process), `ENROOT_ROOTFS` and
`ENROOT_ENVIRON` (the image's environment, `NAME=value` lines).  `documents`
reads the NVIDIA_* variables exactly as enroot's own `98-nvidia.sh` does;
`pipeline.enroot` then decides and applies with `no-cgroups` (enroot never
gives a hook a device cgroup to program; under Slurm the step's cgroup
already confines the container).

enroot's rules, kept on purpose so a site can swap hooks without surprises:
- the file is read from its last line up and an `NVIDIA_*` variable already
  in the hook's own environment is not overridden (the environment `enroot
  start` runs in, which under Pyxis is the job's, wins over the file; in the
  file, which holds the image's environment, then environ.d, then `enroot
  start --env`, the last definition wins over earlier ones);
- `NVIDIA_VISIBLE_DEVICES` unset means `void` (even for legacy CUDA images);
- `NVIDIA_DRIVER_CAPABILITIES` unset or empty means `utility`.

The allocation is the scheduler's, never the image's (docs/schedulers.md,
"The allocation rule"): every scheduler-owned variable
(`allocation.is_scheduler_var`) comes from the hook's own environment only,
and one the file defines is not read (`allocation.request_env`).

What the hook honoured is written back to the file (`honoured_env`): enroot
gives the container exactly the file (enroot-switchroot's `--envfile`, the
last definition winning), and Pyxis then copies the container's environment
over the job's, so without it a job's `NVIDIA_VISIBLE_DEVICES=void` that the
hook obeyed would reach the task as the image's `all`.
"""

from __future__ import annotations

import posix

from pyxis_hook import pathnames
from pyxis_hook.errors import UsageError
from pyxis_hook.record import record
from pyxis_hook.spec.allocation import request_env

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: an enroot start does not import `collections` (docs/decisions/2026-12-07-start-costs.md)
    from collections.abc import Mapping

ENVIRON_LIMIT = 1 << 20


def parse_environ(text: str) -> tuple[tuple[str, str], ...]:
    """`NAME=value` lines as (name, value) in file order; lines without '=' are skipped like `read` would."""
    out = []
    for line in text.split("\n"):
        if "=" not in line:
            continue
        key, value = line.split("=", 1)
        if key:
            out.append((key, value))
    return tuple(out)


def read_environ(path: str) -> tuple[tuple[str, str], ...]:
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NOFOLLOW)
        with open(fd, "rb") as f:
            data = f.read(ENVIRON_LIMIT + 1)
    except OSError as e:
        raise UsageError(f"ENROOT_ENVIRON {path}: {e.strerror}") from None
    if len(data) > ENVIRON_LIMIT:
        raise UsageError(f"ENROOT_ENVIRON {path}: larger than {ENVIRON_LIMIT} bytes")
    return parse_environ(data.decode("utf-8", "replace"))


def container_env(file_env: tuple[tuple[str, str], ...], own: Mapping[str, str]) -> dict[str, str]:
    """The environment the request is resolved from, with enroot's precedence rules (module doc).

    `file_env`: ENROOT_ENVIRON's lines (the image's choices); `own`: the
    hook's own environment (the job's: its NVIDIA_* win over the file's, and
    it alone holds the scheduler's variables).
    """
    image = dict(file_env)  # last definition in the file wins
    for key, value in own.items():
        if key.startswith("NVIDIA_"):
            image[key] = value  # `[ -v key ] || export key=value`: the hook's own variable wins
    env = request_env(image, own)
    env.setdefault("NVIDIA_VISIBLE_DEVICES", "void")
    if not env.get("NVIDIA_DRIVER_CAPABILITIES"):
        env["NVIDIA_DRIVER_CAPABILITIES"] = "utility"
    return env


def honoured_env(file_env: tuple[tuple[str, str], ...], own: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The `NVIDIA_*` values taken from the hook's own environment that the file does not end with.

    Appended to ENROOT_ENVIRON so the program sees the request the hook
    honoured.  A value with a newline would be read back as two lines (a
    second variable): refused, before anything is applied.
    """
    last = dict(file_env)
    out = []
    for key, value in own.items():
        if key.startswith("NVIDIA_") and last.get(key) != value:
            if "\n" in value:
                raise UsageError(f"{key}: a value with a newline cannot be written to ENROOT_ENVIRON")
            out.append((key, value))
    return tuple(out)


def enroot_facts(environ: Mapping[str, str]) -> tuple[int, str, str]:
    """(pid, rootfs, environ file) from the hook's environment; one-line errors naming the variable."""
    missing = [v for v in ("ENROOT_PID", "ENROOT_ROOTFS", "ENROOT_ENVIRON") if not environ.get(v)]
    if missing:
        raise UsageError(f"{missing[0]} is not set: `pyxis-hook enroot` runs as an enroot hook "
                         "(/etc/enroot/hooks.d/98-pyxis-hook.sh)")
    raw = environ["ENROOT_PID"]
    if not raw.isdigit() or int(raw) <= 0:
        raise UsageError(f"ENROOT_PID={raw!r}: not a process id")
    rootfs = environ["ENROOT_ROOTFS"]
    if not rootfs.startswith("/") or not pathnames.isdir(rootfs):
        raise UsageError(f"ENROOT_ROOTFS={rootfs!r}: not an absolute path to a directory")
    return int(raw), pathnames.normpath(rootfs), environ["ENROOT_ENVIRON"]


def synthetic_bundle(rootfs: str, env: Mapping[str, str]):
    """An oci.Bundle standing for the enroot container (no config.json exists)."""
    from pyxis_hook.spec.oci import Bundle

    return Bundle(path=rootfs, config_path="", rootfs=rootfs, env=tuple(env.items()))


def append_environ(path: str, items: tuple[tuple[str, str], ...]) -> None:
    """Add variables to the container's environment the way enroot hooks do: append to ENROOT_ENVIRON."""
    if not items:
        return
    try:
        fd = posix.open(path, posix.O_WRONLY | posix.O_APPEND | posix.O_CLOEXEC | posix.O_NOFOLLOW)
        with open(fd, "a") as f:
            f.write("".join(f"{k}={v}\n" for k, v in items))
    except OSError as e:
        raise UsageError(f"ENROOT_ENVIRON {path}: cannot append: {e.strerror}") from None


@record
class EnrootDocs:
    """What enroot tells its hook: the container's pid and rootfs, the env file, the env the request reads.

    `honoured`: the NVIDIA_* values of the hook's own environment to append
    to the env file (`honoured_env`).
    """

    pid: int
    rootfs: str
    environ_path: str
    env: tuple[tuple[str, str], ...]
    honoured: tuple[tuple[str, str], ...]


def documents(environ: Mapping[str, str]) -> EnrootDocs:
    """The container as enroot describes it to its hook (`environ`: the hook's own environment)."""
    pid, rootfs, environ_path = enroot_facts(environ)
    file_env = read_environ(environ_path)
    return EnrootDocs(pid, rootfs, environ_path, tuple(container_env(file_env, environ).items()),
                      honoured_env(file_env, environ))
