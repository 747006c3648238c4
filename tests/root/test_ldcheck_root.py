"""Root tests: ldcheck: each cause of "CUDA does not see the GPU" inside an image gives its exact finding.

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/diag/test_ldcheck.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import jsonschema
import pytest
from fixtures.container import make_rootfs
from pyxis_hook import cli
from pyxis_hook.spec.schemafiles import load_schema
from unit.diag.test_ldcheck import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    LIBDIR,
    VERSION,
    _inject_copy,
    _loaded_by_ld_so,
    check,
    host,
    image,
    put_lib,
)


@pytest.mark.root
def test_cli_pid_sees_files_not_injected(host, image, tmp_path, capsys):
    """--pid on a process chrooted into the image: nothing injected, so each library is reported."""
    import time

    cfg, _, _ = host
    conf = tmp_path / "pyxis.conf"  # the process lives in the real /proc
    conf.write_text(f'driver-root = "{cfg.driver_root}"\nproc-root = "/proc"\ndev-root = "{cfg.dev_root}"\n'
                    f'snapshot-dir = "{tmp_path / "snap"}"\n')
    proc = subprocess.Popen([shutil.which("chroot") or "/usr/sbin/chroot", str(image), "/bin/sh", "-c", "read x"],
                            stdin=subprocess.PIPE, env={"NVIDIA_VISIBLE_DEVICES": "all", "PATH": "/bin"})
    try:
        for _ in range(500):  # until chroot has exec'ed the shell inside the image
            if os.readlink(f"/proc/{proc.pid}/root") == str(image):
                break
            time.sleep(0.01)
        rc = cli.main(["--config", str(conf), "ldcheck", "--pid", str(proc.pid), "--json"])
    finally:
        proc.communicate(b"\n", timeout=10)
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, load_schema("ldcheck.schema.json"))
    assert rc == 1 and doc["source"] == "pid"
    missing = [f for f in doc["findings"] if f["code"] == "not-injected"]
    assert any(f["what"] == f"/{LIBDIR}/libcuda.so.{VERSION} is missing in the running container" for f in missing)


@pytest.mark.root
@pytest.mark.parametrize("case", ["clean", "stub", "fatal", "wrong-class"])
def test_oracle_glibc_loads_what_ldcheck_predicts(host, tmp_path, case):
    image = make_rootfs(tmp_path / "img", gputest=True)
    env = {}
    if case == "stub":
        put_lib(image, "usr/local/cuda/lib64/stubs", "libcuda.so.1")
        env["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64/stubs"
    elif case == "fatal":
        (image / "opt/broken").mkdir(parents=True)
        (image / "opt/broken/libcuda.so.1").write_bytes(b"\x7fELF\x02\x01\x01")
        env["LD_LIBRARY_PATH"] = "/opt/broken"
    elif case == "wrong-class":
        put_lib(image, "opt/lib", "libcuda.so.1", m32=True)
        env["LD_LIBRARY_PATH"] = "/opt/lib"
    predicted = check(host, image, env, source="rootfs")
    res = next(x for x in predicted.libraries if x.soname == "libcuda.so.1")
    _inject_copy(host, image)
    loaded, stdout = _loaded_by_ld_so(image, env)
    if case == "fatal":
        assert res.outcome == "fatal"
        assert "libcuda: /opt/broken/libcuda.so.1: file too short" in stdout
        assert loaded == ""
    else:
        # ldconfig may record /lib/<triplet>/X where the merge records /usr/lib/<triplet>/X: same file
        assert os.path.realpath(image / loaded.lstrip("/")) == os.path.realpath(image / res.path.lstrip("/")), \
            (loaded, stdout, res)
        assert (case == "stub") == (res.outcome == "image")
        if case != "stub":
            assert "cuDriverGetVersion=12020" in stdout
