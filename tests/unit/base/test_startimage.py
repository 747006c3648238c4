"""The start image: a GPU start's modules executed from one file, exactly when every source is unchanged.

Each case runs a fresh interpreter (`-I -S`, as the runtime runs the hook)
on a small package of its own, so what the image holds, loads and writes
is what a start would see: `sys.modules` from an empty start, the import
system's own finder asked (or not) for each module.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

# Records each module the import system is asked to find (a module run from an image is not).
SPY = """
found = []

class Spy:
    @staticmethod
    def find_spec(name, path=None, target=None):
        found.append(name)
        return None

sys.meta_path.insert(0, Spy)
"""

# Prints what load and save said, which modules the import system had to find, and the loaded
# modules' attributes; the test reads them back with literal_eval (no json import after load:
# it would join the image).
RUNNER = """
import sys
sys.path[:0] = [{repo!r}, {lib!r}]
from pyxis_hook import startimage
""" + SPY + """startimage.load({image!r})
for name in sys.argv[1:]:
    __import__(name)
saved = startimage.save()
import pkgx, pkgx.b
order = [n for n in sys.modules if n.startswith("pkgx")]
ext = sys.modules.get({ext!r})
print(repr(dict(status="\\n".join(startimage.statuses()), saved=saved, value=pkgx.b.VALUE, order=order,
                found=[n for n in found if n.startswith("pkgx")], found_all=found,
                ext_file=getattr(ext, "__file__", None), ext_works=ext is not None and {ext_check},
                b_file=pkgx.b.__file__, b_package=pkgx.b.__package__, b_spec=pkgx.b.__spec__.origin,
                b_initializing=[getattr(sys.modules[n].__spec__, "_initializing", None) for n in ("pkgx", "pkgx.b")],
                pkg_path=pkgx.__path__, pkg_package=pkgx.__package__, parent_has_b=pkgx.b is pkgx.__dict__.get("b"),
                upper={{n: {{k: v for k, v in vars(sys.modules[n]).items() if k.isupper() and k != "VALUE" and not isinstance(v, type)}}
                        for n in sys.argv[1:] if n.startswith("pkgx")}})))
"""


#: an extension module a bare `-I -S` interpreter has not loaded, and a call showing it works
EXTENSION, EXTENSION_CHECK = "_bisect", "ext.bisect_left([1, 3], 2) == 1"


@pytest.fixture
def pkg(tmp_path):
    """A package `pkgx` (b imports a), an image path in a private dir, and a function running a start."""
    lib = tmp_path / "lib"
    (lib / "pkgx").mkdir(parents=True)
    (lib / "pkgx" / "__init__.py").write_text("")
    (lib / "pkgx" / "a.py").write_text("A = 1\n")
    (lib / "pkgx" / "b.py").write_text("from pkgx import a\nVALUE = a.A + 1\n")
    # posix, not os: os is a source module before Python 3.11 (frozen after), and would join the image
    (lib / "pkgx" / "c.py").write_text("import posix\nif posix.access(__file__ + '.fail', posix.F_OK):\n"
                                       "    raise RuntimeError('c refuses')\n")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    image = cache / "start-image.bin"
    script = RUNNER.format(repo=str(REPO), lib=str(lib), image=str(image), ext=EXTENSION,
                           ext_check=EXTENSION_CHECK)

    def start(*modules: str, check: bool = True, flags: tuple[str, ...] = ()) -> dict:
        r = subprocess.run([sys.executable, "-I", "-S", *flags, "-c", script, *modules],
                           capture_output=True, text=True)
        if not check:
            return {"rc": r.returncode, "stderr": r.stderr}
        assert r.returncode == 0, r.stderr
        return ast.literal_eval(r.stdout.strip().splitlines()[-1])

    return lib / "pkgx", image, start


def _bump(path: Path, text: str) -> None:
    """New content and a later mtime, as an edit or an upgrade leaves a source."""
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_start_writes_the_image_and_the_next_one_runs_from_it(pkg):
    src, image, start = pkg
    first = start("pkgx.b")
    assert f"not used: {image}: No such file or directory" in first["status"]
    assert first["saved"].endswith("written, 3 modules")  # pkgx, pkgx.a, pkgx.b
    assert first["found"] == ["pkgx", "pkgx.b", "pkgx.a"]  # b imports a
    assert image.stat().st_mode & 0o777 == 0o644

    second = start("pkgx.b")
    assert second["status"].endswith("3 modules loaded")
    assert second["found"] == []  # the import system was never asked
    assert second["saved"] == ""  # nothing new: no rewrite
    assert second["value"] == 2
    assert second["order"] == ["pkgx", "pkgx.a", "pkgx.b"]  # completion order, as an import leaves it
    # what the import system would have set
    assert second["b_file"] == str(src / "b.py") == second["b_spec"]
    assert second["b_package"] == "pkgx" == second["pkg_package"]
    assert second["pkg_path"] == [str(src)]
    assert second["parent_has_b"]
    # done loading, as `_load_unlocked` marks a spec: a later import of the module then asks it without an
    # AttributeError raised and cleared inside the import statement
    assert first["b_initializing"] == [False, False] == second["b_initializing"]


def test_an_extension_module_is_loaded_by_its_path_without_a_search(pkg):
    import importlib.util

    spec = importlib.util.find_spec(EXTENSION)
    if type(spec.loader).__name__ != "ExtensionFileLoader":
        pytest.skip(f"{EXTENSION} is built into this interpreter")
    src, image, start = pkg
    first = start("pkgx.b", EXTENSION)
    assert EXTENSION in first["found_all"] and "written, 4 modules" in first["saved"]
    second = start("pkgx.b", EXTENSION)
    assert second["status"].endswith("4 modules loaded")
    assert EXTENSION not in second["found_all"]
    assert second["ext_file"] == spec.origin and second["ext_works"]


def test_a_changed_source_makes_the_whole_image_unused_and_rewritten(pkg):
    src, image, start = pkg
    start("pkgx.b")
    _bump(src / "a.py", "A = 41\n")
    stale = start("pkgx.b")
    assert f"stale ({src / 'a.py'} changed)" in stale["status"]
    assert stale["found"] == ["pkgx", "pkgx.b", "pkgx.a"]  # none of the old code ran
    assert stale["value"] == 42
    assert "written, 3 modules" in stale["saved"]
    again = start("pkgx.b")
    assert again["status"].endswith("3 modules loaded") and again["value"] == 42


def test_a_removed_source_makes_the_image_unused(pkg):
    src, image, start = pkg
    start("pkgx.b")
    (src / "a.py").rename(src / "a2.py")
    r = start("pkgx", check=False)  # pkgx.b can no longer import
    assert r["rc"] != 0 and "cannot import name 'a' from 'pkgx'" in r["stderr"]  # not the image's stale copy


def test_the_image_grows_by_what_a_start_of_another_shape_imported(pkg):
    src, image, start = pkg
    start("pkgx.b")
    grown = start("pkgx.b", "pkgx.c")
    assert grown["found"] == ["pkgx.c"]
    assert "written, 4 modules" in grown["saved"]
    mtime = image.stat().st_mtime_ns
    assert start("pkgx.b")["status"].endswith("4 modules loaded")
    assert image.stat().st_mtime_ns == mtime  # a start needing less does not shrink it back


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-python", "empty"])
def test_a_damaged_image_is_ignored_whole(pkg, damage):
    src, image, start = pkg
    start("pkgx.b")
    data = image.read_bytes()
    image.write_bytes({"truncated": data[: len(data) // 2], "garbage": data[:40] + b"\x00" * 200,
                       "other-python": b"\x00\x00\x0d\x0a" + data[4:], "empty": b""}[damage])
    r = start("pkgx.b")
    assert "not used" in r["status"]
    assert r["found"] == ["pkgx", "pkgx.b", "pkgx.a"] and r["value"] == 2
    assert "written, 3 modules" in r["saved"]  # replaced by a good one


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize("what", ["file-mode", "dir-mode", "file-owner", "symlink"])
def test_an_image_others_could_have_written_is_not_run(pkg, what):
    src, image, start = pkg
    start("pkgx.b")
    if what == "file-mode":
        os.chmod(image, 0o664)
    elif what == "dir-mode":
        os.chmod(image.parent, 0o777)
    elif what == "file-owner":
        os.chown(image, 12345, 12345)
    else:
        real = image.with_name("elsewhere.bin")
        image.rename(real)
        image.symlink_to(real)
    r = start("pkgx.b")
    assert "not used" in r["status"], r["status"]
    assert r["found"] == ["pkgx", "pkgx.b", "pkgx.a"]


def test_a_module_that_raises_stops_the_image_and_raises_where_it_is_imported(pkg):
    src, image, start = pkg
    start("pkgx.b", "pkgx.c")
    (src / "c.py.fail").write_text("")
    r = start("pkgx.b", "pkgx.c", check=False)
    assert r["rc"] != 0
    assert "RuntimeError: c refuses" in r["stderr"]
    assert r["stderr"].count("c refuses") == 1 or "During handling" not in r["stderr"]


def test_an_exit_from_a_module_body_ends_the_start_once(pkg):
    """SystemExit (and KeyboardInterrupt) from a module the image runs goes up at once: not run twice."""
    src, image, start = pkg
    (src / "d.py").write_text("import os\nwith open(__file__ + '.runs', 'a') as f:\n    f.write('x')\n"
                              "if os.path.exists(__file__ + '.exit'):\n    raise SystemExit(7)\n")
    start("pkgx.b", "pkgx.d")
    (src / "d.py.runs").unlink()
    (src / "d.py.exit").write_text("")
    r = start("pkgx.b", "pkgx.d", check=False)
    assert r["rc"] == 7, r
    assert (src / "d.py.runs").read_text() == "x"


def test_nothing_is_written_where_python_writes_no_bytecode(pkg):
    src, image, start = pkg
    r = start("pkgx.b", flags=("-B",))
    assert "not writable" in r["saved"] and not image.exists()
    if os.geteuid() != 0:  # root writes through a 0555 dir
        os.chmod(image.parent, 0o555)
        r = start("pkgx.b")
        assert "not writable" in r["saved"] and not image.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")
@pytest.mark.parametrize("how", ["owner", "mode"])
def test_nothing_is_written_where_no_start_could_use_it(pkg, how):
    """A root hook run from a user's package: writing an image no start trusts would repeat every start."""
    src, image, start = pkg
    if how == "owner":
        os.chown(image.parent, 12345, 12345)
    else:
        os.chmod(image.parent, 0o777)
    for _ in range(2):
        r = start("pkgx.b")
        assert "not used" in r["status"] and "not written" in r["saved"], r
    assert not image.exists()


@pytest.mark.parametrize("module, why", [
    ("elftools", "rebuilt the node artifact"),  # discovery ran
    ("jsonschema", "checked pyxis.conf against its schema"),  # no verdict recorded for the file yet
])
def test_a_start_that_was_not_the_steady_state_writes_nothing(pkg, module, why):
    """The image would otherwise run that module on every start."""
    src, image, start = pkg
    (src.parent / module).mkdir()
    (src.parent / module / "__init__.py").write_text("")
    r = start("pkgx.b", module)
    assert why in r["saved"] and not image.exists()


def test_the_package_image_lives_beside_its_bytecode(monkeypatch):
    """One per interpreter: its cache tag, and its build and installation (whose stdlib files it names)."""
    from pyxis_hook import startimage

    path = startimage.image_path()
    assert path.startswith(str(REPO / "pyxis_hook" / "__pycache__") + "/")
    assert sys.implementation.cache_tag in path
    assert startimage.image_path() == path  # stable
    r = subprocess.run([sys.executable, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                        "from pyxis_hook import startimage; print(startimage.image_path())", str(REPO)],
                       capture_output=True, text=True, check=True)
    assert r.stdout.strip() == path  # the hook's own process, another hash seed: the same file
    monkeypatch.setattr(sys, "base_prefix", "/opt/other-python")
    assert startimage.image_path() != path


def test_a_package_importing_its_own_submodule_does_not_stop_the_image(pkg):
    """`json`'s shape: the package completes after the submodule its __init__ imports.

    That submodule waits for its package (imported as usual from the
    package's body); every other module still runs from the image.
    """
    src, image, start = pkg
    pkgy = src.parent / "pkgy"
    pkgy.mkdir()
    (pkgy / "__init__.py").write_text("from pkgy import sub\nY = sub.Z\n")
    (pkgy / "sub.py").write_text("Z = 3\n")
    first = start("pkgy", "pkgx.b")
    assert first["saved"].endswith("written, 5 modules")
    second = start("pkgy", "pkgx.b")
    assert second["status"].endswith("4 modules loaded")  # all but pkgy.sub, which pkgy imported
    assert [n for n in second["found_all"] if n.startswith(("pkgx", "pkgy"))] == ["pkgy.sub"]
    assert second["value"] == 2 and second["saved"] == ""


def test_the_image_holds_no_docstrings_and_keeps_every_assert(pkg):
    """Docstrings are dropped (`-OO`'s only change for a module naming neither `assert` nor `__debug__`)."""
    src, image, start = pkg
    (src / "d.py").write_text('"""Module d."""\n\nDOC = __doc__\n\n\ndef f():\n    """Function f."""\n    return "kept"\n\n\n'
                              'class K:\n    """Class K."""\n\n\nFDOC, FVAL, KDOC = f.__doc__, f(), K.__doc__\n')
    (src / "e.py").write_text('"""Module e."""\n\nDOC = __doc__\ntry:\n    assert False, "on"\n    ASSERTS = False\n'
                              'except AssertionError:\n    ASSERTS = True\nDEBUG = __debug__\n')
    first = start("pkgx.d", "pkgx.e")
    assert first["upper"]["pkgx.d"] == {"DOC": "Module d.", "FDOC": "Function f.", "FVAL": "kept", "KDOC": "Class K."}
    second = start("pkgx.d", "pkgx.e")
    assert second["status"].endswith("3 modules loaded")  # pkgx, d, e
    assert second["upper"]["pkgx.d"] == {"DOC": None, "FDOC": None, "FVAL": "kept", "KDOC": None}
    # a module with an assert runs the bytecode the import system would (its docstrings too)
    assert second["upper"]["pkgx.e"] == {"DOC": "Module e.", "ASSERTS": True, "DEBUG": True}


def test_the_package_itself_has_no_assert_statement():
    """An `assert` in a module keeps all its docstrings in every start image; the checks raise instead."""
    found = []
    for path in (REPO / "pyxis_hook").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(REPO)}:{n.lineno}" for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    assert found == []


BOOT_RUNNER = """
import sys
sys.path[:0] = [{repo!r}, {lib!r}]
from pyxis_hook import startimage
""" + SPY + """startimage.load_boot({image!r})
if "late" not in sys.argv:
    import pkgx.a  # what a run imports before it knows it has GPU work (the dispatch, the no-GPU check)
if "void" not in sys.argv:
    startimage.load({image!r}, "cdi-hook" if "cdi" in sys.argv else "start")
    for name in sys.argv[1:]:
        if name.startswith("pkgx"):
            __import__(name)
saved = startimage.save()
print(repr(dict(saved=saved, status=list(startimage.statuses()),
                mods=sorted(n for n in sys.modules if n.startswith("pkgx")),
                found=[n for n in found if n.startswith("pkgx")])))
"""


def boot_runner(src: Path, image: Path):
    """A function running BOOT_RUNNER on the package at `src` and the image at `image`: its report."""
    script = BOOT_RUNNER.format(repo=str(REPO), lib=str(src.parent), image=str(image))

    def run(*args: str) -> dict:
        r = subprocess.run([sys.executable, "-I", "-S", "-c", script, *args], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return ast.literal_eval(r.stdout.strip().splitlines()[-1])

    return run


def test_the_boot_section_holds_what_was_imported_before_the_start_section(pkg):
    """A no-GPU run runs only the boot section; a start of the same kind that imported more grows the image."""
    src, image, _start = pkg
    run = boot_runner(src, image)
    cold = run("pkgx.b")
    assert cold["found"] == ["pkgx", "pkgx.a", "pkgx.b"] and cold["saved"].endswith("written, 3 modules")
    from pyxis_hook import startimage

    assert startimage.held(str(image), "boot") == ("pkgx", "pkgx.a")
    assert startimage.held(str(image), "start") == ("pkgx.b",)
    void = run("void")  # the no-GPU exit: the boot section only, nothing written
    assert void["found"] == [] and void["mods"] == ["pkgx", "pkgx.a"] and void["saved"] == ""
    assert void["status"] == [f"start image {image}: boot section: 2 modules loaded"]
    other = run("pkgx.c")  # another kind of start: the image grows, keeping what the first one ran
    assert other["found"] == ["pkgx.c"] and other["saved"].endswith("written, 4 modules")
    assert set(startimage.held(str(image), "start")) == {"pkgx.b", "pkgx.c"}
    warm = run("pkgx.b")
    assert warm["found"] == [] and warm["saved"] == ""
    assert warm["status"] == [f"start image {image}: boot section: 2 modules loaded",
                              f"start image {image}: start section: 2 modules loaded"]
    _bump(src / "a.py", "A = 2\n")  # a boot module changed: that section unused and rewritten, the other runs
    changed = run("pkgx.b")
    assert changed["found"] == ["pkgx", "pkgx.a"] and "stale" in changed["status"][0]
    assert changed["status"][1].endswith("start section: 2 modules loaded")
    assert changed["saved"].endswith("written, 4 modules")
    assert run("pkgx.b")["found"] == []


def test_a_module_imported_before_the_no_gpu_check_moves_to_the_boot_section(pkg):
    """A start of another kind imported it past its boot (the enroot shim's call): the next start that imports it
    before its no-GPU check moves it to the boot section, so the no-GPU exit runs it from the image too."""
    src, image, _start = pkg
    run = boot_runner(src, image)
    from pyxis_hook import startimage

    run("late", "pkgx.a", "pkgx.b")  # pkgx.a imported only after `load`
    assert startimage.held(str(image), "boot") == () and "pkgx.a" in startimage.held(str(image), "start")
    moved = run("pkgx.b")
    assert moved["saved"].endswith("written, 3 modules")
    assert startimage.held(str(image), "boot") == ("pkgx", "pkgx.a")
    assert startimage.held(str(image), "start") == ("pkgx.b",)
    assert run("void")["found"] == []


def test_each_kind_of_start_runs_only_its_own_section(pkg):
    """A CDI hook step's modules go to its own section: a GPU start of the runtime never runs them."""
    src, image, _start = pkg
    run = boot_runner(src, image)
    from pyxis_hook import startimage

    run("pkgx.b")
    run("cdi", "pkgx.c")
    assert startimage.held(str(image), "start") == ("pkgx.b",)
    assert startimage.held(str(image), "cdi-hook") == ("pkgx.c",)
    start = run("pkgx.b")
    assert start["found"] == [] and start["mods"] == ["pkgx", "pkgx.a", "pkgx.b"] and start["saved"] == ""
    cdi = run("cdi", "pkgx.c")
    assert cdi["found"] == [] and cdi["mods"] == ["pkgx", "pkgx.a", "pkgx.c"] and cdi["saved"] == ""
