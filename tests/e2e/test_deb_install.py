"""The .deb as an admin installs it: apt into a clean Debian root, then a GPU container through it.

`packaging/build deb` writes the package; `apt-get install ./pyxis-hook_*.deb`
installs it into a fresh minbase root of the machine's release
(fixtures.debroot), fetching its Depends from the archive.  Inside that root
(chroot, with the host's /proc, /sys and /dev bound in a private mount
namespace) the registration is what the installed `pyxis-hook install podman` writes,
the hook runs on the root's /usr/bin/python3 from the package's files, and
the root's own runc (Debian's) starts a container whose GPU devices and
driver libraries come from the fixture driver tree that the conffile
/etc/pyxis-hook/pyxis.conf points at (driver-root, dev-root, proc-root).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import pyxis_hook
from e2e.conftest import fresh_rootfs, make_host
from fixtures.container import make_bundle
from fixtures.debroot import chroot, installed_root, require_base_root

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SITE = "/usr/lib/python3/dist-packages"
PROBE = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; /usr/bin/gputest; "
         "ldconfig -p | grep -c nvidia-ml | sed 's/^/nvml-cache-entries=/'")


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("deb")
    p = subprocess.run([sys.executable, str(REPO / "packaging/build"), "deb", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return Path(p.stdout.splitlines()[-1])


def _inside(root: Path) -> Callable[[str | Path], str]:
    """A host path below `root` as the root's own processes name it."""
    return lambda p: "/" + str(Path(p).relative_to(root))


def test_apt_installed_deb_starts_a_gpu_container(deb, tmp_path):
    base = require_base_root()
    with installed_root(deb, base, tmp_path / "overlay") as root:
        # what apt resolved and where the files went
        p = chroot(root, "dpkg-query", "-W", "-f", "${Package} ${Status}\n",
                   "pyxis-hook", "python3-pyelftools", "python3-jsonschema")
        assert sorted(p.stdout.splitlines()) == [f"{name} install ok installed" for name in
                                                 ("python3-jsonschema", "python3-pyelftools", "pyxis-hook")]
        assert (root / "usr/bin/pyxis-hook").read_text().startswith("#!/usr/bin/python3\n")
        assert list((root / SITE[1:] / "pyxis_hook/__pycache__").glob("start.cpython-3*.pyc")), "postinst compiled nothing"

        p = chroot(root, "/usr/bin/pyxis-hook", "--version")
        assert p.returncode == 0 and p.stdout.strip() == f"pyxis-hook {pyxis_hook.__version__}", p
        p = chroot(root, "pyxis-hook", "config", "default")  # reads the schema from /usr/share/pyxis-hook/schemas
        assert p.returncode == 0, p.stderr
        assert p.stdout == (root / "etc/pyxis-hook/pyxis.conf").read_text()
        # Debian's jsonschema checks a pyxis.conf against the installed schema, in one line
        (root / "tmp/bad.conf").write_text('driver-root = "/"\nno-such-key = 1\n')
        p = chroot(root, "pyxis-hook", "--config", "/tmp/bad.conf", "config", "check")
        assert p.returncode == 2 and "no-such-key" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p
        p = chroot(root, "/usr/bin/python3", "-I", "-S", f"{SITE}/pyxis_hook/__main__.py", "--version")
        assert p.returncode == 0, p.stderr

        # the registration as the admin makes it: `pyxis-hook install podman` with the installed command
        p = chroot(root, "pyxis-hook", "install", "podman")
        assert p.returncode == 0, p.stderr
        hook = json.loads((root / "usr/share/containers/oci/hooks.d/pyxis-hook.json").read_text())["hook"]
        assert hook["path"] == "/usr/libexec/pyxis-hook/pyxis-hook" and hook["args"][-1] == "prestart", hook
        launcher = (root / "usr/libexec/pyxis-hook/pyxis-hook").read_text()
        assert launcher.startswith("#!/usr/bin/python3 -IS\n") and f"{SITE}/pyxis_hook" in launcher, launcher

        # the admin points the conffile at the node's driver (here: the fixture trees, inside the root)
        host = make_host(root / "srv/gpuhost")
        rel = _inside(root)
        (root / "etc/pyxis-hook/pyxis.conf").write_text(
            f'driver-root = "{rel(host.driver_root)}"\ndev-root = "{rel(host.dev_root)}"\n'
            f'proc-root = "{rel(host.proc_root)}"\nlog-file = "/var/log/pyxis-hook.log"\nlog-level = "debug"\n')
        bundle = root / "srv/gpuhost/bundle"
        fresh_rootfs(bundle / "rootfs")
        make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=1,3",), args=("/bin/sh", "-c", PROBE),
                    hooks={"prestart": [hook]})
        name = f"pyxis-deb-{os.getpid()}"
        try:
            r = chroot(root, "sh", "-c", f"cd {rel(bundle)} && exec runc run {name}", timeout=120)
        finally:
            chroot(root, "runc", "delete", "-f", name)
        log = (root / "var/log/pyxis-hook.log").read_text() if (root / "var/log/pyxis-hook.log").exists() else ""
        assert r.returncode == 0, f"{r.stderr}\n{log[-3000:]}"
        nodes = set(r.stdout.splitlines()[0].split())
        assert nodes == {"nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidia3", "nvidiactl"}, r.stdout
        assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout
        assert "nvml-cache-entries=1" in r.stdout, r.stdout
        # the hook that ran read the conffile, and rebuilt the node artifact with Debian's pyelftools
        assert f"start container={name} uid=0 gpus=1,3 devices=5 mounts=7 artifact=built result=ok" in log, log

        # a second start: the node artifact as built, and the start image the first one left
        make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=0",), args=("/bin/sh", "-c", PROBE), hooks={"prestart": [hook]})
        try:
            r = chroot(root, "sh", "-c", f"cd {rel(bundle)} && exec runc run {name}-2", timeout=120)
        finally:
            chroot(root, "runc", "delete", "-f", f"{name}-2")
        assert r.returncode == 0, r.stderr
        assert set(r.stdout.splitlines()[0].split()) == {"nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidiactl"}
        assert f"start container={name}-2 uid=0 gpus=0 devices=4 mounts=7 artifact=read result=ok" in \
            (root / "var/log/pyxis-hook.log").read_text()
        assert list((root / SITE[1:] / "pyxis_hook/__pycache__").glob("start-image.*")), "no start image written"

        # removing the package takes the registration and the launcher back first (`uninstall all` in its prerm):
        # left, podman would run a launcher that is gone for every container; a purge leaves nothing of the
        # package, bytecode and the start image in its __pycache__ included
        p = chroot(root, "apt-get", "purge", "-y", "-qq", "pyxis-hook")
        assert p.returncode == 0, p.stderr
        assert not (root / "usr/share/containers/oci/hooks.d/pyxis-hook.json").exists()
        assert not (root / "usr/libexec/pyxis-hook/pyxis-hook").exists()
        assert not (root / "var/lib/pyxis-hook/install.json").exists()
        assert not (root / SITE[1:] / "pyxis_hook").exists()
        assert not (root / "etc/pyxis-hook").exists() and not (root / "usr/share/pyxis-hook").exists()
