"""A Kubernetes node's GPU path: our `cdi generate` spec in real containerd (Debian 13's 1.7.24 and unstable's 2.x).

The kubelet hands a container its GPUs as CDI names: in the CRI field
`ContainerConfig.CDI_devices` (the NVIDIA device plugin's `cdi-cri`
strategy, names `k8s.device-plugin.nvidia.com/gpu=GPU-<uuid>`) or, from
older plugins, as `cdi.k8s.io/<key>` annotations (`cdi-annotations`);
containerd's CRI plugin resolves them against the specs in /etc/cdi and
/var/run/cdi.  `ctr run --device KIND=NAME` (containerd 2.x) does the same
for a container started by hand.  Each container must see exactly its
GPUs' /dev/nvidiaN and load the host's real libcuda (Debian 12's 535:
cuDriverGetVersion = 12020) through the ld.so.cache our createContainer hook
refreshed.  The host is the fake GPU host (procfs tree and device nodes)
with the real driver files; containerd runs privately (fixtures.containerd).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, make_host
from fixtures import containerd, cri, ociimage, upstream
from fixtures.realdriver import CUDA_VERSION, DownloadError, driver_version, in_ci, require_driver_root

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver, pytest.mark.real_engine,
              pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed (.ci/run installs it)")]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "pyxis.test/gpu:1"
#: the kind the NVIDIA device plugin names its devices with (its vendor k8s.device-plugin.nvidia.com)
PLUGIN_KIND = "k8s.device-plugin.nvidia.com/gpu"
SCRIPT = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; /usr/bin/gputest; ldconfig -p | grep 'libcuda.so.1 '; "
          "for n in 0 1 2 3; do cat /dev/nvidia$n 2>&1; done; true")
GPU_NODES = {f"nvidia{i}" for i in range(4)}
CONTROL = ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]


def _cli(conf: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "pyxis_hook", "--config", str(conf), *args], check=True, cwd=REPO,
                   capture_output=True, text=True)


def _check(out: str, gpus: list[int]) -> None:
    """Exactly these GPUs' nodes (plus the control nodes), each allowed by the device cgroup; the real libcuda."""
    nodes = out.splitlines()[0].split() if out else []
    assert nodes == sorted(CONTROL + [f"nvidia{i}" for i in gpus]), out
    assert f"cuDriverGetVersion={CUDA_VERSION['535']} rc=0" in out, out
    assert "\tlibcuda.so.1 (libc6,x86-64) => /lib/x86_64-linux-gnu/libcuda.so.1\n" in out, out
    for i in range(4):
        # the fake node of a GPU it got opens as far as the missing driver (ENXIO): the device cgroup allowed it
        if i in gpus:
            assert f"can't open '/dev/nvidia{i}': No such device or address" in out, out
        else:
            assert f"can't open '/dev/nvidia{i}': No such file or directory" in out, out


class Node:
    """A private containerd with our CDI specs (two kinds) and the test image in both of its namespaces."""

    def __init__(self, line: str, base: Path) -> None:
        try:
            bindir = containerd.install(line)
        except DownloadError as e:
            if in_ci():
                pytest.fail(f"containerd {line} packages unavailable in CI: {e}")
            pytest.skip(f"containerd {line} packages unavailable: {e}")
        self.version = containerd.version(bindir)
        self.host = make_host(base / "host", driver_root=require_driver_root("535", "debian"))
        with open(os.path.join(self.host.proc_root, "driver/nvidia/version"), "w") as f:
            f.write(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver_version('535')}  "
                    "Thu Jan  1 00:00:00 UTC 2026\n")
        rootfs = fresh_rootfs(base / "rootfs")
        # the pause image's part too: its entrypoint keeps the sandbox alive
        tar = ociimage.write_image(rootfs, base / "image.tar", IMAGE, ("/bin/busybox", "sleep", "2147483647"))
        d = base / "d"
        make_config = containerd.config_v2 if line == "1.7" else containerd.config_v3
        self.base = base
        self.daemon = containerd.start(bindir, d, make_config(d, d / "containerd.sock", IMAGE))
        try:
            # the default kind, and the device plugin's kind: the names a kubelet passes with that plugin
            _cli(self.host.conf, "cdi", "generate", "--output", str(self.daemon.cdi_dir / "pyxis-gpu.json"))
            self.host.write_conf(cdi_kind=PLUGIN_KIND)
            _cli(self.host.conf, "cdi", "generate", "--output", str(self.daemon.cdi_dir / "pyxis-plugin-gpu.json"))
            spec = json.loads((self.daemon.cdi_dir / "pyxis-plugin-gpu.json").read_text())
            #: GPU index -> its UUID device name, as the spec holds it
            self.uuid = {int(n["path"][len("/dev/nvidia"):]): dev["name"] for dev in spec["devices"]
                         if dev["name"].startswith("GPU-") for n in dev["containerEdits"]["deviceNodes"]}
            for ns in ("default", containerd.K8S_NAMESPACE):
                self.daemon.import_image(tar, ns)
        except BaseException:
            self.daemon.stop()
            raise

    def close(self) -> None:
        """Stop the daemon; none of its mounts or specs may show on the host (other tests may add their own)."""
        self.daemon.stop()
        with open("/proc/self/mountinfo") as f:
            ours = [m for m in f if str(self.base) in m or "pyxis-test-run" in m or "pyxis-test-cdi" in m]
        assert ours == []
        for d in ("/etc/cdi", "/var/run/cdi"):
            assert not {"pyxis-gpu.json", "pyxis-plugin-gpu.json"} & set(os.listdir(d) if os.path.isdir(d) else ())


@pytest.fixture(scope="module", params=["2.x", "1.7"])
def node(request, tmp_path_factory):
    n = Node(request.param, tmp_path_factory.mktemp(f"containerd-{request.param}"))
    yield n
    n.close()


@pytest.fixture
def kubelet(node):
    """The CRI client over the node's socket, generated from cri-api's api.proto (skips when that cannot be had)."""
    client = cri.Client(node.daemon.sock, upstream.require(cri.proto))
    yield client
    client.close()


@pytest.mark.parametrize("node", ["2.x"], indirect=True)  # 1.7's ctr takes --device as a host path only
def test_ctr_run_device_takes_cdi_names(node):
    """containerd 2.x: `ctr run --device nvidia.com/gpu=1 --device nvidia.com/gpu=3` gets GPUs 1 and 3."""
    name = f"pyxis-ctr-{os.getpid()}"
    r = node.daemon.ctr("run", "--rm", "--device", "nvidia.com/gpu=1", "--device", "nvidia.com/gpu=3",
                        IMAGE, name, "/bin/sh", "-c", SCRIPT)
    assert r.returncode == 0, r.stderr + node.daemon.log_text()[-3000:]
    _check(r.stdout, [1, 3])


def _pod_run(node, kubelet, tmp_path, containers: dict[str, dict]) -> dict[str, tuple[cri.Exited, dict]]:
    """One hostNetwork pod running each container (name -> CreateContainer keywords) to its end, then removed:
    name -> (how it exited, the OCI spec containerd made for it)."""
    logs = tmp_path / "logs"
    logs.mkdir()
    config = kubelet.pod_config(f"gpu-{tmp_path.name[-24:].strip('_-').lower()}", logs)
    pod = kubelet.run_pod(config)
    out: dict[str, tuple[cri.Exited, dict]] = {}
    try:
        for name, kw in containers.items():
            cid = kubelet.create(pod, config, name, IMAGE, ["/bin/sh", "-c", SCRIPT], **kw)
            kubelet.start(cid)
            out[name] = (kubelet.wait(cid, logs), kubelet.container_spec(cid))
    finally:
        kubelet.remove_pod(pod)
    return out


def test_cri_cdi_devices_field(node, kubelet, tmp_path):
    """CreateContainer with CDI_devices (the device plugin's cdi-cri names, by UUID): GPUs 0 and 3; a container
    of the same pod without devices gets neither nodes nor libcuda."""
    names = [f"{PLUGIN_KIND}={node.uuid[0]}", f"{PLUGIN_KIND}={node.uuid[3]}"]
    got = _pod_run(node, kubelet, tmp_path, {"cuda": {"cdi_devices": tuple(names)}, "plain": {}})
    cuda, spec = got["cuda"]
    assert cuda.exit_code == 0, cuda
    _check(cuda.output, [0, 3])
    assert sorted(d["path"] for d in spec["linux"]["devices"]) == sorted(
        ["/dev/nvidia0", "/dev/nvidia3"] + [f"/dev/{c}" for c in CONTROL])
    steps = [h["args"][h["args"].index("hook") + 1] for h in spec["hooks"]["createContainer"]]
    assert steps == ["create-symlinks", "update-ldcache", "proc-driver"], steps
    plain = got["plain"][0]
    assert plain.exit_code == 0 and not GPU_NODES & set(plain.output.split()), plain
    assert "libcuda: libcuda.so.1: cannot open shared object file" in plain.output, plain


def test_cri_cdi_annotation(node, kubelet, tmp_path):
    """CreateContainer with a `cdi.k8s.io/` annotation (older device plugins, cdi-annotations): GPU 2."""
    ann = {"cdi.k8s.io/nvidia-device-plugin_pyxis-test": "nvidia.com/gpu=2"}
    cuda, _ = _pod_run(node, kubelet, tmp_path, {"cuda": {"annotations": ann}})["cuda"]
    assert cuda.exit_code == 0, cuda
    _check(cuda.output, [2])
