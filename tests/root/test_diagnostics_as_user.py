"""Root tests: the diagnostics (`info`, `list`, `plan`, `ldcheck`, `doctor`) run by an ordinary user.

The node is laid out as an admin installs it: the package a root-owned copy
any user reads, run by the node's own python3; a pyxis.conf any user reads,
whose log file and snapshot-dir only root may write; the node artifact built
by root (`refresh`).  Root and uid `USER` run each command with `--json` on
the same fake host (the fixtures of the commands' unit tests): the documents
are the same, except where the user cannot do what root does (each case
asserted and explained below).  The user's runs print no warning (none about
the log file) and write nothing: not the artifact, not the start image, not
the log file, nothing anywhere the user may write.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fixtures.container import make_bundle, make_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import make_host_tree
from fixtures.pyxiscluster import USER, hook_command, install_package
from fixtures.standin import tree_state

pytestmark = pytest.mark.root
VERSION = "535.104.05"
#: the places an ordinary user may write on this machine, searched for anything the user's run made
WRITABLE = ("/tmp", "/var/tmp", "/dev/shm")

if os.geteuid() != 0:
    pytest.skip("needs root (setuid, mknod, a root-owned install)", allow_module_level=True)


@pytest.fixture(scope="module")
def node():
    """(base dir, installed package, pyxis.conf, bundle) of a node set up by root; the artifact refreshed."""
    base = Path(tempfile.mkdtemp(prefix="pyxis-diag-user-", dir="/tmp"))
    os.chmod(base, 0o755)  # any user walks to the node's files, as on a node (pytest's own dir is root's alone)
    try:
        driver = make_fake_driver(base / "driver", VERSION)
        host = make_host_tree(base / "host", driver_version=VERSION, make_nodes=True)
        package = install_package(base / "site")
        (base / "etc").mkdir(mode=0o755)
        (base / "log").mkdir(mode=0o755)  # root's: no other user may create the log file in it
        conf = base / "etc/pyxis.conf"
        conf.write_text(f'driver-root = "{driver}"\nproc-root = "{host.proc_root}"\ndev-root = "{host.dev_root}"\n'
                        f'snapshot-dir = "{base / "snap"}"\nlog-file = "{base / "log/hook.log"}"\n'
                        'log-level = "debug"\nno-cgroups = true\n')
        os.chmod(conf, 0o644)
        bundle = base / "bundle"
        make_rootfs(bundle / "rootfs", gputest=False)
        make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"))
        for d, _dirs, _files in os.walk(base):
            assert os.stat(d).st_mode & 0o005 == 0o005 or os.path.islink(d), d
        r = _run(package, conf, "refresh")
        assert r.returncode == 0, r.stderr
        yield base, package, conf, bundle
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _run(package: Path, conf: Path, *args: str, user: int | None = None, home: Path | None = None,
         wrap: tuple[str, ...] = ()):
    """`pyxis-hook --config CONF ARGS` as the node runs it, as root or as `user` (HOME, TMPDIR, cwd: `home`),
    after `wrap` (e.g. unshare)."""
    argv = [*wrap, *hook_command(package, "--config", str(conf), *args)]
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    if user is not None:
        argv = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", *argv]
        env.update(HOME=str(home), TMPDIR=str(home))
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=str(home or "/"), env=env)


def _home(base: Path, name: str) -> Path:
    """An empty directory of the user's own (HOME, TMPDIR and cwd of its run)."""
    home = base / f"home-{name}"
    home.mkdir(mode=0o755)
    os.chown(home, USER, USER)
    return home


def _users_files() -> set[str]:
    """Every file the user owns in the places the user may write."""
    out = subprocess.run(["find", *WRITABLE, "-xdev", "-user", str(USER)], capture_output=True, text=True)
    return set(out.stdout.split())


#: the command lines compared; BUNDLE and ROOTFS are the node's bundle and its rootfs
COMMANDS = {
    "info": ("info", "--json"),
    "list": ("list", "--json", "--devices", "1", "--capabilities", "compute,utility"),
    "plan": ("plan", "--bundle", "BUNDLE", "--json"),
    "ldcheck": ("ldcheck", "ROOTFS", "--env", "NVIDIA_VISIBLE_DEVICES=all", "--json"),
    "doctor": ("doctor", "--json"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_user_gets_roots_answer_and_writes_nothing(node, command):
    base, package, conf, bundle = node
    args = [{"BUNDLE": str(bundle), "ROOTFS": str(bundle / "rootfs")}.get(a, a) for a in COMMANDS[command]]
    as_root = _run(package, conf, *args)
    assert as_root.returncode == 0, as_root.stdout + as_root.stderr
    log = base / "log/hook.log"
    assert log.is_file() and log.stat().st_uid == 0 and log.stat().st_mode & 0o022 == 0  # only root writes it
    home = _home(base, command)
    watched = {p: tree_state(p) for p in (base / "snap", package.parent, base / "etc", base / "log", bundle)}
    mine = _users_files()
    as_user = _run(package, conf, *args, user=USER, home=home)
    assert as_user.returncode == as_root.returncode, as_user.stdout + as_user.stderr
    assert as_user.stderr == ""  # no warning: not about the log file, not about the artifact
    assert {p: tree_state(p) for p in watched} == watched
    assert os.listdir(home) == [] and _users_files() - mine == set()
    root_doc, user_doc = json.loads(as_root.stdout), json.loads(as_user.stdout)
    if command == "doctor":
        # the start image is written by the package's owner at a GPU start (none ran here): root is told
        # its next GPU start writes it, the user that only the owner does; neither is a warning
        root_doc, root_image = _without(root_doc, "start-image")
        user_doc, user_image = _without(user_doc, "start-image")
        assert [(f["code"], f["severity"]) for f in root_image] == [("start-image-pending", "info")]
        assert [(f["code"], f["severity"]) for f in user_image] == [("start-image-unwritable", "info")]
        assert root_image[0]["what"].split(":")[0] == user_image[0]["what"].split(":")[0]  # the same file
        assert "node-artifact" in [f["code"] for f in user_doc["findings"]]  # root's artifact, trusted by the user
    assert user_doc == root_doc


def _without(doc: dict, prefix: str) -> tuple[dict, list[dict]]:
    """`doc` without the findings whose code starts with `prefix`, and those findings."""
    keep = [f for f in doc["findings"] if not f["code"].startswith(prefix)]
    return {**doc, "findings": keep}, [f for f in doc["findings"] if f["code"].startswith(prefix)]


def test_root_of_a_users_namespace_gets_the_users_answers(node):
    """Root of a user namespace the user made (`0 UID 1`, enroot's --container-remap-root) owns nothing of the
    node's: root's files and the package show as the overflow uid, the artifact is still trusted, and doctor
    answers as to the user (no warning that the start image is not written: that is not its to write)."""
    base, package, conf, _bundle = node
    as_user = _run(package, conf, "doctor", "--json", user=USER, home=_home(base, "ns-user"))
    in_ns = _run(package, conf, "doctor", "--json", user=USER, home=_home(base, "ns-root"),
                 wrap=("unshare", "--user", "--map-root-user"))
    assert in_ns.returncode == as_user.returncode == 0 and in_ns.stderr == "", in_ns.stderr
    assert json.loads(in_ns.stdout) == json.loads(as_user.stdout)


def test_a_log_file_root_has_not_made_yet_is_no_warning_for_a_user(node):
    """On a node where no root command ran yet the user's run is denied creating it: no warning, no file."""
    base, package, conf, _bundle = node
    fresh = base / "etc/fresh.conf"
    fresh.write_text(conf.read_text().replace(str(base / "log/hook.log"), str(base / "log/fresh.log")))
    os.chmod(fresh, 0o644)
    home = _home(base, "fresh")
    as_user = _run(package, fresh, "info", "--json", user=USER, home=home)
    assert as_user.returncode == 0 and as_user.stderr == ""
    assert json.loads(as_user.stdout)["usable"] and not (base / "log/fresh.log").exists()
    as_root = _run(package, fresh, "info", "--json")
    assert as_root.returncode == 0 and as_root.stderr == ""
    assert (base / "log/fresh.log").stat().st_uid == 0  # root's run made it


def test_ldcheck_of_a_process_the_user_may_not_see_says_so_in_one_line(node):
    """`ldcheck --pid` of root's process: root reads its root and environment, the user is told it may not."""
    base, package, conf, bundle = node
    real = base / "etc/real-proc.conf"  # the process lives in the real /proc
    real.write_text(conf.read_text().replace(f'proc-root = "{base / "host/proc"}"', 'proc-root = "/proc"'))
    os.chmod(real, 0o644)
    assert 'proc-root = "/proc"' in real.read_text()
    chroot = shutil.which("chroot") or "/usr/sbin/chroot"
    proc = subprocess.Popen([chroot, str(bundle / "rootfs"), "/bin/sh", "-c", "read x"], stdin=subprocess.PIPE,
                            env={"NVIDIA_VISIBLE_DEVICES": "all", "PATH": "/bin"})
    try:
        for _ in range(500):  # until chroot has exec'ed the shell inside the image
            if os.readlink(f"/proc/{proc.pid}/root") == str(bundle / "rootfs"):
                break
            time.sleep(0.01)
        as_root = _run(package, real, "ldcheck", "--pid", str(proc.pid), "--json")
        as_user = _run(package, real, "ldcheck", "--pid", str(proc.pid), "--json", user=USER,
                       home=_home(base, "pid"))
    finally:
        proc.communicate(b"\n", timeout=10)
    assert json.loads(as_root.stdout)["source"] == "pid"
    assert as_user.returncode == 2 and as_user.stdout == ""
    assert as_user.stderr == f"pyxis-hook: error: /proc/{proc.pid}/root: no such process or not allowed to see " \
                             "its root\n"


def test_plan_in_a_user_namespace_says_the_device_rules_are_not_written(node):
    """A start in a user namespace (a rootless runtime) writes no v1 device rule: `plan` run there says so."""
    base, package, conf, bundle = node
    cg = base / "etc/cgroups.conf"
    cg.write_text(conf.read_text().replace("no-cgroups = true\n", ""))
    os.chmod(cg, 0o644)
    as_root = _run(package, cg, "plan", "--bundle", str(bundle))
    in_ns = _run(package, cg, "plan", "--bundle", str(bundle), user=USER, home=_home(base, "plan-ns"),
                 wrap=("unshare", "--user", "--map-root-user"))
    assert as_root.returncode == in_ns.returncode == 0, as_root.stderr + in_ns.stderr
    root_line = next(line for line in as_root.stdout.splitlines() if line.startswith("device cgroup:"))
    ns_line = next(line for line in in_ns.stdout.splitlines() if line.startswith("device cgroup:"))
    assert root_line.startswith("device cgroup: auto, ") and "not written" not in root_line
    assert ns_line == root_line + " (not written: this process runs in a user namespace; the runtime's cgroup decides)"
