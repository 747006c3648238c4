"""setup.cfg's acyclic contract, run by import-linter on a small package: it fails on each cycle, passes without.

The package under test is written to tmp_path; the contract is the repo's
own section (`[importlinter:contract:acyclic]`), only its `ancestors` pointed
at that package and its allowances for pyxis_hook's imports left out, with
the repo's top-level options (`exclude_type_checking_imports`).
"""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PKG = "cyclepkg"

#: module -> source; the cycles: fn.a <-> fn.b (the way back inside a function), deep.inner.x <-> deep.inner.y
#: (two levels down); typed.c -> typed.d with d's way back only under TYPE_CHECKING, clean.e -> clean.f
FILES = {
    "fn/a.py": f"from {PKG}.fn import b\n",
    "fn/b.py": f"def late():\n    from {PKG}.fn import a\n    return a\n",
    "deep/inner/x.py": f"from {PKG}.deep.inner import y\n",
    "deep/inner/y.py": f"from {PKG}.deep.inner import x\n",
    "typed/c.py": f"from {PKG}.typed import d\n",
    "typed/d.py": f"TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from {PKG}.typed import c\n",
    "clean/e.py": f"from {PKG}.clean import f\n",
    "clean/f.py": "",
}


def _write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / PKG / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for directory in [root / PKG, *(p for p in (root / PKG).rglob("*") if p.is_dir())]:
        (directory / "__init__.py").touch()


def _lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on `root`'s package with the repo's acyclic contract; its exit status and output."""
    pytest.importorskip("importlinter", reason="import-linter >= 2.17 needs Python 3.11 (setup.cfg, the test extra)")
    repo = configparser.ConfigParser()
    repo.read(REPO / "setup.cfg")
    cfg = configparser.ConfigParser()
    cfg["importlinter"] = {"root_package": PKG,
                           "exclude_type_checking_imports": repo["importlinter"]["exclude_type_checking_imports"]}
    contract = dict(repo["importlinter:contract:acyclic"])
    contract.pop("ignore_imports", None)
    contract["ancestors"] = PKG
    cfg["importlinter:contract:acyclic"] = contract
    with open(root / "importlinter.ini", "w") as f:
        cfg.write(f)
    code = ("import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(config_filename='importlinter.ini', no_cache=True, no_logo=True))")
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)


def test_the_contract_is_acyclic_siblings_over_the_whole_package():
    repo = configparser.ConfigParser()
    repo.read(REPO / "setup.cfg")
    contract = repo["importlinter:contract:acyclic"]
    assert contract["type"] == "acyclic_siblings"
    assert contract["ancestors"].split() == ["pyxis_hook"]
    assert "depth" not in contract  # import-linter's default, 10 levels: deeper than the package goes


def test_each_cycle_breaks_the_contract_and_only_those(tmp_path):
    _write_package(tmp_path, FILES)
    r = _lint(tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    broken = {line.split()[-1].rstrip(".") for line in out.splitlines() if line.startswith("No cycles are allowed in")}
    assert broken == {f"{PKG}.fn", f"{PKG}.deep.inner"}, out


def test_without_the_ways_back_the_contract_is_kept(tmp_path):
    files = dict(FILES)
    files["fn/b.py"] = "def late():\n    return None\n"
    files["deep/inner/y.py"] = ""
    _write_package(tmp_path, files)
    r = _lint(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "KEPT" in r.stdout
