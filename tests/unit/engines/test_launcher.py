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


def test_a_package_at_the_root_puts_the_root_on_the_path_never_the_working_directory(tmp_path):
    """For /pyxis_hook/__main__.py the package's parent is '/', not '' (the bundle, where runc starts hooks)."""
    text = launcher_text(sys.executable, "/pyxis_hook/__main__.py")
    line = next(ln for ln in text.splitlines() if ln.startswith("sys.path.insert"))
    scope = {"MAIN": "/pyxis_hook/__main__.py", "sys": type("S", (), {"path": []})}
    exec(line, scope)
    assert scope["sys"].path == ["/"]


def test_a_missing_module_other_than_the_package_is_not_called_an_upgrade(tmp_path):
    """A ModuleNotFoundError from inside the package (a dependency gone) keeps its own traceback and name."""
    pkg = tmp_path / "site" / "pyxis_hook"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "__main__.py").write_text("import a_module_nobody_has\n")
    r = subprocess.run([str(_launcher(tmp_path, str(pkg / "__main__.py"))), "prestart"], capture_output=True, text=True)
    assert r.returncode == 1 and "No module named 'a_module_nobody_has'" in r.stderr and "is gone" not in r.stderr
