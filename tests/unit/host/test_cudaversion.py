"""host/cudaversion.py: cuDriverGetVersion of a gcc-built fake libcuda, asked in a child process.

The real Debian libcuda is exercised by the inventory's real-driver tests;
here fake libraries pin down the child protocol and every failure path.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from pyxis_hook.host.cudaversion import (
    cuda_driver_version,
    format_cuda_version,
    parse_cuda_version,
    probe_cuda_driver_version,
)


def build(tmp_path: Path, body: str, name: str = "libcuda.so.1", extra: str = "") -> str:
    src = tmp_path / (name + ".c")
    src.write_text(extra + "\nint cuDriverGetVersion(int *v) {" + body + "}\n")
    out = tmp_path / name
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{name}", str(src), "-o", str(out)], check=True)
    return str(out)


def test_fake_libcuda(tmp_path):
    lib = build(tmp_path, "*v = 12040; return 0;")
    assert cuda_driver_version(lib) == 12040
    assert probe_cuda_driver_version(lib) == (12040, None)


def test_runs_in_a_child_with_an_empty_environment(tmp_path, monkeypatch):
    # The fake reports whether it saw any environment and its pid; the hook process stays clean.
    lib = build(tmp_path, "extern char **environ; *v = (environ[0] == 0 ? 11000 : 11990) + (getpid() == PARENT ? 1 : 0); return 0;",
                extra=f"#include <unistd.h>\n#define PARENT {os.getpid()}")
    monkeypatch.setenv("LD_PRELOAD", "")
    assert cuda_driver_version(lib) == 11000
    maps = Path("/proc/self/maps").read_text()
    assert lib not in maps


def test_error_result(tmp_path):
    lib = build(tmp_path, "return 3; /* CUDA_ERROR_NOT_INITIALIZED */")
    version, reason = probe_cuda_driver_version(lib)
    assert version is None and reason == f"{lib}: cuDriverGetVersion returned CUresult 3"
    assert cuda_driver_version(lib) is None


def test_zero_version(tmp_path):
    lib = build(tmp_path, "*v = 0; return 0;")
    assert probe_cuda_driver_version(lib) == (None, f"{lib}: cuDriverGetVersion gave version 0")


def test_missing_symbol(tmp_path):
    src = tmp_path / "x.c"
    src.write_text("int other(void) { return 1; }\n")
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    version, reason = probe_cuda_driver_version(str(lib))
    assert version is None and reason.startswith(f"{lib}: probe failed: AttributeError")


def test_not_a_library(tmp_path):
    f = tmp_path / "libcuda.so.1"
    f.write_text("not ELF\n")
    version, reason = probe_cuda_driver_version(str(f))
    assert version is None and reason.startswith(f"{f}: probe failed: OSError")


def test_missing_file(tmp_path):
    assert probe_cuda_driver_version(str(tmp_path / "nope")) == (None, f"{tmp_path}/nope: no such file")


def test_crash_is_reported(tmp_path):
    lib = build(tmp_path, "*(volatile int *)0 = 1; return 0;")
    version, reason = probe_cuda_driver_version(lib)
    assert version is None and reason == f"{lib}: probe killed by signal 11"


@pytest.mark.slow
def test_hang_times_out(tmp_path):
    lib = build(tmp_path, "for (;;) sleep(1); return 0;", extra="#include <unistd.h>")
    version, reason = probe_cuda_driver_version(lib, timeout=1)
    assert version is None and reason == f"{lib}: cuDriverGetVersion did not answer within 1 s"


@pytest.mark.parametrize("v,s", [(12020, "12.2"), (11080, "11.8"), (12040, "12.4"), (10010, "10.1"), (13000, "13.0")])
def test_format(v, s):
    assert format_cuda_version(v) == s
    assert parse_cuda_version(s) == v


@given(st.integers(1, 99), st.integers(0, 9))
def test_format_parse_round_trip(major, minor):
    v = major * 1000 + minor * 10
    assert parse_cuda_version(format_cuda_version(v)) == v


@pytest.mark.parametrize("bad", ["", "12", "12.x", "a.b", "1.2.3.4"])
def test_parse_rejects(bad):
    assert parse_cuda_version(bad) is None


@pytest.mark.realdriver
@pytest.mark.slow
@pytest.mark.parametrize("line,expected", [("535", 12020), ("470", 11040)])
def test_real_debian_libcuda(line, expected):
    """The real driver answers without a GPU or kernel module (Debian's 535 and 470 packages)."""
    from fixtures import realdriver

    realdriver.require_driver_root(line, "debian")  # skips outside CI only; in CI a failed download fails
    tree = realdriver.extract(line) / realdriver.TRIPLET_DIR
    version = realdriver.driver_version(line)
    (lib,) = list(tree.rglob(f"libcuda.so.{version}"))
    assert cuda_driver_version(str(lib)) == expected
