"""CUDA forward compat for CDI containers, end to end with real podman (`--device KIND=N`).

The spec from `cdi generate` carries `--host-driver-version=` on its
update-ldcache hook; the hook reads the image's /usr/local/cuda/compat
(a fake forward-compat libcuda of driver 999.10.01 answering
cuDriverGetVersion=12080, the host's fake driver answering 12020) and puts
it first in the image's ld.so.cache, in both ldcache modes; with
`cuda-compat = "disabled"` in pyxis.conf, or an older compat libcuda, the
host's libcuda is loaded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, make_host
from e2e.test_podman import TEST_KIND, _cli, podman_run
from fixtures.fakedriver import CUDA_C, _lib

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (.ci/run installs it)")]

COMPAT = "usr/local/cuda/compat"
PROBE = "/usr/bin/gputest; ldconfig -p | grep 'libcuda.so.1 '"


def _compat_rootfs(dest: Path, name: str = "libcuda.so.999.10.01") -> Path:
    rootfs = fresh_rootfs(dest)
    d = rootfs / COMPAT
    d.mkdir(parents=True)
    (d / name).write_bytes(_lib(CUDA_C % {"cuda": 12080}, "libcuda.so.1", name).read_bytes())
    os.symlink(name, d / "libcuda.so.1")
    return rootfs


@pytest.fixture
def spec_for(tmp_path):
    """spec_for(**pyxis.conf keys) -> a CDI spec of a test-only kind in /var/run/cdi (removed afterwards)."""
    made: list[Path] = []

    def make(**conf) -> Path:
        host = make_host(tmp_path / "host")
        host.write_conf(cdi_kind=TEST_KIND, **conf)
        os.makedirs("/var/run/cdi", exist_ok=True)
        path = Path(f"/var/run/cdi/pyxis-test-{os.getpid()}-{tmp_path.name[-10:]}.json")
        _cli(host.conf, "cdi", "generate", "--output", str(path))
        made.append(path)
        return host

    yield make
    for p in made:
        p.unlink(missing_ok=True)


def _lines(out: str) -> list[str]:
    return [x for x in out.splitlines() if "libcuda.so.1 " in x]


@pytest.mark.parametrize("ldcache", ["merge", "ldconfig"])
def test_cdi_container_loads_the_newer_compat_libcuda(tmp_path, spec_for, ldcache):
    host = spec_for(ldcache=ldcache)
    r = podman_run(tmp_path / "nohooks", _compat_rootfs(tmp_path / "r"), "--device", f"{TEST_KIND}=0",
                   script=PROBE)
    assert r.returncode == 0, r.stderr
    assert "cuDriverGetVersion=12080 rc=0" in r.stdout, r.stdout
    lines = _lines(r.stdout)
    assert lines[0].endswith("=> /usr/local/cuda/compat/libcuda.so.1"), lines
    assert any(x.endswith("/lib/x86_64-linux-gnu/libcuda.so.1") for x in lines[1:]), lines
    assert "cuda-compat: /usr/local/cuda/compat comes first" in (host.base / "hook.log").read_text()


@pytest.mark.parametrize("how", ["disabled-at-start", "older"])
def test_cdi_container_keeps_the_host_libcuda(tmp_path, spec_for, how):
    """disabled in the pyxis.conf the hook reads (the spec is unchanged), or a compat copy older than the host."""
    host = spec_for()
    name = "libcuda.so.999.10.01"
    if how == "disabled-at-start":
        host.write_conf(cdi_kind=TEST_KIND, cuda_compat="disabled")
    else:
        name = "libcuda.so.470.57.02"
    r = podman_run(tmp_path / "nohooks", _compat_rootfs(tmp_path / "r", name), "--device", f"{TEST_KIND}=0",
                   script=PROBE)
    assert r.returncode == 0, r.stderr
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout, r.stdout
    assert not any("/usr/local/cuda/compat" in x for x in _lines(r.stdout)), r.stdout
    log = (host.base / "hook.log").read_text()
    assert ("cuda-compat = 'disabled'" if how == "disabled-at-start" else "not newer than the host driver") in log
