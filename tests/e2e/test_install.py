"""A real `pip install .` into a fresh venv: the registered hook command works from there.

The hook runs as `python -I -S <site-packages>/pyxis_hook/__main__.py`: no site
scan, so the venv's own site-packages (pyelftools, for the node artifact's build)
and `share/pyxis-hook/schemas` must be found without `site`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.conftest import make_host
from fixtures.oci_state import state_json

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    d = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(d)], check=True)
    r = subprocess.run([str(d / "bin/pip"), "install", "-q", "--disable-pip-version-check", str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    (d / "pip-wrote").write_bytes((d / "bin/pyxis-hook").read_bytes())  # before any run rewrites it
    return d


def test_installed_hook_command_builds_the_node_artifact_and_plans(venv, tmp_path):
    host = make_host(tmp_path)
    doc = json.loads(subprocess.run([str(venv / "bin/pyxis-hook"), "hookd"], capture_output=True, text=True,
                                    check=True).stdout)
    argv = doc["hook"]["args"]
    # the venv's own interpreter link (python or python3: whichever pip's script names), not the base one
    assert argv[0].startswith(str(venv / "bin") + "/python") and argv[1:3] == ["-I", "-S"]
    assert argv[3].startswith(str(venv)) and argv[3].endswith("pyxis_hook/__main__.py")
    env = {"PATH": "/usr/bin:/bin", "PYXIS_HOOK_CONFIG": str(host.conf)}
    # `plan` through the same -I -S entry: config schema (share/), snapshot build (pyelftools) both found
    bundle = tmp_path / "b"
    from fixtures.container import make_bundle

    make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=0",))
    r = subprocess.run([*argv[:4], "plan", "--bundle", str(bundle), "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)["plan"]
    assert "/dev/nvidia0" in [d["path"] for d in plan["devices"]]
    assert list((host.base / "snapshot").glob("inventory-*.json")), "node artifact not written"
    # the void path from the installed copy
    state = state_json(bundle, id="x")
    make_bundle(bundle, env=())
    r = subprocess.run(argv, input=state, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stderr == ""


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def test_installed_main_finds_the_venv_under_isolated_mode(venv):
    """`<venv>/bin/python -I -S <site>/pyxis_hook/__main__.py`: no `site`, yet sys.prefix is the venv and
    pyelftools (needed when the node artifact must be rebuilt) comes from the venv's site-packages."""
    site = _site_packages(venv)
    main = site / "pyxis_hook" / "__main__.py"
    py = venv / "bin" / "python"
    assert main.is_file(), sorted(p.name for p in site.iterdir())
    r = subprocess.run([str(py), "-I", "-S", str(main), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pyxis-hook "), r.stderr
    # what `hookd` registers: the venv's interpreter and the installed copy's __main__.py, not the checkout's
    doc = json.loads(subprocess.run([str(venv / "bin/pyxis-hook"), "hookd"], capture_output=True, text=True,
                                    check=True).stdout)
    path, args = doc["hook"]["path"], doc["hook"]["args"]
    assert Path(path).parent == venv / "bin" and Path(path).name.startswith("python") and args[0] == path
    assert args[1:4] == ["-I", "-S", str(main)] and args[4:] == ["prestart"]
    # without __main__.py's own path setup the venv's packages are out of reach (so the next check means something)
    bare = subprocess.run([path, "-I", "-S", "-c", "import elftools"], capture_output=True, text=True)
    assert bare.returncode != 0 and "ModuleNotFoundError" in bare.stderr
    # run the file as the hook does (as a file, no package: runpy.run_path), then look at what it set up
    probe = (f"import json, runpy, sys\n"
             f"sys.argv = [{str(main)!r}, '--version']\n"
             f"try:\n    runpy.run_path({str(main)!r}, run_name='__main__')\n"
             f"except SystemExit as e:\n    assert e.code in (0, None), e.code\n"
             f"import elftools, pyxis_hook\n"
             f"print(json.dumps({{'prefix': sys.prefix, 'exec_prefix': sys.exec_prefix, 'path': sys.path,\n"
             f"                  'elftools': elftools.__file__, 'pyxis_hook': pyxis_hook.__file__}}))\n")
    r = subprocess.run([path, "-I", "-S", "-c", probe], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    seen = json.loads(r.stdout.splitlines()[-1])
    assert seen["prefix"] == seen["exec_prefix"] == str(venv)
    assert str(site) in seen["path"]
    assert seen["elftools"].startswith(str(site) + "/") and seen["pyxis_hook"].startswith(str(site) + "/")


def test_installed_command_is_left_as_pip_wrote_it_and_registers_the_fast_form(venv, tmp_path):
    """pip's `pyxis-hook` is never rewritten (its RECORD hash holds); what it registers runs `-I -S`."""
    pip_wrote = (venv / "pip-wrote").read_bytes()
    script = venv / "bin/pyxis-hook"
    script.write_bytes(pip_wrote)  # as pip left it, whatever ran before
    script.chmod(0o755)
    r = subprocess.run([str(script), "--version"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("pyxis-hook "), r.stderr
    assert script.read_bytes() == pip_wrote
    # the registered form: the hooks.d document, a plan (pyelftools for the node artifact) and a void prestart
    doc = json.loads(subprocess.run([str(script), "hookd"], capture_output=True, text=True, check=True).stdout)
    assert doc["hook"]["args"][1:3] == ["-I", "-S"]
    host = make_host(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "PYXIS_HOOK_CONFIG": str(host.conf)}
    from fixtures.container import make_bundle

    bundle = tmp_path / "b"
    make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=0",))
    r = subprocess.run([str(script), "plan", "--bundle", str(bundle), "--json"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, r.stderr
    assert "/dev/nvidia0" in [d["path"] for d in json.loads(r.stdout)["plan"]["devices"]]
    make_bundle(bundle, env=())
    r = subprocess.run([str(script), "prestart"], input=state_json(bundle, id="y"), capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0 and r.stderr == ""
    registered = [*doc["hook"]["args"][:4], "prestart"]
    r = subprocess.run(registered, input=state_json(bundle, id="z"), capture_output=True, text=True, env=env)
    assert r.returncode == 0 and r.stderr == ""
    assert script.read_bytes() == pip_wrote
