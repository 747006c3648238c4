"""The launcher `pyxis-hook install` writes, run as an engine runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pyxis_hook.engines.launcher import launcher_text, parse_launcher

MAIN = Path(__file__).resolve().parents[3] / "pyxis_hook" / "__main__.py"


def _launcher(tmp_path: Path, main: str) -> Path:
    path = tmp_path / "pyxis-hook"
    path.write_text(launcher_text(sys.executable, main))
    path.chmod(0o755)
    return path


def test_it_runs_the_package_it_names(tmp_path):
    launcher = _launcher(tmp_path, str(MAIN))
    assert parse_launcher(launcher.read_text()) == (sys.executable, str(MAIN))
    r = subprocess.run([str(launcher), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pyxis-hook "), r.stderr


def test_a_package_gone_after_an_upgrade_is_one_line(tmp_path):
    gone = str(tmp_path / "old-venv/lib/site-packages/pyxis_hook/__main__.py")
    r = subprocess.run([str(_launcher(tmp_path, gone)), "prestart"], capture_output=True, text=True, input="{}")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == (f"pyxis-hook: error: {gone} is gone: run `pyxis-hook install ENGINE` "
                        "from the upgraded install\n")
