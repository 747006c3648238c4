"""The installed `pyxis-hook` command rewrites itself, once, into the form without the site scan."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pyxis_hook
from pyxis_hook.engines import command

REPO = Path(pyxis_hook.__file__).resolve().parents[1]
PY = os.path.abspath(sys.executable)


def pip_form(d: Path, python: str = PY, body: str = command.SHIPPED_BODY, mode: int = 0o755) -> Path:
    """What pip writes from bin/pyxis-hook: `#!<python>` without flags, then the script's body."""
    script = d / "pyxis-hook"
    script.write_text(f"#!{python}\n{body}")
    os.chmod(script, mode)
    return script


@pytest.fixture
def prefix(tmp_path) -> tuple[Path, Path]:
    """An installation as pip lays it out: (<prefix>/bin, <prefix>/lib/pythonX.Y/site-packages with a copy of us)."""
    bindir = tmp_path / "prefix" / "bin"
    site = tmp_path / "prefix" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    bindir.mkdir(parents=True)
    shutil.copytree(REPO / "pyxis_hook", site / "pyxis_hook", ignore=shutil.ignore_patterns("__pycache__"))
    for d in (tmp_path, tmp_path / "prefix", bindir, *site.parents, site):
        if str(d).startswith(str(tmp_path)):
            os.chmod(d, 0o755)
    return bindir, site


def test_the_shipped_script_is_the_body_the_rewrite_recognizes():
    assert (REPO / "bin" / "pyxis-hook").read_text() == "#!python\n" + command.SHIPPED_BODY


def test_a_checkout_script_is_never_rewritten():
    """`#!python` (the checkout's own, before pip) names no interpreter."""
    script = REPO / "bin" / "pyxis-hook"
    before = script.read_bytes()
    assert command.why_not(str(script))[0].endswith("not the command as pip installs it")
    assert command.upgrade(str(script)) is False and script.read_bytes() == before


def test_first_run_rewrites_to_the_fast_form_and_it_runs(prefix):
    bindir, site = prefix
    script = pip_form(bindir)
    assert command.why_not(str(script), parent=str(site))[0] == ""
    assert command.upgrade(str(script), parent=str(site)) is True
    text = script.read_text()
    assert text.startswith(f"#!{PY} -IS\n") and text == command.fast_text(PY, str(site))
    assert script.stat().st_mode & 0o7777 == 0o755
    assert [p.name for p in bindir.iterdir()] == ["pyxis-hook"], "a temporary file was left"
    assert command.why_not(str(script), parent=str(site))[0] == "fast"
    # the rewritten command runs the copy installed beside it, and is not rewritten again
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pyxis-hook "), r.stderr
    assert command.upgrade(str(script), parent=str(site)) is False and script.read_text() == text


def test_the_fast_form_runs_without_site_and_finds_the_package(tmp_path):
    """`-IS` as the kernel passes it (one argument) is isolated mode without site, and the body's path finds us."""
    r = subprocess.run([PY, "-IS", "-c", "import sys; print(sys.flags.isolated, sys.flags.no_site, 'site' in sys.modules)"],
                       capture_output=True, text=True)
    assert r.stdout.split() == ["1", "1", "False"], r.stderr
    body = command.fast_text(PY).partition("\n")[2].replace("import pyxis_hook.__main__",
                                                             "import pyxis_hook; print(pyxis_hook.__file__)")
    r = subprocess.run([PY, "-IS", "-c", body], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == pyxis_hook.__file__, r.stderr


def test_a_link_to_the_command_rewrites_the_file_it_names(tmp_path, prefix):
    bindir, site = prefix
    script = pip_form(bindir)
    link = tmp_path / "pyxis-hook"
    link.symlink_to(script)
    assert command.upgrade(str(link), parent=str(site)) is True
    assert link.is_symlink() and script.read_text() == command.fast_text(PY, str(site))


@pytest.mark.parametrize("case", ["edited", "flags", "group-writable", "open-dir", "not-ours", "no-interpreter",
                                  "too-long", "not-a-file", "other-interpreter", "package-elsewhere",
                                  "open-package-dir"])
def test_what_is_never_rewritten(tmp_path, prefix, case):
    """Each refusal leaves the file as it was, and says why."""
    bindir, site = prefix
    parent = str(site)
    euid = os.geteuid()
    if case == "edited":
        script, want = pip_form(bindir, body=command.SHIPPED_BODY + "# mine\n"), "not the command as pip installs it"
    elif case == "flags":
        script, want = pip_form(bindir, python=f"{PY} -E"), "not a plain executable path"
    elif case == "group-writable":
        script, want = pip_form(bindir, mode=0o775), "writable by group or others"
    elif case == "open-dir":
        script, want = pip_form(bindir), "writable by group or others"
        os.chmod(bindir, 0o777)
    elif case == "not-ours":
        script, want = pip_form(bindir), "not the caller's own file"
        euid += 1
    elif case == "no-interpreter":
        script, want = pip_form(bindir, python=str(tmp_path / "gone" / "python")), "not a plain executable path"
    elif case == "too-long":
        deep = tmp_path / ("d" * 120) / ("e" * 120)
        deep.mkdir(parents=True)
        (deep / "python").symlink_to(PY)
        script, want = pip_form(bindir, python=str(deep / "python")), "256-byte limit"
    elif case == "other-interpreter":  # run by this python, but naming another one
        script, want = pip_form(bindir, python="/bin/sh"), "not by its own interpreter"
    elif case == "package-elsewhere":  # PYTHONPATH or a user site chose another copy for this run
        script, want = pip_form(bindir), "is not the one installed beside it"
        parent = str(REPO)
    elif case == "open-package-dir":
        script, want = pip_form(bindir), f"{site}: not the caller's or root's, or writable by group or others"
        os.chmod(site, 0o777)
    else:
        script, want = bindir / "pyxis-hook", "not the command as pip installs it"
        script.mkdir()
    before = script.read_bytes() if script.is_file() else None
    why = command.why_not(str(script), euid=euid, parent=parent)[0]
    assert want in why and why != "fast"
    if case != "not-ours":  # upgrade() asks for the caller's own euid
        assert command.upgrade(str(script), parent=parent) is False
    assert (script.read_bytes() if script.is_file() else None) == before
    assert [p.name for p in bindir.iterdir()] == ["pyxis-hook"], "a temporary file was left"
    os.chmod(bindir, 0o755)
    os.chmod(site, 0o755)


def test_a_failed_write_leaves_the_command_and_no_temporary_file(prefix, monkeypatch):
    bindir, site = prefix
    script = pip_form(bindir)
    before = script.read_bytes()

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("pyxis_hook.host.snapshot.posix.write", full)
    assert command.upgrade(str(script), parent=str(site)) is False
    assert script.read_bytes() == before and [p.name for p in bindir.iterdir()] == ["pyxis-hook"]


def test_no_rewrite_when_already_running_without_site(tmp_path):
    """Under -S the command is already fast (or was run by hand so): nothing is written."""
    os.chmod(tmp_path, 0o755)
    script = pip_form(tmp_path)
    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from pyxis_hook.engines import command; " \
           f"print(command.upgrade({str(script)!r}))"
    r = subprocess.run([PY, "-S", "-c", code], capture_output=True, text=True)
    assert r.stdout.strip() == "False", r.stderr
    assert script.read_text().startswith(f"#!{PY}\n")


def test_the_rewrite_goes_to_the_directory_checked_not_to_a_path_swapped_since(tmp_path, prefix, monkeypatch):
    """The script's directory is checked and written through one fd: a swap of the path in between changes nothing."""
    bindir, site = prefix
    script = pip_form(bindir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    decoy = pip_form(elsewhere)
    judge = command._judge

    def judge_then_swap(*a):
        answer = judge(*a)
        bindir.rename(tmp_path / "moved")  # the checked directory, under another name now
        bindir.symlink_to(elsewhere)       # and its old path leads somewhere else
        return answer

    monkeypatch.setattr(command, "_judge", judge_then_swap)
    assert command.upgrade(str(script), parent=str(site)) is True
    assert (tmp_path / "moved" / "pyxis-hook").read_text() == command.fast_text(PY, str(site))
    assert decoy.read_text() == f"#!{PY}\n{command.SHIPPED_BODY}"
    assert sorted(p.name for p in elsewhere.iterdir()) == ["pyxis-hook"]
