"""A start takes the host's GPUs from the memo only when every look discovery made finds the same."""

from __future__ import annotations

import marshal
import os
from pathlib import Path

import pytest

from fixtures.hosttree import fake_gpus, make_host_tree
from pyxis_hook.host import gpulooks, gpumemo, gpuscan
from pyxis_hook.spec.config import Config

ROOT = os.geteuid() == 0


def _host(tmp_path: Path, n: int = 4, **kw):
    tree = make_host_tree(tmp_path / "host", gpus=fake_gpus(n), make_nodes=ROOT, **kw)
    snap = tmp_path / "snap"
    snap.mkdir(mode=0o755)
    return tree, Config(proc_root=tree.proc_root, dev_root=tree.dev_root, snapshot_dir=str(snap))


def _fresh(cfg: Config):
    return gpuscan.discover_gpus(cfg.proc_root, cfg.dev_root)


def _no_discovery(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("discovered: the memo was not used")

    monkeypatch.setattr(gpuscan, "discover_gpus", refuse)


def test_every_look_is_kept_and_replays_on_an_unchanged_host(tmp_path):
    tree, cfg = _host(tmp_path)
    r = gpulooks.Reader()
    gpuscan.discover_gpus(cfg.proc_root, cfg.dev_root, r)
    kinds = {k for k, _p, _f in r.seen}
    assert {"read", "list", "dir", "stat"} <= kinds
    infos = [p for k, p, _f in r.seen if k == "read" and p.endswith("/information")]
    assert len(infos) == 4
    assert gpulooks.replay(r.seen)
    assert gpulooks.replay(marshal.loads(marshal.dumps(r.seen)))  # as the memo keeps them


@pytest.mark.parametrize("change", ["information", "gpu-gone", "gpu-added", "node", "devices", "version"])
def test_a_changed_look_does_not_replay(tmp_path, change):
    tree, cfg = _host(tmp_path)
    r = gpulooks.Reader()
    gpuscan.discover_gpus(cfg.proc_root, cfg.dev_root, r)
    gpus_dir = Path(cfg.proc_root) / "driver/nvidia/gpus"
    first = sorted(gpus_dir.iterdir())[0]
    if change == "information":
        info = first / "information"
        info.write_text(info.read_text().replace("GPU UUID:", "GPU UUID: x"))
    elif change == "gpu-gone":
        for f in first.iterdir():
            f.unlink()
        first.rmdir()
    elif change == "gpu-added":
        (gpus_dir / "0000:ff:00.0").mkdir()
    elif change == "node":
        node = Path(cfg.dev_root) / "dev/nvidia1"
        if node.exists():
            node.unlink()
        else:
            node.write_text("")
    elif change == "devices":
        devices = Path(cfg.proc_root) / "devices"
        devices.write_text(devices.read_text().replace("nvidia-uvm", "nvidia-uvm-x"))
    else:
        version = Path(cfg.proc_root) / "driver/nvidia/version"
        version.write_text(version.read_text().replace("535", "550"))
    assert not gpulooks.replay(r.seen)


def test_start_gpus_keeps_a_memo_and_uses_it(tmp_path, monkeypatch):
    tree, cfg = _host(tmp_path)
    host, looks = gpumemo.start_gpus(cfg)
    assert host == _fresh(cfg)
    assert os.path.isfile(gpumemo.memo_path(cfg))
    _no_discovery(monkeypatch)
    again, looks2 = gpumemo.start_gpus(cfg)
    assert again == host and looks2 == looks


def test_a_changed_gpu_is_discovered_again_and_the_memo_replaced(tmp_path):
    tree, cfg = _host(tmp_path)
    host, looks = gpumemo.start_gpus(cfg)
    info = sorted((Path(cfg.proc_root) / "driver/nvidia/gpus").iterdir())[1] / "information"
    info.write_text(info.read_text().replace("Model:", "Model: Other"))
    changed, looks2 = gpumemo.start_gpus(cfg)
    assert changed == _fresh(cfg) and changed != host and looks2 != looks
    assert gpumemo.start_gpus(cfg) == (changed, looks2)


@pytest.mark.parametrize("what", ["world-writable", "damaged", "other-code", "not-kept", "not-records"])
def test_a_memo_that_may_not_be_used_is_not(tmp_path, monkeypatch, what):
    tree, cfg = _host(tmp_path)
    path = gpumemo.memo_path(cfg)
    if what == "not-kept":
        gpumemo.start_gpus(cfg, keep=False)
        assert not os.path.exists(path)
        return
    if what == "other-code":  # kept by an install whose discovery code was another (or has been edited since)
        monkeypatch.setattr(gpumemo, "_code", lambda: ((str(tmp_path / "gpuscan.py"), 1, 1),))
    gpumemo.start_gpus(cfg)
    if what == "world-writable":
        os.chmod(path, 0o666)
    elif what == "damaged":
        data = Path(path).read_bytes()
        Path(path).write_bytes(data[:len(data) // 2])
    elif what == "not-records":  # looks that replay, kept beside something that is no HostGpus's dict
        from pyxis_hook.host import snapshot

        code, roots, looks, _host_dict = snapshot.load_kept(path, gpumemo.FORMAT, 1 << 24)
        snapshot.keep(path, gpumemo.FORMAT, (code, roots, looks, "not a dict"))
    calls = []
    real = gpuscan.discover_gpus
    monkeypatch.setattr(gpuscan, "discover_gpus", lambda *a: calls.append(a) or real(*a))
    host, _looks = gpumemo.start_gpus(cfg)
    assert calls and host == _fresh(cfg)


def test_a_memo_of_other_roots_is_not_used(tmp_path, monkeypatch):
    """A memo copied to (or colliding with) another proc-root/dev-root's name is that other host's: a miss."""
    tree, cfg = _host(tmp_path / "a")
    gpumemo.start_gpus(cfg)
    other_tree, other = _host(tmp_path / "b", n=2)
    other = Config(proc_root=other.proc_root, dev_root=other.dev_root, snapshot_dir=cfg.snapshot_dir)
    Path(gpumemo.memo_path(other)).write_bytes(Path(gpumemo.memo_path(cfg)).read_bytes())
    host, _looks = gpumemo.start_gpus(other)
    assert len(host.gpus) == 2 and host == _fresh(other)


def test_no_memo_is_written_where_no_start_would_read_it(tmp_path):
    tree, cfg = _host(tmp_path)
    os.chmod(cfg.snapshot_dir, 0o777)
    gpumemo.start_gpus(cfg)
    assert not os.path.exists(gpumemo.memo_path(cfg))
    os.chmod(cfg.snapshot_dir, 0o755)


def test_a_start_whose_memo_replays_loads_neither_discovery_nor_the_parsers(tmp_path):
    """The memo's hit path replays looks (`gpulooks`) and builds records (`gpus`); nothing else of discovery runs."""
    import subprocess
    import sys

    tree, cfg = _host(tmp_path)
    repo = Path(__file__).resolve().parents[3]
    code = (f"import sys; sys.path.insert(0, {str(repo)!r})\n"
            "from pyxis_hook.host import gpumemo\nfrom pyxis_hook.spec.config import Config\n"
            f"host, _ = gpumemo.start_gpus(Config(proc_root={cfg.proc_root!r}, dev_root={cfg.dev_root!r}, "
            f"snapshot_dir={cfg.snapshot_dir!r}))\n"
            "print(len(host.gpus), sorted(m for m in sys.modules if m.startswith('pyxis_hook.host.')))")
    runs = [subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    first, second = (r.stdout.split(" ", 1) for r in runs)
    assert "'pyxis_hook.host.gpuscan'" in first[1] and "'pyxis_hook.host.gpufiles'" in first[1]  # it discovered
    assert second[0] == "4" and "gpuscan" not in second[1] and "gpufiles" not in second[1], second


def test_a_kept_memo_is_readable_by_its_owner_only(tmp_path):
    """Kept files are root's (or the hook user's) alone: a decision's beside it keeps env values a request read."""
    tree, cfg = _host(tmp_path)
    gpumemo.start_gpus(cfg)
    assert os.stat(gpumemo.memo_path(cfg)).st_mode & 0o777 == 0o600


def test_the_memos_code_names_every_module_discovery_runs():
    """A memo is bound to the code that decided it: every module of ours that code calls into is in `_CODE`."""
    import sys
    import types

    from pyxis_hook.host import gpufiles, gpus

    used = set()
    for mod in (gpus, gpufiles, gpuscan, gpulooks, gpumemo):
        for value in vars(mod).values():
            name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(name, str) and name.startswith("pyxis_hook.") and name in sys.modules:
                used.add(name)
    assert used - {"pyxis_hook.errors", "pyxis_hook.host.snapshot", "pyxis_hook.startimage"} <= set(gpumemo._CODE), used

