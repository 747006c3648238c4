"""Every command, given bad input: one line naming the bad thing, a non-zero exit, no traceback."""

from __future__ import annotations

import os

import pytest

from fixtures.cli import run_cli
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import fake_gpus, make_host_tree


@pytest.fixture(scope="module")
def conf(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad")
    tree = make_host_tree(base / "host", gpus=fake_gpus(2), driver_version="535.216.03")
    driver = make_fake_driver(base / "driver", version="535.216.03")
    c = base / "pyxis.conf"
    c.write_text(f'driver-root = "{driver}"\ndev-root = "{tree.dev_root}"\nproc-root = "{tree.proc_root}"\n'
                 f'snapshot-dir = "{base}/snap"\n')
    garbage = base / "garbage"
    garbage.write_bytes(b"\x7fELF\x02\x01\x01" + b"\xff" * 9)
    return c, base, garbage


CASES = [
    # (args, stdin, env additions, text the one error line must contain)
    (["ldcache", "--cache", "{base}/nope"], None, {}, "{base}/nope"),
    (["ldcache", "--cache", "{garbage}"], None, {}, "{garbage}"),
    (["ldd", "{base}/nope"], None, {}, "{base}/nope"),
    (["ldd", "{garbage}"], None, {}, "{garbage}"),
    (["ldcheck", "{base}/nope"], None, {}, "{base}/nope"),
    (["plan", "--bundle", "{base}/nope"], None, {}, "{base}/nope/config.json"),
    (["list", "--devices", "7"], None, {}, "7"),
    (["list", "--capabilities", "gfx"], None, {}, "gfx"),
    (["cdi", "generate", "--output", "{base}/no/dir/spec.json"], None, {}, "{base}/no/dir"),
    (["hookd", "--install", "{base}/nope"], None, {}, "{base}/nope"),
    (["precreate"], "not json", {}, "config"),
    (["prestart"], "{{}}", {}, "bundle"),
    (["enroot"], None, {"ENROOT_PID": "", "ENROOT_ROOTFS": ""}, "ENROOT_"),
]


@pytest.mark.parametrize("args, stdin, env, needle", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_bad_input_is_one_line(conf, args, stdin, env, needle):
    c, base, garbage = conf
    fmt = {"base": base, "garbage": garbage}
    argv = [a.format(**fmt) for a in args]
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ENROOT_", "NVIDIA_"))}
    e.update(env)
    r = run_cli(*argv, conf=c, input=stdin.format(**fmt) if stdin is not None else "", env=e, timeout=60)
    assert r.returncode != 0, (argv, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    # ldd words its errors as glibc's loader does ("FILE: error while loading shared libraries: ...")
    assert lines[0].startswith("pyxis-hook: error:") or (argv[0] == "ldd" and "error while loading" in lines[0])
    assert needle.format(**fmt) in lines[0], lines[0]


def _one_line_error(r, needle: str) -> None:
    assert r.returncode != 0, r.stdout
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert needle in r.stderr, r.stderr


def test_a_fifo_or_device_given_as_a_file_is_one_line_never_a_hang(tmp_path):
    """ldcache --cache, ldd, ldcache --root and pyxis.conf: a FIFO is not opened for reading (it would
    block for ever), /dev/zero is not read (it would never end)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _one_line_error(run_cli("ldcache", "--cache", str(fifo), timeout=20), "not a regular file")
    _one_line_error(run_cli("ldcache", "--cache", "/dev/zero", timeout=20), "not a regular file")
    _one_line_error(run_cli("ldd", str(fifo), timeout=20), "not a regular file")
    _one_line_error(run_cli("info", conf=fifo, timeout=20), "not a regular file")
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    os.mkfifo(root / "etc/ld.so.cache")
    _one_line_error(run_cli("ldcache", "--root", str(root), timeout=20), "not a regular file")
