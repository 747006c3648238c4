"""Rootless podman (Debian 4.3.1): an ordinary user's containers get GPUs through hooks.d and CDI.

The node is laid out as the admin's docs say (docs/podman.md): the package is
a root-owned copy any user reads, run by the node's own `/usr/bin/python3`
(`fixtures.pyxiscluster.install_package`); root wrote pyxis.conf, the
hooks.d file (`hookd --install`), the CDI spec (`cdi generate`), ran
`pyxis-hook refresh` for the node artifact, and started one GPU container
for the start image.  Then uid 2001 runs `podman run` with its own
XDG_RUNTIME_DIR, storage and subordinate ids, `--runtime crun` or `runc`.

Each user's podman runs in a mount namespace of its own (`_SETUP`): the
account (passwd, group, subuid, subgid with the user added) is bound over
the host's files, and /dev is rebuilt as a tmpfs holding the fake GPU
nodes (where a GPU node has them) and, as `/dev/log`, a datagram socket this
test holds, so the start's system-log record is read back (`artifact=read`:
the user's start trusted root's artifact).  The host's files and mount table
are not touched.

What the hook gives the user's container is asserted as for root (exactly
the requested nodes, the injected libcuda), and that the hook ran as the
user: snapshot-dir and the start image are unchanged, and everything it
wrote into the image is the user's.  A rootless runtime cannot mknod: it
binds each device from the host's /dev at the container's path (so the hook
binds its nodes itself, and a CDI spec's nodes must be in the host's /dev).  Each test gets its own runtime dir,
so podman's pause process (which holds the user's namespaces, and the /dev
they saw) is the test's own; it is killed by the pid podman wrote.

Flags: `--network none` (no slirp4netns needed), vfs storage (no
fuse-overlayfs needed), cgroupfs and file events (no systemd), ulimits at or
under the hard limits (rootless podman cannot raise them).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from e2e.conftest import Host, fresh_rootfs, make_host
from fixtures.privatedev import REBUILD_DEV
from fixtures.pyxiscluster import NODE_PYTHON, USER, hook_command, install_package

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (.ci/run installs it)"),
              pytest.mark.skipif(shutil.which("newuidmap") is None, reason="rootless podman needs newuidmap (uidmap)")]

NAME = "pyxisuser"
#: the user's subordinate ids (/etc/subuid and /etc/subgid, bound in the user's mount namespace only)
SUBIDS = "200000:65536"
#: a kind of its own: the rootful CDI tests' specs (another kind) never collide with this one
KIND = "pyxis-rootless.example/gpu"
PROBE = ("echo $(ls /dev | grep nvidia); /usr/bin/gputest; cat /dev/nvidia1 2>&1 | head -1 | sed 's/^/open1: /'; "
         "echo NVD=$NVIDIA_VISIBLE_DEVICES id=$(id -u)")
NODES0 = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}

#: as root in a private mount namespace: rebuild /dev with our socket as /dev/log, bind the account, become the user
_SETUP = REBUILD_DEV + r"""
set -eu
old=$1 sock=$2 etc=$3 uid=$4 runtime=$5 nodes=$6 share=$7
shift 7
rebuild_dev "$old"
umount -l "$old"
[ ! -d "$nodes" ] || cp -a "$nodes"/. /dev/  # the node's GPU nodes where a GPU node has them (a rootless runtime binds /dev/X itself)
touch /dev/log
mount --bind "$sock" /dev/log
for f in passwd group subuid subgid; do mount --bind "$etc/$f" "/etc/$f"; done
[ "$share" = - ] || mount --bind "$share" /usr/share/containers  # with the hooks.d file in its default place
mount --make-rshared /  # peers of this namespace only; podman warns about a private /
# crun refuses the hybrid cgroup layout of the CI machines (cgroup v1 + an empty v2 at .../unified)
[ "$runtime" != crun ] || umount /sys/fs/cgroup/unified 2>/dev/null || true
exec setpriv --reuid="$uid" --regid="$uid" --init-groups "$@"
"""


@dataclass(frozen=True)
class Node:
    """What root set up: the package, the host, the hooks.d dir; the account files; the /dev/log stand-in."""

    base: Path
    host: Host
    package: Path
    hooks: Path
    etc: Path
    syslog: socket.socket

    def records(self) -> list[dict[str, str]]:
        """The start records /dev/log got since the last call, as `key=value` fields (drained, oldest first)."""
        out = []
        while True:
            try:
                text = self.syslog.recv(65536).decode("utf-8", "replace")
            except BlockingIOError:
                return out
            if " pyxis-hook[" in text:
                out.append(dict(w.split("=", 1) for w in text.split() if "=" in w))

    def kept(self) -> dict[str, tuple[int, int, int]]:
        """What root keeps between starts: snapshot-dir and its files, the start image, the hook's log (uid, size, mtime)."""
        snap = self.base / "node" / "snapshot"
        paths = [snap, *snap.iterdir(), *(self.package / "__pycache__").glob("start-image.*"), self.base / "node/hook.log"]
        return {str(p): (st.st_uid, st.st_size, st.st_mtime_ns) for p in paths if (st := p.stat())}


def _root(*args: str) -> str:
    r = subprocess.run(list(args), capture_output=True, text=True, cwd="/", timeout=120, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{args}: {r.stdout}{r.stderr}"
    return r.stdout


def _ulimits() -> list[str]:
    import resource

    n = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 20000)
    p = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 1024)
    return ["--ulimit", f"nofile={n}:{n}", "--ulimit", f"nproc={p}:{p}"]


def _accounts(etc: Path) -> None:
    """The host's passwd and group with the user added, and subuid/subgid naming it."""
    etc.mkdir()
    for name, line in (("passwd", f"{NAME}:x:{USER}:{USER}::{etc.parent}/home:/bin/sh\n"),
                       ("group", f"{NAME}:x:{USER}:\n"), ("subuid", f"{NAME}:{SUBIDS}\n"),
                       ("subgid", f"{NAME}:{SUBIDS}\n")):
        text = Path("/etc", name).read_text()
        text += "" if text.endswith("\n") or not text else "\n"
        (etc / name).write_text(text + line)
        os.chmod(etc / name, 0o644)


@pytest.fixture(scope="module")
def node():
    """The node as the admin sets it up (module doc); removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="pyxis-rootless-", dir="/tmp"))
    os.chmod(base, 0o755)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        package = install_package(base / "site")
        host = make_host(base / "node")
        os.chmod(host.conf, 0o644)
        _root(*hook_command(package, "--config", str(host.conf), "refresh"))
        hooks = base / "hooks.d"
        hooks.mkdir()
        _root(*hook_command(package, "--config", str(host.conf), "hookd", "--install", str(hooks)))
        _accounts(base / "etc")
        (base / "no-hooks").mkdir()
        if os.path.isdir("/usr/share/containers"):  # podman's own files there, and root's hooks.d file
            shutil.copytree("/usr/share/containers", base / "share", symlinks=True)
            shutil.copytree(hooks, base / "share/oci/hooks.d", dirs_exist_ok=True)
        (base / "home").mkdir()
        os.chown(base / "home", USER, USER)
        sock.bind(str(base / "syslog.sock"))
        sock.setblocking(False)
        os.chmod(base / "syslog.sock", 0o666)  # every user's start sends its record
        n = Node(base, host, package, hooks, base / "etc", sock)
        _root_start(n)
        assert (base / "node/hook.log").is_file(), "root's start wrote no log"
        n.records()
        yield n
    finally:
        sock.close()
        shutil.rmtree(base, ignore_errors=True)


def _root_start(node: Node) -> None:
    """Root's first GPU start (rootful podman, the same hooks.d): it saves the start image users then load."""
    rootfs = fresh_rootfs(node.base / "root-rootfs")
    out = _root("podman", "--runtime", "runc", "--cgroup-manager=cgroupfs", "--events-backend=file",
                "--hooks-dir", str(node.hooks), "run", "--rm", "--network", "none", *_ulimits(),
                "-e", "NVIDIA_VISIBLE_DEVICES=0", "--rootfs", str(rootfs), "/bin/sh", "-c", PROBE)
    assert "cuDriverGetVersion=12020 rc=0" in out, out
    shutil.rmtree(rootfs)
    assert list((node.package / "__pycache__").glob("start-image.*")), "root's start saved no start image"


@dataclass
class User:
    """One test's rootless podman: its runtime dir and storage, and how to run a container."""

    node: Node
    dir: Path
    n: int = 0
    last: Path | None = None

    def rootfs(self) -> Path:
        """A fresh rootfs the user owns (as the user's own image would be: root in its namespace)."""
        self.n += 1
        dest = fresh_rootfs(self.dir / f"rootfs{self.n}")
        for d, dirs, files in os.walk(dest):
            for name in (d, *(os.path.join(d, x) for x in (*dirs, *files))):
                os.lchown(name, USER, USER)
        self.last = dest
        return dest

    def podman(self, runtime: str, *opts: str, hooks: str = "dir", script: str = PROBE,
               gpu_nodes: bool = True) -> subprocess.CompletedProcess:
        """`podman run` as the user; `gpu_nodes`: the host's /dev holds the GPU nodes (as a GPU node's does).

        `hooks`: "dir" (`--hooks-dir` root's hooks.d), "none" (an empty one),
        "default" (no option: root's file in /usr/share/containers/oci/hooks.d).
        """
        env = ["env", "-i", f"HOME={self.node.base}/home", f"USER={NAME}", f"LOGNAME={NAME}",
               f"XDG_RUNTIME_DIR={self.dir}/run", "PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"]
        cmd = ["podman", "--runtime", runtime, "--cgroup-manager=cgroupfs", "--events-backend=file",
               "--storage-driver=vfs", "--root", f"{self.dir}/storage", "--runroot", f"{self.dir}/runroot",
               *({"dir": ["--hooks-dir", str(self.node.hooks)], "none": ["--hooks-dir", str(self.node.base / "no-hooks")],
                  "default": []}[hooks]),
               "run", "--rm", "--network", "none", *_ulimits(), *opts, "--rootfs", str(self.rootfs()),
               "/bin/sh", "-c", script]
        return subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _SETUP, "rootless",
                               str(self.dir / "olddev"), str(self.node.base / "syslog.sock"), str(self.node.etc),
                               str(USER), runtime, str(Path(self.node.host.dev_root) / "dev") if gpu_nodes else "/var/empty",
                               str(self.node.base / "share") if hooks == "default" else "-", *env, *cmd],
                              capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL, cwd="/")


@pytest.fixture
def user(node, tmp_path):
    """A runtime dir and storage of this test's own; its pause process killed and its files removed after."""
    d = Path(tempfile.mkdtemp(prefix="user-", dir=node.base))
    os.chmod(d, 0o755)
    (d / "run").mkdir(mode=0o700)
    os.chown(d / "run", USER, USER)
    for sub in ("storage", "runroot"):
        (d / sub).mkdir(mode=0o700)
        os.chown(d / sub, USER, USER)
    node.records()
    yield User(node, d)
    pause = d / "run" / "libpod" / "tmp" / "pause.pid"
    if pause.exists():
        try:
            os.kill(int(pause.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass
    shutil.rmtree(d, ignore_errors=True)


def _nodes(out: str) -> set[str]:
    return set(out.splitlines()[0].split()) if out else set()


def _user_start(user: User, runtime: str, *opts: str, **kw) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """A start as the user: it succeeds, writes nothing root keeps, and sends its records (returned)."""
    before = user.node.kept()
    r = user.podman(runtime, *opts, **kw)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pyxis-hook:" not in r.stderr, r.stderr  # no warning for a user (root's log-file, root's artifact)
    assert user.node.kept() == before, "an ordinary user's start wrote what the node keeps"
    assert "id=0" in r.stdout, r.stdout  # root in the container: the user outside it
    # what the hook wrote into the image (ld.so.cache, links, mount points) is the user's: it ran as the user
    assert user.last is not None
    owners = {os.lstat(os.path.join(d, x)).st_uid for d, dirs, files in os.walk(user.last) for x in (*dirs, *files)}
    assert owners == {USER}, owners
    return r, user.node.records()


def _read_roots_artifact(records: list[dict]) -> None:
    """One record: the hook ran as the user (root of podman's user namespace) and read root's artifact."""
    assert len(records) == 1, records
    rec = records[0]
    assert {k: rec.get(k) for k in ("uid", "ns_uid", "result", "artifact")} == {
        "uid": str(USER), "ns_uid": "0", "result": "ok", "artifact": "read"}, rec


@pytest.mark.parametrize("runtime", ["crun", "runc"])
def test_hooksd_rootless(user, runtime):
    """The hooks.d file root installed serves a user's `podman run -e NVIDIA_VISIBLE_DEVICES=0,1`."""
    r, records = _user_start(user, runtime, "-e", "NVIDIA_VISIBLE_DEVICES=0,1")
    assert _nodes(r.stdout) == {"nvidia0", "nvidia1", *NODES0}, r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout
    assert "open1: cat: can't open '/dev/nvidia1': No such device or address" in r.stdout  # the host node, bound
    _read_roots_artifact(records)
    # a container that asks for nothing is left alone, and sends no record
    r, records = _user_start(user, runtime)
    assert _nodes(r.stdout) == set() and "libcuda.so.1: cannot open shared object file" in r.stdout
    assert records == []


def test_hooksd_rootless_default_dir(user):
    """Without `--hooks-dir` rootless podman reads /usr/share/containers/oci/hooks.d, as root's does."""
    if not (user.node.base / "share").is_dir():
        pytest.skip("no /usr/share/containers to bind over")
    r, records = _user_start(user, "runc", "-e", "NVIDIA_VISIBLE_DEVICES=0", hooks="default")
    assert _nodes(r.stdout) == {"nvidia0", *NODES0}, r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout
    _read_roots_artifact(records)


@pytest.fixture(scope="module")
def cdi_spec(node):
    """Root's CDI spec (a kind of its own) where podman 4.3 reads specs, readable by all; removed afterwards."""
    conf = node.base / "cdi.conf"
    conf.write_text(node.host.conf.read_text() + f'cdi-kind = "{KIND}"\n')
    os.chmod(conf, 0o644)
    os.makedirs("/var/run/cdi", exist_ok=True)
    path = Path(f"/var/run/cdi/pyxis-rootless-{os.getpid()}.json")
    _root(*hook_command(node.package, "--config", str(conf), "cdi", "generate", "--output", str(path)))
    os.chmod(path, 0o644)
    spec = json.loads(path.read_text())
    hook_paths = {h["path"] for dev in [spec, *spec["devices"]] for h in dev.get("containerEdits", {}).get("hooks", [])}
    assert hook_paths == {NODE_PYTHON}, hook_paths  # the node's python on the installed copy: any user runs it
    yield path
    path.unlink()


@pytest.mark.parametrize("runtime", ["crun", "runc"])
def test_cdi_rootless(user, cdi_spec, runtime):
    """`--device KIND=1` as the user: podman applies root's spec; its hooks make the links and the cache."""
    r, records = _user_start(user, runtime, "--device", f"{KIND}=1", hooks="none")
    assert _nodes(r.stdout) == {"nvidia1", *NODES0}, r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout
    assert "open1: cat: can't open '/dev/nvidia1': No such device or address" in r.stdout
    assert "NVD=void" in r.stdout
    assert records == []  # the spec's hooks send none: only a start that plans GPUs (prestart, enroot) does


@pytest.mark.parametrize("runtime", ["crun", "runc"])
def test_cdi_rootless_needs_the_nodes_in_the_hosts_dev(user, cdi_spec, runtime):
    """A rootless runtime binds each config.json device from the host's /dev at its container path: OCI's
    `linux.devices` has no host path, so a spec's `hostPath` elsewhere (`dev-root` other than /) is not used."""
    r = user.podman(runtime, "--device", f"{KIND}=1", hooks="none", gpu_nodes=False)
    assert r.returncode != 0
    said = {"crun": "crun: mount `/dev/nvidiactl` to `/dev/nvidiactl`: No such file or directory",
            "runc": "error creating device nodes: mount /dev/nvidiactl:"}[runtime]
    assert said in r.stderr and "no such file or directory" in r.stderr.lower(), r.stderr
    assert user.node.records() == []
