"""`pyxis-hook install|uninstall ENGINE --root DIR` on scratch trees that start as a node does.

Each tree holds NVIDIA's enroot hook as enroot ships it, an admin's containerd
config and an admin's pyxis.conf (pointing at the fixture driver, so a CDI spec
can be generated).  Every file install writes must be valid for its reader,
a second install must change nothing, and uninstall must give back the tree
byte for byte, modes and links included.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from e2e.conftest import make_host
from pyxis_hook.engines import enginefiles as ef
from pyxis_hook.engines.launcher import LAUNCHER, parse_launcher
from pyxis_hook.spec.schemafiles import load_schema
from unit.engines.test_cdi import _validator as cdi_validator

REPO = Path(__file__).resolve().parents[3]
ENROOT_SRC = "98-nvidia.sh as enroot ships it\n"
CONTAINERD = ('version = 2\n\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "registry.k8s.io/pause:3.9"\n'
              '\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n  SystemdCgroup = true\n')


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyxis_hook", *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def admin_conf(tmp_path_factory):
    return make_host(tmp_path_factory.mktemp("host")).conf.read_text()


def node(root: Path, admin_conf: str, conf: bool = True) -> Path:
    (root / "etc/enroot/hooks.d").mkdir(parents=True)
    nv = root / "etc/enroot/hooks.d/98-nvidia.sh"
    nv.write_text(ENROOT_SRC)
    nv.chmod(0o755)
    (root / "etc/containerd").mkdir()
    (root / "etc/containerd/config.toml").write_text(CONTAINERD)
    (root / "var/run").mkdir(parents=True)
    if conf:
        (root / "etc/pyxis-hook").mkdir()
        (root / "etc/pyxis-hook/pyxis.conf").write_text(admin_conf)
    return root


def snapshot(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        st = p.lstat()
        rel = str(p.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("dir", stat.S_IMODE(st.st_mode))
        else:
            out[rel] = ("file", stat.S_IMODE(st.st_mode), p.read_bytes())
    return out


def check_files(root: Path, engine: str) -> None:
    """Each file install wrote, read as its reader reads it."""
    for role in ef.roles(engine):
        path, mode = ef.ROLE_FILES[role]
        p = root / path.lstrip("/")
        if role == "hooks-json":
            doc = json.loads(p.read_text())
            jsonschema.Draft7Validator(load_schema("oci-hooks-1.0.0.schema.json")).validate(doc)
            assert doc["hook"]["args"] == [LAUNCHER, "prestart"]
            assert p.read_text() == (REPO / "hook.d/pyxis-hook.json").read_text()  # the shipped file
        elif role == "enroot-shim":
            assert p.read_text() == (REPO / "hook.d/98-pyxis-hook.sh").read_text()
            assert stat.S_IMODE(p.stat().st_mode) == 0o755
        elif role == "enroot-nvidia":
            assert "exit 0" in p.read_text() and ENROOT_SRC not in p.read_text()
            assert (root / "var/lib/pyxis-hook/backup" / path.lstrip("/")).read_text() == ENROOT_SRC
        elif role.startswith("cdi-spec"):
            doc = json.loads(p.read_text())
            cdi_validator().validate(doc)
            hooks = doc.get("containerEdits", {}).get("hooks", [])
            assert all(h["path"] == LAUNCHER for h in hooks)
            assert bool(hooks) == (role == "cdi-spec")
        elif role == "containerd-config":
            from pyxis_hook.spec.config import toml_reader

            cri = toml_reader().loads(p.read_text())["plugins"]["io.containerd.grpc.v1.cri"]
            assert cri["enable_cdi"] is True and cri["sandbox_image"] == "registry.k8s.io/pause:3.9"
            assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
        elif role == "launcher":
            python, main = parse_launcher(p.read_text())
            assert os.access(python, os.X_OK) and os.path.isfile(main)
        elif mode == 0:
            assert os.readlink(p).startswith(ef.UNIT_DIR + "/")


@pytest.mark.parametrize("engine", ef.ENGINES)
def test_install_uninstall_restores_the_node(tmp_path, admin_conf, engine):
    root = node(tmp_path / "root", admin_conf)
    before = snapshot(root)
    r = cli("install", engine, "--root", str(root), "--dry-run")
    assert r.returncode == 0 and "would write" in r.stdout, r.stderr
    assert snapshot(root) == before
    r = cli("install", engine, "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert "/etc/pyxis-hook/pyxis.conf" not in r.stdout  # the admin's is never overwritten
    check_files(root, engine)
    after = snapshot(root)
    r = cli("install", engine, "--root", str(root))
    assert r.returncode == 0 and "nothing to change" in r.stdout and snapshot(root) == after
    r = cli("uninstall", engine, "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before
    r = cli("uninstall", engine, "--root", str(root))
    assert r.returncode == 0 and "not installed" in r.stdout


def test_units_pass_systemd_analyze_verify(tmp_path, admin_conf):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    root = node(tmp_path / "root", admin_conf)
    assert cli("install", "containerd", "--root", str(root)).returncode == 0
    # ExecStart names the launcher at its node path: here, the tree's launcher (verify checks it runs)
    units = tmp_path / "units"
    units.mkdir()
    for u in (ef.CDI_SERVICE, ef.CDI_PATH_UNIT):
        text = (root / ef.UNIT_DIR.lstrip("/") / u).read_text()
        (units / u).write_text(text.replace(LAUNCHER, str(root / LAUNCHER.lstrip("/"))))
    r = subprocess.run(["systemd-analyze", "verify", str(units / ef.CDI_SERVICE), str(units / ef.CDI_PATH_UNIT)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "pyxis-hook-cdi" not in r.stderr, r.stderr


def test_fresh_node_gets_the_default_conf_and_an_edited_one_stays(tmp_path, admin_conf):
    root = node(tmp_path / "root", admin_conf, conf=False)
    before = snapshot(root)
    assert cli("install", "podman", "--root", str(root)).returncode == 0
    conf = root / "etc/pyxis-hook/pyxis.conf"
    assert conf.read_text() == cli("config", "default").stdout
    conf.write_text(conf.read_text() + 'log-level = "debug"\n')
    r = cli("uninstall", "podman", "--root", str(root))
    assert r.returncode == 0 and "left /etc/pyxis-hook/pyxis.conf" in r.stdout
    conf.unlink()
    conf.parent.rmdir()
    assert snapshot(root) == before


def test_two_engines_share_the_launcher_until_the_last_goes(tmp_path, admin_conf):
    root = node(tmp_path / "root", admin_conf)
    before = snapshot(root)
    for e in ("podman", "enroot"):
        assert cli("install", e, "--root", str(root)).returncode == 0
    assert cli("uninstall", "podman", "--root", str(root)).returncode == 0
    assert (root / LAUNCHER.lstrip("/")).is_file() and (root / "etc/enroot/hooks.d/98-pyxis-hook.sh").is_file()
    assert cli("uninstall", "enroot", "--root", str(root)).returncode == 0
    assert snapshot(root) == before


def test_apptainer_and_containerd_cannot_share_the_spec(tmp_path, admin_conf):
    root = node(tmp_path / "root", admin_conf)
    assert cli("install", "containerd", "--root", str(root)).returncode == 0
    r = cli("install", "apptainer", "--root", str(root))
    assert r.returncode == 2 and "uninstall containerd" in r.stderr


def test_a_link_out_of_the_root_is_not_followed(tmp_path, admin_conf):
    root = node(tmp_path / "root", admin_conf)
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "usr").mkdir()
    (root / "usr/share").symlink_to(outside)  # absolute: means /ROOT/<outside> under the root
    before = snapshot(root)
    r = cli("install", "podman", "--root", str(root))  # /ROOT/<outside> is missing: refused, nothing written
    assert r.returncode == 2 and "/usr/share: a link to a missing directory" in r.stderr
    assert snapshot(root) == before and list(outside.iterdir()) == []
    (root / str(outside).lstrip("/")).mkdir(parents=True)
    assert cli("install", "podman", "--root", str(root)).returncode == 0
    assert list(outside.iterdir()) == []
    assert (root / str(outside).lstrip("/") / "containers/oci/hooks.d/pyxis-hook.json").is_file()


def test_a_file_install_changes_comes_back_byte_for_byte_even_when_not_utf8(tmp_path, admin_conf):
    """NVIDIA's enroot hook with a Latin-1 byte in a comment: backed up, stubbed, restored as it was."""
    root = node(tmp_path / "root", admin_conf)
    nv = root / "etc/enroot/hooks.d/98-nvidia.sh"
    nv.write_bytes(nv.read_bytes() + b"# Copyright \xa9 NVIDIA\n")
    before = snapshot(root)
    r = cli("install", "enroot", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert b"\xa9" not in nv.read_bytes()  # the stub
    r = cli("uninstall", "enroot", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before


def test_a_directory_install_made_and_someone_removed_is_made_again(tmp_path, admin_conf):
    root = node(tmp_path / "root", admin_conf)
    before = snapshot(root)
    assert cli("install", "podman", "--root", str(root)).returncode == 0
    shutil.rmtree(root / "usr/libexec/pyxis-hook")
    r = cli("install", "podman", "--root", str(root))
    assert r.returncode == 0 and f"created directory {os.path.dirname(LAUNCHER)}" in r.stdout, r.stderr
    assert parse_launcher((root / LAUNCHER.lstrip("/")).read_text()) is not None
    assert cli("uninstall", "podman", "--root", str(root)).returncode == 0
    assert snapshot(root) == before


def test_a_write_that_fails_is_one_line_and_uninstall_takes_back_what_was_written(tmp_path, admin_conf, monkeypatch,
                                                                                   capsys):
    """install stops at the first write that fails; the record holds what it wrote, so uninstall restores the tree
    (and no copy of a file it never replaced stays behind)."""
    from pyxis_hook import cli as main_cli
    from pyxis_hook.engines.installstate import NodeTree

    root = node(tmp_path / "root", admin_conf)
    before = snapshot(root)
    real_put = NodeTree.put

    def put(self, path, content, mode):
        if path == "/etc/containerd/config.toml":
            raise OSError(13, "Permission denied")
        real_put(self, path, content, mode)

    monkeypatch.setattr(NodeTree, "put", put)
    assert main_cli.main(["install", "containerd", "--root", str(root)]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert (root / LAUNCHER.lstrip("/")).exists()  # written before the failure
    assert not (root / "var/lib/pyxis-hook/backup/etc/containerd/config.toml").exists()
    monkeypatch.setattr(NodeTree, "put", real_put)
    r = cli("uninstall", "containerd", "--root", str(root))
    assert r.returncode == 0 and "not installed" not in r.stdout, r.stdout + r.stderr
    assert snapshot(root) == before


def test_uninstall_all_takes_back_every_engine_installed(tmp_path, admin_conf):
    """What removing the package runs: every engine the record lists, the tree as it was before."""
    root = node(tmp_path / "root", admin_conf)
    before = snapshot(root)
    for engine in ("podman", "enroot", "containerd"):
        assert cli("install", engine, "--root", str(root)).returncode == 0
    r = cli("uninstall", "all", "--root", str(root))
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before
    r = cli("uninstall", "all", "--root", str(root))
    assert r.returncode == 0 and "not installed" in r.stdout
