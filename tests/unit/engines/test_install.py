"""engines/install.py: the atomic, no-follow writer of hooks.d files, CDI specs and the enroot shim."""

from __future__ import annotations

import os
import stat

import pytest

from pyxis_hook.errors import UsageError
from pyxis_hook.engines.install import install_text


def test_mode_is_exact_whatever_the_umask(tmp_path):
    old = os.umask(0o077)
    try:
        path = install_text(str(tmp_path / "shim.sh"), "#!/bin/sh\n", 0o755)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o755
    assert open(path).read() == "#!/bin/sh\n"


def test_planted_link_at_the_temp_name_is_refused(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    target = tmp_path / "hook.json"
    (tmp_path / f"hook.json.{os.getpid()}.tmp").symlink_to(victim)
    with pytest.raises(UsageError, match="hook.json: cannot write"):
        install_text(str(target), "{}\n")
    assert victim.read_text() == "keep\n" and not target.exists()


def test_failure_leaves_no_temp_file(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    (d / "x.json").mkdir()  # replacing a directory with a file fails
    with pytest.raises(UsageError):
        install_text(str(d / "x.json"), "{}\n")
    assert sorted(os.listdir(d)) == ["x.json"]


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(UsageError, match=f"{tmp_path}/nope: not a directory"):
        install_text(str(tmp_path / "nope/x.json"), "{}\n")
