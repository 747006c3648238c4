"""`pyxis-hook refresh`: the admin's build of the node artifact, its --check and --force, its errors."""

from __future__ import annotations

import os
from pathlib import Path

from fixtures import hosttree
from fixtures.cli import run_cli, write_conf
from fixtures.synthdriver import V, make_driver
from pyxis_hook import errors


def _conf(tmp_path: Path) -> tuple[Path, Path]:
    root = make_driver(tmp_path / "root")
    host = hosttree.make_host_tree(tmp_path / "host", driver_version=V, make_nodes=False)
    conf = write_conf(tmp_path / "pyxis.conf", driver_root=root, proc_root=host.proc_root, dev_root=host.dev_root,
                      snapshot_dir=tmp_path / "snap")
    return conf, root


def _artifacts(tmp_path: Path) -> list[Path]:
    snap = tmp_path / "snap"
    return sorted(snap.glob("inventory-*.json")) if snap.is_dir() else []


def test_refresh_builds_then_leaves_a_fresh_artifact_alone(tmp_path):
    conf, _root = _conf(tmp_path)
    r = run_cli("refresh", "--check", conf=conf)
    assert r.returncode == errors.FINDINGS and "node artifact:" in r.stdout and not _artifacts(tmp_path)
    r = run_cli("refresh", conf=conf)
    assert r.returncode == 0, r.stderr
    (path,) = _artifacts(tmp_path)
    assert f"node artifact {path}: built for driver {V}" in r.stdout and "2 GPUs now" in r.stdout
    assert path.stat().st_mode & 0o777 == 0o644 and path.parent.stat().st_mode & 0o777 == 0o755
    mtime = path.stat().st_mtime_ns
    r = run_cli("refresh", conf=conf)
    assert r.returncode == 0 and r.stdout.strip() == f"node artifact {path}: fresh"
    assert path.stat().st_mtime_ns == mtime
    assert run_cli("refresh", "--check", conf=conf).returncode == 0
    r = run_cli("refresh", "--force", conf=conf)
    assert r.returncode == 0 and "built for driver" in r.stdout and path.stat().st_mtime_ns != mtime


def test_a_driver_upgraded_in_place_makes_refresh_rebuild(tmp_path):
    conf, root = _conf(tmp_path)
    assert run_cli("refresh", conf=conf).returncode == 0
    lib = next(p for p in root.rglob("libcuda.so.*") if not p.is_symlink())
    os.utime(lib, ns=(1, 1))
    r = run_cli("refresh", "--check", conf=conf)
    assert r.returncode == errors.FINDINGS and f"stale: {lib} changed" in r.stdout
    r = run_cli("refresh", conf=conf)
    assert r.returncode == 0 and "rebuilding" in r.stdout and "built for driver" in r.stdout
    assert run_cli("refresh", "--check", conf=conf).returncode == 0


def test_no_driver_is_one_line_and_nothing_written(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    conf = write_conf(tmp_path / "pyxis.conf", driver_root=empty, proc_root=empty, dev_root=empty,
                      snapshot_dir=tmp_path / "snap")
    r = run_cli("refresh", conf=conf)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("pyxis-hook: ")
    assert not _artifacts(tmp_path)
