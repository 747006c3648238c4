"""The node artifact's trust rule, as root, as an ordinary user, and inside a user namespace.

The artifact is trusted when it and its directory are owned by the package's
owner (root here) and writable by nobody else.  An ordinary user's start
reads root's artifact; inside a user namespace root's files show as the
overflow uid, as the package's do, so the rule holds there too.  A process
that is not the package's owner never writes one: it discovers in memory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fixtures import hosttree
from fixtures.pyxiscluster import install_package
from fixtures.synthdriver import V, make_driver
from pyxis_hook.errors import ArtifactError
from pyxis_hook.host import artifact
from pyxis_hook.record import replace
from pyxis_hook.spec.config import Config

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]
USER = 2001

if os.geteuid() != 0:
    pytest.skip("needs root (chown, setuid, user namespaces)", allow_module_level=True)


#: the node's own python3 runs the hook for an ordinary user (root's pyenv is not theirs to run)
NODE_PYTHON = "/usr/bin/python3"


@pytest.fixture
def tmp_path():
    """A directory an ordinary user can walk into (pytest's own is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="pyxis-artifact-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _config(tmp_path: Path) -> Config:
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    root = make_driver(tmp_path / "root")
    for d in (tmp_path, tmp_path / "host", tmp_path / "root"):  # an ordinary user walks to it, as on a node
        os.chmod(d, 0o755)
    return replace(Config(), driver_root=str(root), proc_root=str(host.proc_root), dev_root=str(host.dev_root),
                   snapshot_dir=str(tmp_path / "snap"))


#: run by a child: load_or_build and report what it found and whether it wrote anything
_PROBE = """
import json, os, sys
sys.path.insert(0, {repo!r})
from pyxis_hook import log, trust
from pyxis_hook.errors import ArtifactError
from pyxis_hook.host import artifact
from pyxis_hook.spec.config import Config
from pyxis_hook.record import replace
c = replace(Config(), **json.loads(sys.argv[1]))
try:
    artifact.load(c)
    why = ""
except ArtifactError as e:
    why = str(e)
inv = artifact.load_or_build(c, strict=False)
print(json.dumps(dict(euid=os.geteuid(), owner=trust.package_owner(), why=why, usable=inv.usable,
                      gpus=len(inv.host.gpus), files=len(inv.files))))
"""


def _as_user(c: Config, *wrap: str) -> dict:
    """The probe run as uid USER (after `wrap`, e.g. unshare), with the package `_installed` beside the config."""
    fields = {k: getattr(c, k) for k in ("driver_root", "proc_root", "dev_root", "snapshot_dir")}
    argv = ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", *wrap,
            NODE_PYTHON, "-I", "-c", _PROBE.format(repo=str(Path(c.snapshot_dir).parent / "site")), json.dumps(fields)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # a node set up as the docs say: no warning for the user
    return json.loads(r.stdout)


def _installed(tmp_path: Path) -> Path:
    """The package installed where any user reads it, root's, as on a node (`pyxiscluster.install_package`)."""
    site = tmp_path / "site"
    install_package(site)
    return site


def test_an_ordinary_user_reads_roots_artifact_and_writes_nothing(tmp_path):
    c = _config(tmp_path)
    _installed(tmp_path)
    built = artifact.load_or_build(c, strict=False)
    before = sorted(os.listdir(c.snapshot_dir))
    got = _as_user(c)
    assert got["euid"] == USER and got["owner"] == 0
    assert got["why"] == "" and got["usable"] and got["files"] == len(built.files)
    assert sorted(os.listdir(c.snapshot_dir)) == before


def test_in_a_user_namespace_roots_artifact_is_trusted(tmp_path):
    """enroot's map (`UID UID 1`): root's files and the package's both show as the overflow uid."""
    c = _config(tmp_path)
    _installed(tmp_path)
    artifact.load_or_build(c, strict=False)
    mtime = os.stat(artifact.artifact_path(c)).st_mtime_ns
    got = _as_user(c, "unshare", "--user", "--map-current-user")
    assert got["euid"] == USER and got["owner"] == 65534, got
    assert got["why"] == "" and got["usable"] and got["gpus"] == 2
    got = _as_user(c, "unshare", "--user", "--map-root-user")  # --container-remap-root: `0 UID 1`
    assert got["euid"] == 0 and got["owner"] == 65534 and got["why"] == "", got
    assert os.stat(artifact.artifact_path(c)).st_mtime_ns == mtime


def test_a_stale_artifact_makes_a_user_discover_in_memory(tmp_path):
    c = _config(tmp_path)
    _installed(tmp_path)
    artifact.load_or_build(c, strict=False)
    path = Path(artifact.artifact_path(c))
    lib = next(p for p in Path(c.driver_root).rglob("libcuda.so.*") if not p.is_symlink())
    os.utime(lib, ns=(1, 1))  # the driver upgraded in place: a source's signature changed
    got = _as_user(c)
    assert "stale" in got["why"] and got["usable"]
    with pytest.raises(ArtifactError, match="stale"):
        artifact.load(c)  # the user wrote nothing: still stale
    artifact.load_or_build(c, strict=False)  # root rebuilds
    artifact.load(c)
    assert path.is_file()


@pytest.mark.parametrize("damage", ["foreign-owner", "group-writable", "dir-foreign-owner", "corrupt"])
def test_an_untrusted_or_corrupt_artifact_is_never_read(tmp_path, damage):
    c = _config(tmp_path)
    good = artifact.load_or_build(c, strict=False)
    path = Path(artifact.artifact_path(c))
    if damage == "foreign-owner":
        os.chown(path, USER, USER)
        match = f"owned by uid {USER}"
    elif damage == "group-writable":
        os.chmod(path, 0o664)
        match = "writable by group or others"
    elif damage == "dir-foreign-owner":
        os.chown(path.parent, USER, USER)
        match = f"owned by uid {USER}"
    else:
        path.write_text('{"format": 3, "key": {}, "inventory": ')
        match = "corrupt"
    with pytest.raises(ArtifactError, match=match):
        artifact.load(c)
    if damage == "dir-foreign-owner":
        return  # root never writes into another user's directory: it discovers
    again = artifact.load_or_build(c, strict=False)  # root rebuilds it
    assert again.files == good.files
    assert os.stat(path).st_uid == 0 and os.stat(path).st_mode & 0o777 == 0o644
    assert artifact.load(c).files == good.files


def test_mig_reconfiguration_and_gpu_removal_need_no_rebuild(tmp_path):
    """GPU facts are read on every start: the artifact is the driver's files only, and stays fresh."""
    c = _config(tmp_path)
    artifact.load_or_build(c, strict=False)
    mtime = os.stat(artifact.artifact_path(c)).st_mtime_ns
    gpus_dir = Path(c.proc_root) / "driver/nvidia/gpus"
    shutil.rmtree(gpus_dir / sorted(os.listdir(gpus_dir))[1])
    inv = artifact.load_or_build(c, strict=False)
    assert len(inv.host.gpus) == 1
    assert os.stat(artifact.artifact_path(c)).st_mtime_ns == mtime


def test_refresh_by_an_ordinary_user_is_one_line_and_writes_nothing(tmp_path):
    c = _config(tmp_path)
    site = _installed(tmp_path)
    conf = tmp_path / "pyxis.conf"
    conf.write_text(f'driver-root = "{c.driver_root}"\nproc-root = "{c.proc_root}"\ndev-root = "{c.dev_root}"\n'
                    f'snapshot-dir = "{c.snapshot_dir}"\n')
    os.chmod(conf, 0o644)
    r = subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups", NODE_PYTHON, "-I", "-S",
                        str(site / "pyxis_hook" / "__main__.py"), "--config", str(conf), "refresh"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "only the package's owner (uid 0) writes the node artifact" in r.stderr
    assert not Path(c.snapshot_dir).exists() or not os.listdir(c.snapshot_dir)


#: a GPU start's image use, without a container: the boot and start sections loaded, the pipeline imported, saved
_IMAGE_PROBE = """
import sys
sys.path.insert(0, {site!r})
from pyxis_hook import startimage
startimage.load_boot()
import pyxis_hook.start
startimage.load()
import pyxis_hook.pipeline
print(startimage.save() or "nothing to write")
print("\\n".join(startimage.statuses()))
"""


def test_a_users_start_runs_the_start_image_root_wrote(tmp_path):
    """Root's first start writes the image beside the package's bytecode; a user's start in a user namespace
    (enroot's map) trusts and runs it, and writes none of its own."""
    site = _installed(tmp_path)
    probe = [NODE_PYTHON, "-I", "-S", "-c", _IMAGE_PROBE.format(site=str(site))]
    root = subprocess.run(probe, capture_output=True, text=True, timeout=60, cwd="/")
    assert root.returncode == 0 and "written" in root.stdout, root.stdout + root.stderr
    (image,) = (site / "pyxis_hook" / "__pycache__").glob("start-image.*.bin")
    mtime = image.stat().st_mtime_ns
    user = subprocess.run(["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups",
                           "unshare", "--user", "--map-current-user", *probe],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert user.returncode == 0, user.stderr
    lines = user.stdout.splitlines()
    assert lines[0] == "nothing to write"
    assert any(": boot section: " in line and "modules loaded" in line for line in lines), lines
    assert any(": start section: " in line and "modules loaded" in line for line in lines), lines
    assert image.stat().st_mtime_ns == mtime
