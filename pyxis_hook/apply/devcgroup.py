"""The container's v1 device cgroup rules: devices.allow opened on the host, written by apply's child.

The plan says which rules a container needs and whether to write any
(`cgroup_mode`); here the file is found and opened before anything is
mounted (`open_allow`), so a cgroup that cannot be written fails the start
with nothing to undo, and the child writes the rules through that fd after
the mounts and links (`write_rules`): a rule the kernel refuses undoes them
like any other failure.  A v1 rule cannot be taken back, which is why it
comes after everything that can.  A cgroup v2 container's device access is
the runtime's eBPF program, which a hook cannot change.  A hook in a user
namespace (rootless podman) writes none: the kernel takes v1 device rules
only from CAP_SYS_ADMIN in the initial user namespace.
"""

from __future__ import annotations

import posix

from pyxis_hook import pathnames, userns
from pyxis_hook.errors import ApplyError
from pyxis_hook.plan.build import Plan


def rules_text(plan: Plan) -> str:
    """The plan's rules as devices.allow lines, joined for a message."""
    return ", ".join(f"{r.type} {r.major}:{r.minor} {r.access}" for r in plan.cgroup_rules)


def open_allow(plan: Plan, pid, proc: str, fds: list[int], messages: list[str]) -> tuple[int, str] | None:
    """The container's v1 devices.allow, opened (fd, path); None with a message when no rule is written.

    Done before anything is mounted, so a cgroup that cannot be written
    fails the start with nothing to undo.  Never from a user namespace
    (the kernel would refuse every rule), never inside a Slurm job: the
    step's cgroup is the boundary Slurm computed, and the container's
    cgroup below it inherits it; rules we wrote there could only try to
    widen it (docs/slurm.md).
    """
    from pyxis_hook.host import cgroup

    rules = rules_text(plan)
    if plan.cgroup_mode == "none":
        messages.append(f"device cgroup: not modified (no-cgroups = true): {rules}")
        return None
    if plan.cgroup_mode != "auto":
        raise ApplyError(f"device cgroup: unknown cgroup_mode {plan.cgroup_mode!r} in plan")
    if userns.in_user_namespace():
        messages.append(f"device cgroup: not modified: the hook runs in a user namespace (a rootless runtime), "
                        f"where the kernel refuses device rules; the container has the devices its cgroup allows: {rules}")
        return None
    if not pathnames.exists(f"{proc}/{pid}/cgroup"):
        raise ApplyError(f"{proc}/{pid}/cgroup: no such process")
    slurm = cgroup.read_slurm_cgroup(proc, pid)
    if slurm is not None:
        messages.append(f"device cgroup: not modified: the container is inside Slurm job {slurm.job} "
                        f"step {slurm.step}, whose device cgroup is authoritative")
        return None
    dev = cgroup.read_devices_cgroup(proc, pid)
    if dev is None or dev.controller != "v1":
        if dev is not None and dev.controller == "v2":
            messages.append(f"device cgroup v2: not modified; the runtime must allow {rules} "
                            "(config.json linux.resources.devices, or use CDI)")
        else:
            messages.append(f"device cgroup: no devices controller for pid {pid}: not modified")
        return None
    if dev.fs_path is None:
        raise ApplyError(f"device cgroup {dev.path}: no cgroup v1 devices mount in {proc}/self/mountinfo")
    allow = f"{dev.fs_path}/devices.allow"
    try:
        fd = posix.open(allow, posix.O_WRONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC)
    except OSError as e:
        raise ApplyError(f"{allow}: cannot allow {rules}: {e.strerror}") from None
    fds.append(fd)
    return fd, allow


def write_rules(plan: Plan, fd: int, allow: str) -> str:
    """Write the plan's rules into the opened v1 devices.allow (one rule per write, as the kernel parses)."""
    for r in plan.cgroup_rules:
        rule = f"{r.type} {r.major}:{r.minor} {r.access}"
        try:
            posix.write(fd, rule.encode())
        except OSError as e:
            raise ApplyError(f"{allow}: cannot allow {rule}: {e.strerror}") from None
    return f"device cgroup v1 {pathnames.dirname(allow)}: allowed {rules_text(plan)}"
