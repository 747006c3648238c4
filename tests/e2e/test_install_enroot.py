"""`pyxis-hook install enroot` is all real Pyxis + enroot need: an ordinary user's `srun --container-image` gets its GPU.

One Slurm node (`fixtures.pyxiscluster`, `node_root=True`): enroot's
configuration sits where a package puts it, `/etc/enroot`, under a node tree
`<node>/root`, with NVIDIA's own `98-nvidia.sh` in its hooks.d; enroot reads
it there (`ENROOT_SYSCONF_PATH`), and `pyxis-hook install enroot --root
<node>/root` (run as the node runs the hook: its python3 on a root-owned
copy) wrote our shim, stubbed NVIDIA's hook and wrote the launcher, which the
node sees at its own path `/usr/libexec/pyxis-hook/pyxis-hook` (an overlay of
the tree's /usr/libexec in the node's mount namespace).  NVIDIA's hook,
left as it was, would fail the job: the image asks for `all` GPUs and there is
no nvidia-container-cli here.  `uninstall` puts the tree back byte for byte.
"""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from e2e.conftest import DRIVER_VERSION, file_tree, fresh_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus
from fixtures.pyxisbuild import require_build
from fixtures.pyxiscluster import NODE_ROOT, USER, hook_command, pyxis_cluster, squashfs_image

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.real_engine,
              pytest.mark.skipif(not (shutil.which("slurmctld") and shutil.which("munged")),
                                 reason="slurm-wlm and munge are not installed (.ci/run installs them)")]

ENXIO = "No such device or address"
PROBE = ("echo uid=$(id -u) gpus=$(ls /dev | grep -E '^nvidia[0-9]+$' | tr '\\n' ,) cuda=$(gputest 2>&1 | head -1 "
         "| tr ' ' _); for d in /dev/nvidia[0-9]*; do echo \"open ${d#/dev/} $(cat $d 2>&1 | sed 's/.*: //')\"; done")



def test_install_enroot_then_a_users_srun_gets_its_gpu_and_uninstall_restores(tmp_path):
    from pyxis_hook.engines.filetexts import is_nvidia_stub
    from pyxis_hook.engines.launcher import LAUNCHER, parse_launcher

    build = require_build()
    base = Path(tempfile.mkdtemp(prefix="pyxis-install-", dir="/tmp"))
    os.chmod(base, 0o755)  # the user's jobs walk into it
    try:
        driver = make_fake_driver(base / "driver", version=DRIVER_VERSION)
        cluster, nodes = pyxis_cluster(base, build, {"pxa": fake_gpus(2, minors=[0, 1])}, driver, node_root=True)
        node = nodes["pxa"]
        root = node.base / NODE_ROOT
        hooks = root / "etc/enroot/hooks.d"
        # what install wrote: the shim naming the launcher and this node's pyxis.conf, NVIDIA's hook stubbed
        assert (hooks / "98-pyxis-hook.sh").read_text().endswith(
            f"PYXIS_HOOK_CONFIG='{node.conf}' exec '{LAUNCHER}' enroot\n")
        assert is_nvidia_stub((hooks / "98-nvidia.sh").read_text())
        nvidia = (build.sysconf / "hooks.d/98-nvidia.sh").read_bytes()
        assert (root / "var/lib/pyxis-hook/backup/etc/enroot/hooks.d/98-nvidia.sh").read_bytes() == nvidia
        assert parse_launcher((root / LAUNCHER.lstrip("/")).read_text()) == (
            "/usr/bin/python3", str(node.package / "__main__.py"))
        (node.base / "enroot.conf").read_text().index(f"ENROOT_SYSCONF_PATH {root}/etc/enroot\n")
        rootfs = fresh_rootfs(base / "rootfs")
        image = squashfs_image(rootfs, base / "image.sqsh", {"NVIDIA_VISIBLE_DEVICES": "all",
                                                                   "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"})
        cluster.start()
        try:
            env = {**cluster.env, "ENROOT_RESTRICT_DEV": "y"}
            # the admin's one root GPU start (the start image users' starts run), then the user's job
            first = cluster.srun("--gres=gpu:1", f"--container-image={image}", "true", env=env, timeout=120)
            assert first.returncode == 0, first.stdout + first.stderr + cluster.logs()
            r = cluster.srun("--gres=gpu:1", f"--container-image={image}", "sh", "-c", PROBE, env=env,
                             timeout=120, uid=USER)
        finally:
            cluster.stop()
            node.syslog.close()
        assert r.returncode == 0, r.stdout + r.stderr + cluster.logs()
        assert "pyxis-hook:" not in r.stderr and "nvidia-container-cli" not in r.stderr, r.stderr
        assert f"uid={USER} gpus=nvidia0, cuda=cuDriverGetVersion=12020_rc=0" in r.stdout, r.stdout
        assert f"open nvidia0 {ENXIO}" in r.stdout, r.stdout
        # uninstall: the node tree is enroot's installed configuration again, nothing of ours left
        u = subprocess.run(hook_command(node.package, "--config", str(node.conf), "uninstall", "enroot", "--root",
                                        str(root)), capture_output=True, text=True, cwd="/")
        assert u.returncode == 0, u.stdout + u.stderr
        assert file_tree(root) == {f"etc/enroot/{k}": v for k, v in file_tree(build.sysconf).items()}, u.stdout
        assert filecmp.cmp(hooks / "98-nvidia.sh", build.sysconf / "hooks.d/98-nvidia.sh", shallow=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)
