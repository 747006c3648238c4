"""host/cgroup.py: layout detection, devices path, v1 rules, Slurm step detection.

Fixture texts are copied from the shapes real hosts print (v1 under Slurm,
v2 under systemd, hybrid like our CI machine); one test reads this
machine's own /proc/self/cgroup, and a root test builds a real v1 devices
cgroup and asks which GPU minors a process in it may open.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxis_hook.host import cgroup
from pyxis_hook.host.cgroup import (
    CgroupLine,
    DeviceRule,
    GpuBound,
    SlurmCgroup,
    allowed_minors,
    cgroup_version,
    devices_cgroup,
    gpu_bound,
    gpu_minors_allowed,
    parse_devices_list,
    parse_mountinfo,
    parse_proc_cgroup,
    read_devices_cgroup,
    read_slurm_cgroup,
    slurm_cgroup,
    slurm_of_lines,
    step_dir,
)

V1_SLURM_CGROUP = """\
11:pids:/system.slice/slurmd.service
10:devices:/slurm/uid_1000/job_42/step_0/task_1
9:freezer:/slurm/uid_1000/job_42/step_0
8:memory:/slurm/uid_1000/job_42/step_0/task_1
4:cpu,cpuacct:/slurm/uid_1000/job_42/step_0/task_1
1:name=systemd:/system.slice/slurmd.service
"""

V1_MOUNTINFO = """\
25 20 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
30 25 0:27 / /sys/fs/cgroup/devices rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,devices
31 25 0:28 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,cpu,cpuacct
"""

V2_SLURM_CGROUP = "0::/system.slice/node7_slurmstepd.scope/job_1234/step_batch/user/task_0\n"

V2_MOUNTINFO = """\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw
27 22 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
"""

HYBRID_CGROUP = """\
9:name=systemd:/
5:devices:/docker/abc
1:cpu:/
0::/
"""

HYBRID_MOUNTINFO = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""


def test_parse_proc_cgroup_keeps_colons_in_path():
    lines = parse_proc_cgroup("4:cpu,cpuacct:/a:b\n0::/\nbogus\n")
    assert lines == (CgroupLine(4, ("cpu", "cpuacct"), "/a:b"), CgroupLine(0, (), "/"))


def test_parse_mountinfo_optional_fields_and_escapes():
    text = (r"30 25 0:27 / /sys/fs/cgroup/dev\040ices rw shared:14 master:3 - cgroup cgroup rw,devices" "\n"
            "garbage line\n")
    (m,) = parse_mountinfo(text)
    assert (m.mount_id, m.parent_id, m.root, m.mount_point, m.fstype, m.source) == (
        30, 25, "/", "/sys/fs/cgroup/dev ices", "cgroup", "cgroup")
    assert m.super_options == ("rw", "devices")


def test_parse_mountinfo_for_some_types_is_the_full_parse_filtered():
    """The cgroup lookup reads only the cgroup mounts: the same records, none of the rest."""
    text = Path("/proc/self/mountinfo").read_text() + V1_MOUNTINFO + "garbage - \n"
    want = frozenset({"cgroup", "cgroup2"})
    full = parse_mountinfo(text)
    assert parse_mountinfo(text, want) == tuple(m for m in full if m.fstype in want)
    assert parse_mountinfo(text, frozenset()) == ()


@pytest.mark.parametrize("text,version", [
    (V1_SLURM_CGROUP, "v1"), (V2_SLURM_CGROUP, "v2"), (HYBRID_CGROUP, "hybrid"), ("", None)])
def test_version(text, version):
    assert cgroup_version(parse_proc_cgroup(text)) == version


def test_devices_cgroup_v1():
    dc = devices_cgroup(V1_SLURM_CGROUP, V1_MOUNTINFO)
    assert (dc.version, dc.controller, dc.path) == ("v1", "v1", "/slurm/uid_1000/job_42/step_0/task_1")
    assert dc.fs_path == "/sys/fs/cgroup/devices/slurm/uid_1000/job_42/step_0/task_1"


def test_devices_cgroup_v2():
    dc = devices_cgroup(V2_SLURM_CGROUP, V2_MOUNTINFO)
    assert (dc.version, dc.controller) == ("v2", "v2")
    assert dc.fs_path == "/sys/fs/cgroup/system.slice/node7_slurmstepd.scope/job_1234/step_batch/user/task_0"


def test_devices_cgroup_hybrid_uses_v1_devices():
    dc = devices_cgroup(HYBRID_CGROUP, HYBRID_MOUNTINFO)
    assert (dc.version, dc.controller, dc.fs_path) == ("hybrid", "v1", "/sys/fs/cgroup/devices/docker/abc")


def test_devices_cgroup_mount_root_inside_namespace():
    mi = "30 25 0:27 /docker/abc /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
    assert devices_cgroup("5:devices:/docker/abc/inner\n", mi).fs_path == "/sys/fs/cgroup/devices/inner"
    assert devices_cgroup("5:devices:/docker/abc\n", mi).fs_path == "/sys/fs/cgroup/devices"
    # a process outside the mounted subtree has no host directory here
    assert devices_cgroup("5:devices:/other\n", mi).fs_path is None
    # LNC rejects roots that look above the namespace
    mi2 = "30 25 0:27 /.. /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n"
    assert devices_cgroup("5:devices:/x\n", mi2).fs_path is None


def test_devices_cgroup_without_mount_or_controller():
    assert devices_cgroup(V1_SLURM_CGROUP, "").fs_path is None
    assert devices_cgroup("1:name=systemd:/\n", V1_MOUNTINFO) is None
    assert devices_cgroup("", V1_MOUNTINFO) is None


_MOUNT_LINES = [
    *V1_MOUNTINFO.splitlines(), *V2_MOUNTINFO.splitlines(), *HYBRID_MOUNTINFO.splitlines(),
    "40 25 0:29 /docker/abc /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices",  # a namespace's own root
    "41 25 0:30 / /devices rw - ext4 /dev/devices rw",  # names devices, is no cgroup
    "42 25 0:31 / /sys/fs/cgroup/dev\\040ices rw - cgroup cgroup rw,devices",  # an escaped point
    "43 25 0:32 / /sys/fs/cgroup/x rw - cgroup cgroup rw,devicesx",  # another option that contains the word
    "44 25 0:33 / /mnt/cgroup2 rw - tmpfs cgroup2 rw",  # a source named cgroup2
    "45 25 0:34 / /sys/fs/cgroup/v2 rw - cgroup2 cgroup2 rw",
    "bad line - cgroup cgroup rw,devices", "",
]


def _devices_cgroup_by_full_parse(cgroup_text: str, mountinfo_text: str):
    """`devices_cgroup` as it was written first: every cgroup mount parsed into a record, then the first wanted."""
    lines = parse_proc_cgroup(cgroup_text)
    version = cgroup_version(lines)
    if version is None:
        return None
    mounts = parse_mountinfo(mountinfo_text, frozenset({"cgroup", "cgroup2"}))
    v1 = next((ln for ln in lines if "devices" in ln.controllers), None)
    if v1 is not None:
        m = next((m for m in mounts if m.fstype == "cgroup" and "devices" in m.super_options), None)
        return cgroup.DeviceCgroup(version, "v1", v1.path, cgroup._fs_path(m, v1.path) if m else None)
    v2 = next((ln for ln in lines if ln.hierarchy == 0 and not ln.controllers), None)
    if v2 is None:
        return None
    m = next((m for m in mounts if m.fstype == "cgroup2"), None)
    return cgroup.DeviceCgroup(version, "v2", v2.path, cgroup._fs_path(m, v2.path) if m else None)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([V1_SLURM_CGROUP, V2_SLURM_CGROUP, HYBRID_CGROUP, "5:devices:/docker/abc/inner\n", "0::/x\n"]),
       st.lists(st.sampled_from(_MOUNT_LINES), max_size=8))
def test_devices_cgroup_parses_only_the_lines_it_needs_and_finds_what_the_full_parse_finds(cgroup_text, lines):
    """A start parses the one mountinfo line of the devices (or cgroup2) hierarchy: the same mount as parsing all."""
    mountinfo = "\n".join(lines)
    assert devices_cgroup(cgroup_text, mountinfo) == _devices_cgroup_by_full_parse(cgroup_text, mountinfo)


def test_devices_cgroup_makes_one_mount_record_on_a_v1_host(monkeypatch):
    """A v1 host's mountinfo has a line per controller: only the devices hierarchy's becomes a record."""
    made = []
    real = cgroup.MountInfo
    monkeypatch.setattr(cgroup, "MountInfo", lambda *a: made.append(a) or real(*a))
    assert devices_cgroup(HYBRID_CGROUP, V1_MOUNTINFO + HYBRID_MOUNTINFO).fs_path == "/sys/fs/cgroup/devices/docker/abc"
    assert len(made) == 1


def test_devices_list_and_allowed_minors():
    rules = parse_devices_list("c 1:3 rwm\nc 195:255 rw\nc 195:1 rw\nc 195:2 r\nc 195:* m\nb 195:3 rw\nbad\nc x:1 r\n")
    assert rules[0] == DeviceRule("c", 1, 3, "rwm")
    assert rules[4] == DeviceRule("c", 195, None, "m")
    assert len(rules) == 6
    assert allowed_minors(rules, 195, range(4)) == frozenset({1})
    assert allowed_minors(rules, 195, range(4), access="r") == frozenset({1, 2})
    everything = parse_devices_list("a *:* rwm\n")
    assert allowed_minors(everything, 195, [0, 7, 63]) == frozenset({0, 7, 63})
    assert allowed_minors((), 195, range(8)) == frozenset()


@pytest.mark.parametrize("path,expected", [
    ("/slurm/uid_1000/job_42/step_0/task_1", SlurmCgroup(42, "0", "1", 1000)),
    ("/slurm/uid_0/job_7/step_batch", SlurmCgroup(7, "batch", None, 0)),
    ("/slurm_node3/uid_5/job_9/step_extern/task_0", SlurmCgroup(9, "extern", "0", 5)),
    ("/system.slice/slurmstepd.scope/job_1234/step_0/user/task_3", SlurmCgroup(1234, "0", "3")),
    ("/system.slice/node7_slurmstepd.scope/job_1234/step_batch/user/task_0", SlurmCgroup(1234, "batch", "0")),
    ("/system.slice/slurmstepd.scope/job_5/step_interactive/slurm", SlurmCgroup(5, "interactive")),
    ("/system.slice/slurmstepd.scope/job_5", None),
    ("/slurm/uid_1000/job_42", None),
    ("/user.slice/user-1000.slice/session-3.scope", None),
    ("/", None),
])
def test_slurm_cgroup(path, expected):
    assert slurm_cgroup(path) == expected


def test_slurm_prefers_devices_line():
    lines = parse_proc_cgroup("3:freezer:/slurm/uid_1/job_1/step_0\n10:devices:/slurm/uid_1/job_2/step_3/task_0\n")
    assert slurm_of_lines(lines) == SlurmCgroup(2, "3", "0", 1)
    assert slurm_of_lines(parse_proc_cgroup(HYBRID_CGROUP)) is None


def _fake_proc(tmp_path: Path, pid: int, cgroup: str, mountinfo: str) -> str:
    d = tmp_path / "proc"
    (d / str(pid)).mkdir(parents=True)
    (d / str(pid) / "cgroup").write_text(cgroup)
    (d / "self").mkdir()
    (d / "self" / "mountinfo").write_text(mountinfo)
    return str(d)


def test_readers_on_a_fixture_proc(tmp_path):
    proc = _fake_proc(tmp_path, 77, V1_SLURM_CGROUP, V1_MOUNTINFO)
    assert read_slurm_cgroup(proc, 77) == SlurmCgroup(42, "0", "1", 1000)
    assert read_devices_cgroup(proc, 77).controller == "v1"
    assert read_devices_cgroup(proc, 78) is None
    assert read_slurm_cgroup(proc, 78) is None
    # the fixture's /sys/fs/cgroup/devices/slurm/... does not exist on this machine: cannot tell
    assert gpu_minors_allowed(proc, 77, range(4)) is None


def test_v2_cannot_tell(tmp_path):
    proc = _fake_proc(tmp_path, 5, V2_SLURM_CGROUP, V2_MOUNTINFO)
    assert read_devices_cgroup(proc, 5).controller == "v2"
    assert gpu_minors_allowed(proc, 5, range(4)) is None


def test_this_machines_own_cgroup():
    lines = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    assert lines, "a Linux process always has a cgroup line"
    dc = read_devices_cgroup("/proc", "self")
    version = cgroup_version(lines)
    assert version in ("v1", "v2", "hybrid")
    if dc is not None:
        assert dc.version == version
        if dc.fs_path is not None:
            assert os.path.isdir(dc.fs_path)
    # whatever this machine is, its test runner is not a Slurm step
    if not os.environ.get("SLURM_JOB_ID"):
        assert read_slurm_cgroup("/proc", "self") is None


def _v1_devices_mount() -> str | None:
    for m in parse_mountinfo(Path("/proc/self/mountinfo").read_text()):
        if m.fstype == "cgroup" and "devices" in m.super_options and m.root == "/":
            return m.mount_point
    return None




# ------------------------------------------------------------------ per-task binding
# `srun -N2 -n4 --gpus-per-task=1` with ConstrainDevices=yes (cgroup/v1): the task bound to GPU 1
# sits in .../step_0/task_1, whose devices.list allows only 195:1; step_0's allows 195:0 and 195:1.

def _slurm_tree(tmp_path: Path, step_rules: str | None, task_rules: str | None, task: bool = True) -> str:
    """A fake /proc whose process 9 sits in a Slurm v1 step (and task) cgroup under tmp_path/cg."""
    step = tmp_path / "cg/slurm/uid_1000/job_42/step_0"
    leaf = step / "task_1" if task else step
    leaf.mkdir(parents=True)
    if step_rules is not None:
        (step / "devices.list").write_text(step_rules)
    if task and task_rules is not None:
        (leaf / "devices.list").write_text(task_rules)
    path = "/slurm/uid_1000/job_42/step_0" + ("/task_1" if task else "")
    mountinfo = f"30 25 0:27 / {tmp_path / 'cg'} rw,nosuid - cgroup cgroup rw,devices\n"
    return _fake_proc(tmp_path, 9, f"10:devices:{path}\n4:cpu,cpuacct:{path}\n", mountinfo)


STEP_RULES = "c 136:* rwm\nc 195:0 rw\nc 195:1 rw\nc 195:255 rw\n"
TASK_RULES = "c 136:* rwm\nc 195:1 rw\nc 195:255 rw\n"


def test_task_cgroup_widened_to_its_steps(tmp_path):
    proc = _slurm_tree(tmp_path, STEP_RULES, TASK_RULES)
    bound = gpu_bound(proc, 9, range(4))
    assert bound == GpuBound(frozenset({0, 1}), "GPUs from the step's device cgroup (step_0) over the task's "
                             "(task_1)", frozenset({1}))
    # the process's own cgroup is still what gpu_minors_allowed (doctor's check) reports
    assert gpu_minors_allowed(proc, 9, range(4)) == frozenset({1})


def test_task_cgroup_equal_to_its_step_is_its_own(tmp_path):
    proc = _slurm_tree(tmp_path, STEP_RULES, STEP_RULES)
    assert gpu_bound(proc, 9, range(4)) == GpuBound(frozenset({0, 1}), "GPUs from the device cgroup")


def test_step_without_task_cgroups_unchanged(tmp_path):
    proc = _slurm_tree(tmp_path, TASK_RULES, None, task=False)
    assert gpu_bound(proc, 9, range(4)) == GpuBound(frozenset({1}), "GPUs from the device cgroup")


def test_unreadable_step_list_keeps_the_tasks(tmp_path):
    proc = _slurm_tree(tmp_path, None, TASK_RULES)
    assert gpu_bound(proc, 9, range(4)) == GpuBound(frozenset({1}), "GPUs from the device cgroup")


def test_gpu_bound_cannot_tell_on_v2(tmp_path):
    assert gpu_bound(_fake_proc(tmp_path, 5, V2_SLURM_CGROUP, V2_MOUNTINFO), 5, range(4)) is None


@pytest.mark.parametrize("task_dir, slurm, expected", [
    ("/sys/fs/cgroup/devices/slurm/uid_1/job_7/step_0/task_3", SlurmCgroup(7, "0", "3", 1),
     "/sys/fs/cgroup/devices/slurm/uid_1/job_7/step_0"),
    ("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_2/user/task_0", SlurmCgroup(7, "2", "0"),
     "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7/step_2"),
    ("/sys/fs/cgroup/devices/slurm/uid_1/job_7/step_0", SlurmCgroup(7, "0", None, 1), None),
])
def test_step_dir(task_dir, slurm, expected):
    assert step_dir(task_dir, slurm) == expected


def test_read_text_reads_a_procfs_file_whole_as_open_does(tmp_path):
    """procfs hands out a page or so per read: the whole file comes back, decoded as `open().read()` would."""
    from pyxis_hook.host.cgroup import read_text

    for path in ("/proc/self/mountinfo", "/proc/self/cgroup"):
        assert read_text(path) == Path(path).read_text(errors="replace")
    big = tmp_path / "big"
    big.write_bytes(b"x\xff" * 100_000)  # past one read, and not UTF-8
    assert read_text(str(big)) == big.read_text(errors="replace")
    assert read_text(str(tmp_path / "missing")) is None and read_text(str(tmp_path)) is None
