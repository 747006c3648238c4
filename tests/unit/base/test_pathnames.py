"""pyxis_hook.pathnames gives what os.path (posixpath) and os.fsencode/fsdecode give.

The snapshot compares `pathnames.realpath` of the driver root with the
`os.path.realpath` discovery stored, so a difference anywhere (a dangling
tail, a loop, `..` after a link) would rebuild or refuse snapshots: each
function is compared with its namesake on generated path strings, and the
file-system ones on a real tree of links.
"""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from pyxis_hook import pathnames

REPO = Path(__file__).resolve().parents[3]

# path strings made of the parts that change what these functions do: empty, '.', '..', runs of slashes
_PART = st.sampled_from(["", "/", "//", "///", ".", "..", "a", "b", "a.b", "...", " ", "é", "\udcff", "x/", "/y"])
PATHS = st.lists(_PART, max_size=8).map("".join) | st.text(alphabet="/.ab", max_size=12)

PURE = ["join", "dirname", "basename", "split", "normpath"]


def test_the_edge_cases_by_name():
    """The cases named in posixpath's own tests: '', '/', '//', '.', '..', trailing and repeated slashes."""
    for p in ["", "/", "//", "///", ".", "..", "a/", "a//", "//a", "///a", "a//b/", "/..", "//..", "../..", "a/../..", "./."]:
        for name in PURE:
            assert getattr(pathnames, name)(p) == getattr(posixpath, name)(p), (name, p)
        assert pathnames.abspath(p) == posixpath.abspath(p), p
    assert pathnames.normpath("//a/./b/../") == "//a" and pathnames.normpath("///a") == "/a"
    assert pathnames.split("//") == ("//", "") and pathnames.dirname("a//") == "a"


@settings(max_examples=500, deadline=None)
@given(PATHS)
def test_the_string_functions_equal_posixpath(p):
    for name in PURE:
        assert getattr(pathnames, name)(p) == getattr(posixpath, name)(p), name
    assert pathnames.abspath(p) == posixpath.abspath(p)
    assert pathnames.fsencode(p) == os.fsencode(p)
    assert pathnames.fsdecode(os.fsencode(p)) == os.fsdecode(os.fsencode(p)) == p


@settings(max_examples=500, deadline=None)
@given(PATHS)
def test_the_python_normpath_equals_posixpath(p):
    """The normpath a 3.9 or 3.10 start uses (no C `posix._path_normpath` there), on every interpreter."""
    assert pathnames._normpath_str(p) == posixpath.normpath(p)


def test_normpath_is_the_c_one_where_the_interpreter_has_it():
    assert (pathnames._C_NORMPATH is not None) == (sys.version_info >= (3, 11))


@settings(max_examples=300, deadline=None)
@given(st.lists(PATHS, min_size=1, max_size=5))
def test_join_equals_posixpath(parts):
    assert pathnames.join(*parts) == posixpath.join(*parts)


def test_path_like_arguments_and_bytes_for_fs_codecs(tmp_path):
    assert pathnames.join(tmp_path, "x") == os.path.join(tmp_path, "x")
    assert pathnames.realpath(tmp_path) == os.path.realpath(tmp_path)
    assert pathnames.isdir(tmp_path) and pathnames.exists(tmp_path)
    assert pathnames.fsencode(b"\xff") == b"\xff" and pathnames.fsdecode("x") == "x"
    assert pathnames.fsdecode(b"\xff") == os.fsdecode(b"\xff")


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """Directories, a file, and links: relative, absolute, dangling, into '..', chains and loops."""
    t = tmp_path_factory.mktemp("names")
    (t / "d/e").mkdir(parents=True)
    (t / "d/f").write_text("")
    links = {
        "rel": "d", "abs": str(t / "d/e"), "dangling": "nowhere/at/all", "file": "d/f", "up": "d/e/../..",
        "chain1": "chain2", "chain2": "chain3", "chain3": "d/e", "loop1": "loop2", "loop2": "loop1",
        "self": "self", "d/e/back": "../../rel", "d/e/toabs": "/", "loopdir": "loopdir/x", "viafile": "d/f/x",
        "dotdot": "..", "chaindangling": "dangling",
    }
    for name, target in links.items():
        (t / name).symlink_to(target)
    return t


def _candidates(t: Path) -> list[str]:
    names = ["", ".", "..", "d", "d/e", "d/f", "d/f/", "d/e/", "rel", "abs", "dangling", "dangling/x", "file",
             "file/", "up", "up/d", "chain1", "chain1/..", "chain1/../f", "loop1", "loop1/x", "self", "self/..",
             "d/e/back", "d/e/back/e", "d/e/toabs", "d/e/toabs/..", "loopdir", "loopdir/y", "viafile",
             "dotdot", "dotdot/..", "chaindangling", "chaindangling/../x", "missing", "missing/../d", "rel/../rel/e",
             "rel//e/.", "abs/../../rel", "d/e/back/../abs"]
    out = [str(t / n) if n else str(t) for n in names]
    out += [str(t) + "//" + n for n in ("rel", "loop1")] + ["/", "//", "/nonexistent/.."]
    return out


def test_the_file_system_functions_equal_os_path_on_a_tree_of_links(tree, monkeypatch):
    paths = _candidates(tree)
    for p in paths:
        for name in ("realpath", "isdir", "isfile", "exists", "lexists"):
            assert getattr(pathnames, name)(p) == getattr(os.path, name)(p), (name, p)
    # relative paths resolve from the working directory, as os.path's do
    monkeypatch.chdir(tree / "d/e")
    for p in ["", ".", "..", "back", "back/e", "../../loop1", "../../dangling/x", "toabs/..", "x/../.."]:
        for name in ("realpath", "abspath", "isdir", "isfile", "exists", "lexists"):
            assert getattr(pathnames, name)(p) == getattr(os.path, name)(p), (name, p)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["rel", "abs", "dangling", "file", "up", "chain1", "loop1", "self", "d", "e", "f",
                                 "back", "toabs", "loopdir", "viafile", "dotdot", "..", ".", "", "missing"]),
                max_size=6))
def test_realpath_equals_os_path_on_generated_walks_through_the_tree(tree, parts):
    """Python 3.11's answer on every version.  CPython 3.13 rewrote non-strict realpath: past a
    symlink loop it now resolves what follows (`loop/../rel` gives rel's target), where 3.11 leaves
    the rest as written and normalizes it.  Both answers name no real file; pathnames keeps 3.11's,
    and discovery and the start both use pathnames, so the snapshot's driver root always compares
    equal.  On a newer Python only walks through no loop are compared."""
    p = str(tree) + "/" + "/".join(parts)
    if sys.version_info[:2] != (3, 11):
        assume(not {"loop1", "self", "loopdir"} & set(parts))  # the tree's symlink loops
    assert pathnames.realpath(p) == os.path.realpath(p)
    assert pathnames.lexists(p) == os.path.lexists(p) and pathnames.exists(p) == os.path.exists(p)


def test_a_nul_in_a_path_is_false_not_an_error():
    """genericpath's tests answer False for a path the kernel cannot be given (ValueError)."""
    for name in ("isdir", "isfile", "exists", "lexists"):
        assert getattr(pathnames, name)("/\0") is False


def test_importing_it_imports_no_os():
    """The reason the module exists: a start that uses it does not load `os` (nor typing)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pyxis_hook.pathnames;"
            " print(sorted({'os', 'typing', 'posixpath'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
