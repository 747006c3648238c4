"""Reading a process's device cgroup: version, devices path, v1 rules, Slurm job/step.

The hook needs three answers about the container's init process before it
touches device access (libnvidia-container `src/cgroup.c`; docs/slurm.md):
which cgroup layout the host uses (v1, v2 or hybrid: v1 controllers plus a
cgroup2 mount), where that process's devices cgroup lives on the host, and
whether it sits in a Slurm job/step cgroup — in which case Slurm's rules are
authoritative and we must not widen them.  On v1 we can also tell which GPU
minors the process may open by reading `devices.list`; on v2 the rules live
in eBPF programs we do not decode, so the answer is None ("cannot tell").

The parsers take text and are pure; the `read_*` functions are thin readers
under a given proc-root.  Nothing here writes; writing rules is apply/devcgroup.py's job.
"""

from __future__ import annotations

import posix

from pyxis_hook import pathnames
from pyxis_hook.record import record
from pyxis_hook.rootfs import PROC_LIMIT, read_to_end


@record
class CgroupLine:
    """One line of /proc/<pid>/cgroup: `hierarchy-id:controller,list:path` (v2: `0::path`)."""

    hierarchy: int
    controllers: tuple[str, ...]
    path: str


@record
class MountInfo:
    """The fields of a /proc/<pid>/mountinfo line we need (octal escapes decoded)."""

    mount_id: int
    parent_id: int
    root: str
    mount_point: str
    fstype: str
    source: str
    super_options: tuple[str, ...]


@record
class DeviceRule:
    """A v1 `devices.list` entry: type a/b/c, major/minor (None = `*`), access subset of 'rwm'."""

    type: str
    major: int | None
    minor: int | None
    access: str

    def matches(self, type_: str, major: int, minor: int) -> bool:
        return ((self.type == "a" or self.type == type_)
                and (self.major is None or self.major == major)
                and (self.minor is None or self.minor == minor))


@record
class DeviceCgroup:
    """Where a process's device access is decided.

    `version` is the host layout ("v1", "v2" or "hybrid"); `controller` is
    "v1" when a v1 devices controller governs the process (also on hybrid
    hosts) and "v2" when eBPF programs on the cgroup2 directory do.  `path` is
    the cgroup path as /proc/<pid>/cgroup shows it; `fs_path` the host
    directory of that cgroup (None when no matching mount was found).
    """

    version: str
    controller: str
    path: str
    fs_path: str | None


@record
class SlurmCgroup:
    """A Slurm job/step cgroup: job id, step ("0", "batch", "extern", "interactive"...), task if any."""

    job: int
    step: str
    task: str | None = None
    uid: int | None = None


# ------------------------------------------------------------------ parsers


def parse_proc_cgroup(text: str) -> tuple[CgroupLine, ...]:
    """Lines of /proc/<pid>/cgroup; malformed lines are skipped (the path may contain ':')."""
    out = []
    for line in text.splitlines():
        hid, sep1, rest = line.partition(":")
        ctrls, sep2, path = rest.partition(":")
        if not (sep1 and sep2 and hid.isdigit()):
            continue
        out.append(CgroupLine(int(hid), tuple(filter(None, ctrls.split(","))), path))
    return tuple(out)


_OCTAL = r"\\([0-7]{3})"


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (`\\040` for a space); `re` is imported only for a field that has one."""
    if "\\" not in field:
        return field
    import re

    return re.sub(_OCTAL, lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str, fstypes: frozenset[str] | None = None) -> tuple[MountInfo, ...]:
    """Lines of mountinfo: `id parent maj:min root point opts [optional...] - fstype source superopts`.

    `fstypes`: only mounts of these types become records.  A node's mountinfo
    can hold thousands of lines (Kubernetes, Lustre, per-job bind mounts), and
    a start that probes for the cgroup mounts should not make a record of each.
    """
    out = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        rf = right.split()
        if fstypes is not None and (not rf or rf[0] not in fstypes):
            continue
        lf = left.split()
        if len(lf) < 6 or len(rf) < 2 or not (lf[0].isdigit() and lf[1].isdigit()):
            continue
        out.append(MountInfo(int(lf[0]), int(lf[1]), _unescape(lf[3]), _unescape(lf[4]), rf[0],
                             _unescape(rf[1]), tuple(rf[2].split(",")) if len(rf) > 2 else ()))
    return tuple(out)


def cgroup_version(lines: tuple[CgroupLine, ...]) -> str | None:
    """"v1", "v2" or "hybrid" from a process's cgroup lines (None when there are none).

    A v1 controller line (or a named v1 hierarchy such as name=systemd) plus a
    `0::` line is hybrid; only `0::` is v2; only v1 lines is v1.
    """
    has_v2 = any(ln.hierarchy == 0 and not ln.controllers for ln in lines)
    has_v1 = any(ln.hierarchy != 0 for ln in lines)
    if has_v1 and has_v2:
        return "hybrid"
    if has_v2:
        return "v2"
    if has_v1:
        return "v1"
    return None


def _fs_path(mount: MountInfo, path: str) -> str | None:
    """Host directory of cgroup `path` inside a hierarchy mounted with root `mount.root`.

    LNC rejects a mount whose root starts with "/.." (a cgroup namespace
    looking above itself): no sane host path exists for it.
    """
    root = mount.root
    if root.startswith("/.."):
        return None
    if root != "/":
        if path != root and not path.startswith(root.rstrip("/") + "/"):
            return None
        path = path[len(root):] or "/"
    return pathnames.join(mount.mount_point, path.lstrip("/")).rstrip("/") or "/"


_CGROUP_FSTYPES = frozenset({"cgroup", "cgroup2"})


def devices_cgroup(cgroup_text: str, mountinfo_text: str) -> DeviceCgroup | None:
    """The devices cgroup of a process from its cgroup file and the reader's mountinfo; None = no cgroups."""
    lines = parse_proc_cgroup(cgroup_text)
    version = cgroup_version(lines)
    if version is None:
        return None
    v1 = next((ln for ln in lines if "devices" in ln.controllers), None)
    if v1 is not None:
        m = _first_mount(mountinfo_text, "devices", lambda m: m.fstype == "cgroup" and "devices" in m.super_options)
        return DeviceCgroup(version, "v1", v1.path, _fs_path(m, v1.path) if m else None)
    v2 = next((ln for ln in lines if ln.hierarchy == 0 and not ln.controllers), None)
    if v2 is None:
        return None  # v1 host whose devices controller is not mounted/enabled
    m = _first_mount(mountinfo_text, "cgroup2", lambda m: m.fstype == "cgroup2")
    return DeviceCgroup(version, "v2", v2.path, _fs_path(m, v2.path) if m else None)


def _first_mount(mountinfo_text: str, word: str, wanted) -> MountInfo | None:
    """The first cgroup mount of `mountinfo_text` that is `wanted`; only the lines naming `word` are parsed.

    `word` is in the line of every mount `wanted` takes (the hierarchy's
    controller among its super options, or its type): a start parses the
    one line it needs, not a record per cgroup mount (a v1 host has a dozen).
    """
    for line in mountinfo_text.splitlines():
        if word in line:
            for m in parse_mountinfo(line, _CGROUP_FSTYPES):
                if wanted(m):
                    return m
    return None


def parse_devices_list(text: str) -> tuple[DeviceRule, ...]:
    """Entries of a v1 `devices.list` (`c 195:0 rw`, `a *:* rwm`); malformed lines skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[0] not in ("a", "b", "c"):
            continue
        major, sep, minor = parts[1].partition(":")
        if not sep:
            continue
        try:
            ma = None if major == "*" else int(major)
            mi = None if minor == "*" else int(minor)
        except ValueError:
            continue
        out.append(DeviceRule(parts[0], ma, mi, parts[2]))
    return tuple(out)


def allowed_minors(rules: tuple[DeviceRule, ...], major: int, candidates, access: str = "rw") -> frozenset[int]:
    """Which of `candidates` (char minors of `major`) the rules allow with every letter of `access`.

    v1 shows a default-allow cgroup as `a *:* rwm` (its deny exceptions are
    not listed by the kernel), so that case reads as "all allowed".  The
    NVIDIA driver opens /dev/nvidia<N> read-write, hence "rw" by default.
    """
    out = set()
    for minor in candidates:
        granted = set()
        for r in rules:
            if r.matches("c", major, minor):
                granted |= set(r.access)
        if set(access) <= granted:
            out.add(minor)
    return frozenset(out)


_SLURM_V1 = r"/slurm(?:_[^/]+)?/uid_(\d+)/job_(\d+)/step_([^/]+)(?:/task_([^/]+))?"
_SLURM_V2 = r"/(?:[^/]+_)?slurmstepd\.scope/job_(\d+)/step_([^/]+)(?:/user/task_([^/]+))?"


def slurm_cgroup(path: str) -> SlurmCgroup | None:
    """Slurm job/step of a cgroup path, v1 `/slurm[_<node>]/uid_<u>/job_<j>/step_<s>[/task_<t>]` or
    v2 `.../[<node>_]slurmstepd.scope/job_<j>/step_<s>[/user/task_<t>]`; None when it is not one.

    Paths that stop at the job level (a job's extern processes, the job
    directory itself) are not step cgroups and give None.
    """
    # both forms name it: no `re` import outside Slurm (docs/decisions/2026-12-07-start-costs.md)
    if "slurm" not in path:
        return None
    import re

    m = re.search(_SLURM_V1, path)
    if m:
        return SlurmCgroup(int(m.group(2)), m.group(3), m.group(4), int(m.group(1)))
    m = re.search(_SLURM_V2, path)
    if m:
        return SlurmCgroup(int(m.group(1)), m.group(2), m.group(3))
    return None


def slurm_of_lines(lines: tuple[CgroupLine, ...]) -> SlurmCgroup | None:
    """Slurm step from a process's cgroup lines: the devices line first, then 0::, then any other."""
    order = sorted(lines, key=lambda ln: (0 if "devices" in ln.controllers else
                                          1 if ln.hierarchy == 0 else 2))
    for ln in order:
        found = slurm_cgroup(ln.path)
        if found:
            return found
    return None


# ------------------------------------------------------------------ thin readers


def read_text(path: str) -> str | None:
    """A small procfs/cgroupfs text file, None when it cannot be read (a process gone, no controller).

    What `open(path).read()` gives, decoded as UTF-8 with replacement, read
    with `posix` calls (`rootfs.read_to_end`: a GPU start reads five).
    """
    try:
        return read_to_end(posix.open(path, posix.O_RDONLY | posix.O_CLOEXEC), PROC_LIMIT).decode("utf-8", "replace")
    except OSError:
        return None


def read_devices_cgroup(proc_root: str, pid: int | str, mountinfo_pid: int | str = "self") -> DeviceCgroup | None:
    """`devices_cgroup` of `<proc-root>/<pid>/cgroup`, with mounts as `mountinfo_pid` (the hook) sees them."""
    cg = read_text(pathnames.join(proc_root, str(pid), "cgroup"))
    if cg is None:
        return None
    mi = read_text(pathnames.join(proc_root, str(mountinfo_pid), "mountinfo")) or ""
    return devices_cgroup(cg, mi)


def read_slurm_cgroup(proc_root: str, pid: int | str) -> SlurmCgroup | None:
    """The Slurm step whose cgroup holds process `pid`, from the kernel's record (not from env)."""
    cg = read_text(pathnames.join(proc_root, str(pid), "cgroup"))
    return slurm_of_lines(parse_proc_cgroup(cg)) if cg is not None else None


def _v1_devices_dir(proc_root: str, pid: int | str, mountinfo_pid: int | str,
                    mountinfo: str | None = None) -> DeviceCgroup | None:
    """The v1 devices cgroup of `pid` with a host directory; None on v2, without cgroups or mount.

    `mountinfo`: `mountinfo_pid`'s mount table when the caller has read it already."""
    cg = read_text(pathnames.join(proc_root, str(pid), "cgroup"))
    if cg is None or "devices" not in cg:  # no v1 devices controller: skip reading all of mountinfo
        return None
    if mountinfo is None:
        mountinfo = read_text(pathnames.join(proc_root, str(mountinfo_pid), "mountinfo"))
    dc = devices_cgroup(cg, mountinfo or "")
    if dc is None or dc.controller != "v1" or dc.fs_path is None:
        return None
    return dc


def _minors_of(directory: str, candidates, major: int) -> frozenset[int] | None:
    text = read_text(pathnames.join(directory, "devices.list"))
    return None if text is None else allowed_minors(parse_devices_list(text), major, candidates)


def gpu_minors_allowed(proc_root: str, pid: int | str, candidates, nvidia_major: int = 195,
                       mountinfo_pid: int | str = "self") -> frozenset[int] | None:
    """Which of `candidates` GPU minors process `pid` may open; None = cannot tell.

    "Cannot tell" covers v2 (eBPF rules we do not decode), a process without
    a readable cgroup, and a devices hierarchy we cannot find or read.
    """
    dc = _v1_devices_dir(proc_root, pid, mountinfo_pid)
    return None if dc is None or dc.fs_path is None else _minors_of(dc.fs_path, candidates, nvidia_major)


@record
class GpuBound:
    """The GPU minors a container may be given, and which device cgroup said so (for the log).

    `task_minors` is set when a Slurm task's own cgroup allowed fewer GPUs
    than its step's and the step's list won (`minors`).
    """

    minors: frozenset[int]
    source: str
    task_minors: frozenset[int] | None = None


def step_dir(task_dir: str, slurm: SlurmCgroup) -> str | None:
    """The host directory of the step cgroup above task cgroup `task_dir` (v1 `step_S/task_T`,
    v2 `step_S/user/task_T`, Slurm's `src/plugins/cgroup/v1` and `v2`); None when it is not below one."""
    marker = f"/step_{slurm.step}/"
    at = task_dir.rfind(marker)
    return None if at < 0 or slurm.task is None else task_dir[:at + len(marker) - 1]


def gpu_bound(proc_root: str, pid: int | str, candidates, nvidia_major: int = 195,
              mountinfo_pid: int | str = "self", mountinfo: str | None = None) -> GpuBound | None:
    """The GPU minors for a container started by process `pid`; None = cannot tell (as `gpu_minors_allowed`).

    Pyxis starts one container per node for all the tasks of a step, from
    whichever task comes first.  Under `--gpus-per-task` and
    `ConstrainDevices=yes` that task's cgroup (`.../step_S/task_T`) allows
    only its own GPU, while the step's cgroup above it allows every GPU of
    the step on this node (Slurm's `task_cgroup_devices.c` writes both).
    The container must hold the step's GPUs: each task's own cgroup still
    confines that task.  So a task cgroup's list is widened to its step's.
    `mountinfo`: as `_v1_devices_dir`'s.
    """
    dc = _v1_devices_dir(proc_root, pid, mountinfo_pid, mountinfo)
    if dc is None or dc.fs_path is None:
        return None
    own = _minors_of(dc.fs_path, candidates, nvidia_major)
    if own is None:
        return None
    slurm = slurm_cgroup(dc.path)
    step = step_dir(dc.fs_path, slurm) if slurm is not None else None
    wider = _minors_of(step, candidates, nvidia_major) if step is not None else None
    if slurm is not None and wider is not None and wider > own:
        return GpuBound(wider, f"GPUs from the step's device cgroup (step_{slurm.step}) over the task's "
                               f"(task_{slurm.task})", own)
    return GpuBound(own, "GPUs from the device cgroup")
