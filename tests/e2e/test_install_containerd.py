"""`pyxis-hook install containerd` is all real containerd 1.7 needs: a CRI CreateContainer with CDI devices gets them.

A node tree `node/` holds the admin's containerd config (the CRI plugin's
table without `enable_cdi`: 1.7 then ignores CDI) and the admin's pyxis.conf
at the path the registration names.  `pyxis-hook install containerd --root
node` edits `enable_cdi = true` into that config and writes the CDI spec
and its units; a private containerd (`fixtures.containerd`) runs with the
config text install left, sees the tree's /etc/cdi as its CDI dir
/var/run/cdi, and sees the tree's /usr/libexec (the launcher every CDI hook
names) over its own, in its mount namespace.  The kubelet's part is the CRI
client (`fixtures.cri`).  `uninstall` puts the tree back byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.conftest import file_tree, fresh_rootfs, make_host
from fixtures import containerd, cri, ociimage, upstream
from fixtures.realdriver import DownloadError, in_ci

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.real_engine,
              pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed (.ci/run installs it)")]

REPO = Path(__file__).resolve().parents[2]
IMAGE = "pyxis.test/gpu:1"
SCRIPT = ("echo gpus=$(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\\n' ,); /usr/bin/gputest; "
          "for n in 0 1 2 3; do cat /dev/nvidia$n 2>&1; done; true")


def _cli(conf: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyxis_hook", "--config", str(conf), *args], cwd=REPO,
                          capture_output=True, text=True)



def test_install_containerd_then_a_cri_container_gets_its_cdi_gpu_and_uninstall_restores(tmp_path):
    from pyxis_hook.engines.containerdconf import MARK
    from pyxis_hook.engines.launcher import LAUNCHER

    proto = upstream.require(cri.proto)  # the CRI client is generated from kubernetes/cri-api's api.proto
    try:
        bindir = containerd.install("1.7")
    except DownloadError as e:
        if in_ci():
            pytest.fail(f"containerd 1.7 packages unavailable in CI: {e}")
        pytest.skip(f"containerd 1.7 packages unavailable: {e}")
    host = make_host(tmp_path / "host")
    node = tmp_path / "node"
    d = tmp_path / "d"
    admin = containerd.config_v2(d, d / "containerd.sock", IMAGE).replace("  enable_cdi = true\n", "")
    assert "enable_cdi" not in admin
    (node / "etc/containerd").mkdir(parents=True)
    (node / "etc/containerd/config.toml").write_text(admin)
    conf_in_tree = node / str(host.conf).lstrip("/")  # install reads the pyxis.conf it registers under --root
    conf_in_tree.parent.mkdir(parents=True)
    shutil.copy2(host.conf, conf_in_tree)
    before = file_tree(node)
    r = _cli(host.conf, "install", "containerd", "--root", str(node))
    assert r.returncode == 0, r.stdout + r.stderr
    config = (node / "etc/containerd/config.toml").read_text()
    assert f'[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true{MARK}\n' in config
    assert config.replace(f"  enable_cdi = true{MARK}\n", "") == admin  # nothing else of the admin's changed
    assert (node / "etc/cdi/pyxis-hook.json").is_file() and (node / LAUNCHER.lstrip("/")).is_file()
    d.mkdir()
    (d / "cdi").symlink_to(node / "etc/cdi")  # bound at /run/cdi in the daemon's namespace
    daemon = containerd.start(bindir, d, config, overlays=((node / "usr/libexec", Path("/usr/libexec")),))
    try:
        rootfs = fresh_rootfs(tmp_path / "rootfs")
        tar = ociimage.write_image(rootfs, tmp_path / "image.tar", IMAGE, ("/bin/busybox", "sleep", "2147483647"))
        daemon.import_image(tar, containerd.K8S_NAMESPACE)
        kubelet = cri.Client(daemon.sock, proto)
        try:
            logs = tmp_path / "logs"
            logs.mkdir()
            pod_config = kubelet.pod_config("gpu-install", logs)
            pod = kubelet.run_pod(pod_config)
            try:
                cid = kubelet.create(pod, pod_config, "cuda", IMAGE, ["/bin/sh", "-c", SCRIPT],
                                     cdi_devices=("nvidia.com/gpu=1",))
                kubelet.start(cid)
                got = kubelet.wait(cid, logs)
            finally:
                kubelet.remove_pod(pod)
        finally:
            kubelet.close()
    finally:
        daemon.stop()
    assert got.exit_code == 0, got
    assert "gpus=nvidia1," in got.output and "cuDriverGetVersion=12020 rc=0" in got.output, got.output
    assert "can't open '/dev/nvidia1': No such device or address" in got.output, got.output
    assert "can't open '/dev/nvidia0': No such file or directory" in got.output, got.output
    u = _cli(host.conf, "uninstall", "containerd", "--root", str(node))
    assert u.returncode == 0, u.stdout + u.stderr
    assert file_tree(node) == before, u.stdout
