"""packaging/build: the wheel, the .deb and the .rpm, each built and read back with its own tools.

What an admin installs: the file layout (modules where the distribution's
python3 imports them, the command, the hook files and schemas under
/usr/share/pyxis-hook, pyxis.conf as a conffile), the dependency lines, the
architecture, and builds that give the same bytes twice.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import pyxis_hook

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "packaging" / "build"
VERSION = pyxis_hook.__version__
HOOK_FILES = {"hook.d/pyxis-hook.json", "hook.d/98-pyxis-hook.sh"}
SCHEMAS = {f"schemas/{p.name}" for p in (REPO / "schemas").glob("*.json")}
MODULES = {str(p.relative_to(REPO)) for p in (REPO / "pyxis_hook").rglob("*.py")}


def build(kind: str, out: Path) -> Path:
    p = subprocess.run([sys.executable, str(BUILD), kind, str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.splitlines()[-1])
    assert path.parent == out.resolve() and [x.name for x in out.iterdir()] == [path.name]
    return path


@pytest.fixture(scope="module")
def packages(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("packages")
    kinds = ["wheel", "deb"] + (["rpm"] if shutil.which("rpmbuild") else [])
    return {k: build(k, base / k) for k in kinds}


def _out(*cmd: str) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def test_wheel_holds_the_modules_the_command_and_the_hook_files(packages):
    whl = packages["wheel"]
    assert whl.name == f"pyxis_hook-{VERSION}-py3-none-any.whl"
    names = set(zipfile.ZipFile(whl).namelist())
    data = f"pyxis_hook-{VERSION}.data"
    assert MODULES <= names
    assert f"{data}/scripts/pyxis-hook" in names
    assert {f"{data}/data/share/pyxis-hook/{f}" for f in HOOK_FILES | SCHEMAS} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_deb_layout_control_and_conffile(packages):
    deb = packages["deb"]
    assert deb.name == f"pyxis-hook_{VERSION}_all.deb"
    fields = dict(re.findall(r"(?m)^(\S+): (.*)$", _out("dpkg-deb", "-f", str(deb))))
    assert fields["Package"] == "pyxis-hook" and fields["Version"] == VERSION
    assert fields["Architecture"] == "all"
    assert [d.strip() for d in fields["Depends"].split(",")] == [
        "python3 (>= 3.9)", "python3-pyelftools", "python3-jsonschema", "python3 (>= 3.11) | python3-tomli"]
    listing = _out("dpkg-deb", "-c", str(deb)).splitlines()
    files = {line.split()[-1].removeprefix("./"): line.split()[0] for line in listing}
    site = "usr/lib/python3/dist-packages/"
    assert {site + m for m in MODULES} <= files.keys()
    assert {f"usr/share/pyxis-hook/{f}" for f in HOOK_FILES | SCHEMAS} <= files.keys()
    assert files["usr/bin/pyxis-hook"] == "-rwxr-xr-x"
    assert files["usr/share/pyxis-hook/hook.d/98-pyxis-hook.sh"] == "-rwxr-xr-x"
    assert files["etc/pyxis-hook/pyxis.conf"] == "-rw-r--r--"
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]
    assert all(" root/root " in line for line in listing)
    control = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(control)) as t:
        assert t.extractfile("./conffiles").read().decode() == "/etc/pyxis-hook/pyxis.conf\n"
        assert b"py3compile -p pyxis-hook" in t.extractfile("./postinst").read()
    head = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -xO ./usr/bin/pyxis-hook", shell=True,
                          capture_output=True, check=True).stdout
    assert head.startswith(b"#!/usr/bin/python3\n")
    conf = subprocess.run(f"dpkg-deb --fsys-tarfile {deb} | tar -xO ./etc/pyxis-hook/pyxis.conf", shell=True,
                          capture_output=True, text=True, check=True).stdout
    default = subprocess.run([sys.executable, "-m", "pyxis_hook", "config", "default"], capture_output=True,
                             text=True, check=True, cwd=REPO).stdout
    assert conf == default


def test_rpm_layout_requires_and_config(packages):
    if "rpm" not in packages:
        pytest.skip("rpmbuild not installed (Debian package rpm; .ci/run installs it)")
    rpm = packages["rpm"]
    assert rpm.name == f"pyxis-hook-{VERSION}-1.noarch.rpm"
    assert _out("rpm", "-qp", "--queryformat", "%{ARCH}", str(rpm)) == "noarch"
    requires = {r.split()[0] for r in _out("rpm", "-qpR", str(rpm)).splitlines() if not r.startswith("rpmlib(")}
    assert requires == {"python3", "python3-pyelftools", "python3-jsonschema", "/bin/sh"}  # /bin/sh: the scriptlets
    assert _out("rpm", "-qp", "--recommends", str(rpm)).split() == ["python3-tomli"]
    files = set(_out("rpm", "-qpl", str(rpm)).splitlines())
    site = "/usr/lib/python3.9/site-packages/"
    assert {site + m for m in MODULES} <= files
    assert {f"/usr/share/pyxis-hook/{f}" for f in HOOK_FILES | SCHEMAS} <= files
    assert {"/usr/bin/pyxis-hook", "/etc/pyxis-hook/pyxis.conf"} <= files
    assert not [f for f in files if "__pycache__" in f or f.startswith("/usr/lib/python3/")]
    assert _out("rpm", "-qpc", str(rpm)).split() == ["/etc/pyxis-hook/pyxis.conf"]
    # %config(noreplace): rpm's file flags, RPMFILE_CONFIG (1) | RPMFILE_NOREPLACE (16)
    flags = _out("rpm", "-qp", "--queryformat", "[%{FILENAMES} %{FILEFLAGS}\n]", str(rpm))
    assert re.search(r"(?m)^/etc/pyxis-hook/pyxis\.conf 17$", flags), flags
    modes = _out("rpm", "-qp", "--queryformat", "[%{FILENAMES} %{FILEMODES:perms} %{FILEUSERNAME}\n]", str(rpm))
    assert re.search(r"(?m)^/usr/bin/pyxis-hook -rwxr-xr-x root$", modes), modes


def test_builds_are_reproducible(packages, tmp_path):
    for kind, first in packages.items():
        again = build(kind, tmp_path / kind)
        assert again.read_bytes() == first.read_bytes(), kind


def test_missing_tool_is_one_line_naming_its_debian_package(tmp_path):
    bare = tmp_path / "bin"  # not even git: the date then falls back to a fixed one
    bare.mkdir()
    for kind, tool, pkg in (("deb", "dpkg-deb", "dpkg"), ("rpm", "rpmbuild", "rpm")):
        p = subprocess.run([sys.executable, str(BUILD), kind, str(tmp_path / "out")], capture_output=True, text=True,
                           env={"PATH": str(bare)})
        assert p.returncode == 1
        assert p.stderr.count("\n") == 1 and tool in p.stderr and f"apt-get install {pkg}" in p.stderr, p.stderr
        assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_an_outdir_that_is_a_file_is_one_line_before_anything_is_built(tmp_path):
    (tmp_path / "out").write_text("")
    p = subprocess.run([sys.executable, str(BUILD), "wheel", str(tmp_path / "out")], capture_output=True, text=True)
    assert p.returncode == 1 and p.stderr == f"packaging/build: error: {tmp_path}/out: not a directory\n", p.stderr
