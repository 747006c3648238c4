"""pyxis_hook.loader.resolve (with searchpath and loaderenv) and the `ldd` command: glibc's search rules inside a root.

The comparisons with glibc's own loader are in tests/oracles/test_ldd_oracle.py;
these tests pin the pieces (DSTs, path lists, per-root defaults, root confinement,
JSON output) with real gcc-built trees.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.glibcroot import make_glibc_root
from fixtures.synth import build_exe, build_lib
from pyxis_hook import cli
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.loader.loaderenv import (
    CACHE_LOADER,
    EM_386,
    EM_AARCH64,
    EM_X86_64,
    LoaderEnv,
    cache_lookup_for,
    detect_hwcaps,
    inspect_ldso,
    loader_env_for_root,
)
from pyxis_hook.loader.resolve import format_ldd, resolve_tree
from pyxis_hook.loader.searchpath import expand_dst, fillin, split_search_path

LDSO = "/lib64/ld-linux-x86-64.so.2"


# ----------------------------------------------------------------- DSTs and path lists

@pytest.mark.parametrize("text,expected", [
    ("$ORIGIN/../lib", "/o/../lib"),
    ("${ORIGIN}/x", "/o/x"),
    ("$ORIGINAL/x", "$ORIGINAL/x"),
    ("$ORIGIN_X", "$ORIGIN_X"),
    ("/a/$LIB/b", "/a/lib/x86_64-linux-gnu/b"),
    ("/a/${LIB}b", "/a/lib/x86_64-linux-gnub"),
    ("/p/$PLATFORM", "/p/x86_64"),
    ("/p/$FOO", "/p/$FOO"),
    ("$ORIGIN$ORIGIN", "/o/o"),
    ("${ORIGIN", "${ORIGIN"),
])
def test_expand_dst(text, expected):
    assert expand_dst(text, "/o", "lib/x86_64-linux-gnu", "x86_64") == expected


def test_known_token_without_value_drops_the_element():
    assert expand_dst("/p/$PLATFORM/x", "/o", "lib", None) is None
    assert fillin(("/p/$PLATFORM", "/q"), "/o", LoaderEnv(platform=None)) == ("/q",)


@given(st.text(alphabet="abAZ09_/${}.", max_size=30))
def test_dst_expansion_model(text):
    """Only $ORIGIN/$LIB/$PLATFORM followed by a non-identifier char, or braced, are tokens."""
    out = expand_dst(text, "<O>", "<L>", "<P>")
    model = re.sub(r"\$\{ORIGIN\}|\$ORIGIN(?![A-Za-z0-9_])", "<O>", text)
    # compare only texts without LIB/PLATFORM tokens, where the model is exactly right
    if "LIB" not in text and "PLATFORM" not in text:
        assert out == model
    assert "$ORIGINAL" not in text or "$ORIGINAL" in out


def test_split_search_path_on_colon_and_semicolon():
    assert split_search_path("/a:/b;/c::") == ("/a", "/b", "/c", "", "")


def testfillin_normalises_like_glibc():
    env = LoaderEnv()
    assert fillin(("/a/", "/a", "", "/b//", "/"), "/o", env) == ("/a", ".", "/b", "/")


# ----------------------------------------------------------------- per-root defaults

def _ldso_help() -> str:
    return subprocess.run([LDSO, "--help"], capture_output=True, text=True).stdout


@pytest.mark.skipif(not os.path.exists(LDSO), reason="needs the host x86-64 ld.so")
def test_inspect_ldso_matches_ld_so_help():
    dirs, version = inspect_ldso(os.path.realpath(LDSO))
    expected = tuple(re.findall(r"^  (/\S*) \(system search path\)$", _ldso_help(), re.M))
    assert dirs == expected
    out = subprocess.run([LDSO, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\d+)\.(\d+)", out)
    assert version == (int(m.group(1)), int(m.group(2)))


@pytest.mark.skipif(not os.path.exists(LDSO), reason="needs the host x86-64 ld.so")
def test_detect_hwcaps_matches_ld_so_help():
    help_text = _ldso_help()
    section = help_text.split("Subdirectories of glibc-hwcaps directories", 1)[1].split("\n\n", 1)[0]
    supported = tuple(re.findall(r"^  (\S+) \(supported, searched\)$", section, re.M))
    assert detect_hwcaps() == supported


def test_inspect_ldso_on_non_ldso(tmp_path):
    p = tmp_path / "x"
    p.write_bytes(b"\0" * 100 + b"/lib/\0/usr/lib/\0")
    assert inspect_ldso(str(p)) == (None, None)
    assert inspect_ldso(str(tmp_path / "missing")) == (None, None)


@pytest.mark.parametrize("layout,expected", [
    ({"usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": None, "lib64/ld-linux-x86-64.so.2":
      "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
     ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib", "/usr/lib")),
    ({"usr/lib64/ld-linux-x86-64.so.2": None, "lib64": "usr/lib64"}, ("/lib64", "/usr/lib64")),
])
def test_system_dirs_heuristic_when_ldso_unreadable(tmp_path, layout, expected):
    for rel, target in layout.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if target is None:
            p.write_bytes(b"not really ld.so")
        else:
            os.symlink(target, p)
    env = loader_env_for_root(str(tmp_path), hwcaps=())
    assert env.system_dirs == expected
    assert env.lib_token == expected[0].lstrip("/")
    assert env.cache is None  # no etc/ld.so.cache in this root


# ----------------------------------------------------------------- ld.so.cache flags per class and machine

def test_cache_flags_come_from_cachelookup():
    """One table: every (class, machine) the resolver knows names a loader in `cachelookup.LOADER_FLAGS`,
    with the flags glibc's `_dl_cache_check_flags` accepts there (what loader/resolve.py used to keep itself)."""
    from pyxis_hook.loader import cachelookup

    assert {arch: cachelookup.LOADER_FLAGS[name] for arch, name in CACHE_LOADER.items()} == {
        (64, EM_X86_64): (0x0303,), (32, EM_386): (0x0001, 0x0003), (64, EM_AARCH64): (0x0A03,),
        (32, EM_X86_64): (0x0803,)}


def test_cache_lookup_per_class_in_a_real_cache(tmp_path):
    """One SONAME three times (x86-64, i386, x32) in a cache glibc's ldconfig wrote: each class finds its own."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/ld.so.conf").write_text("/l64\n/l32\n/lx32\n")
    build_lib(tmp_path / "l64", "libwho.so.1")
    build_lib(tmp_path / "l32", "libwho.so.1", m32=True)
    build_lib(tmp_path / "lx32", "libwho.so.1", extra_flags=("-mx32", "-nostdlib"))
    subprocess.run([_ldconfig() or "ldconfig", "-r", str(tmp_path), "-X"], check=True, capture_output=True)
    from pyxis_hook.loader import ldcache

    lookup = cache_lookup_for(ldcache.read_cache(str(tmp_path / "etc/ld.so.cache")))
    assert lookup("libwho.so.1", 64, EM_X86_64) == ("/l64/libwho.so.1",)
    assert lookup("libwho.so.1", 32, EM_386) == ("/l32/libwho.so.1",)
    assert lookup("libwho.so.1", 32, EM_X86_64) == ("/lx32/libwho.so.1",)
    assert lookup("libwho.so.1", 64, EM_AARCH64) == ()  # no AArch64 entry: 0x0A03 matches none of them
    assert lookup("libwho.so.1", 32, 40) == ()  # EM_ARM: a loader the resolver does not model finds nothing
    assert lookup("libnone.so.1", 64, EM_X86_64) == ()


# ----------------------------------------------------------------- a synthetic root

def _ldconfig() -> str | None:
    return shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """A Debian-like root: host ld.so + libc, ld.so.conf dirs, RUNPATH app, symlinks pointing outside."""
    r = tmp_path_factory.mktemp("resolve-root")
    lib = make_glibc_root(r)
    (r / "etc/ld.so.conf").write_text("/opt/c/lib\n")
    build_lib(r / "opt/c/lib", "libcached.so.1")
    build_lib(r / "app/lib", "libdirect.so.1", needed=("libindirect.so.1",))
    build_lib(r / "app/lib", "libindirect.so.1")  # only reachable through RUNPATH, which is not inherited
    build_lib(lib, "libsys.so.1")
    # escapes: an absolute symlink and a ../ chain; inside the root neither leaves it
    outside = tmp_path_factory.mktemp("outside")
    build_lib(outside, "libout.so.1")
    os.symlink("/real", r / "app/abs")
    build_lib(r / "real", "libout.so.1", symbol="inside_copy")
    os.symlink("../../../../../../../../" + str(outside).lstrip("/"), r / "app/dotdot")
    build_exe(r / "app", "prog", needed=("libdirect.so.1", "libcached.so.1", "libsys.so.1", "libout.so.1"),
              runpath="$ORIGIN/lib:/app/dotdot:/app/abs")
    build_exe(r / "app", "prog2", needed=("libout.so.1",), runpath="/app/dotdot")
    ldconfig = _ldconfig()
    if ldconfig:
        subprocess.run([ldconfig, "-r", str(r)], check=True, capture_output=True)
    return r


def test_resolve_tree_in_root(root):
    env = loader_env_for_root(str(root))
    deps = {d.name: d for d in resolve_tree(env, "/app/prog")}
    assert deps["libdirect.so.1"].path == "/app/lib/libdirect.so.1"
    assert deps["libdirect.so.1"].how == "RUNPATH of /app/prog"
    assert deps["libdirect.so.1"].needed_by == "/app/prog"
    assert deps["libindirect.so.1"].path is None and deps["libindirect.so.1"].how == "not found"
    assert deps["libsys.so.1"].path == "/lib/x86_64-linux-gnu/libsys.so.1"
    assert deps["libc.so.6"].path == "/lib/x86_64-linux-gnu/libc.so.6"
    if env.cache is not None:
        assert deps["libcached.so.1"] .path == "/opt/c/lib/libcached.so.1"
        assert deps["libcached.so.1"].how == "ld.so.cache"
        assert deps["libsys.so.1"].how == "ld.so.cache"
    # the ../ chain stops at the root; the absolute link restarts at the root: the inside copy wins
    assert deps["libout.so.1"].path == "/app/abs/libout.so.1"
    rtld = [d for d in deps.values() if d.interpreter]
    assert [d.path for d in rtld] == ["/lib64/ld-linux-x86-64.so.2"]


def test_symlink_outside_root_is_not_followed(root):
    env = loader_env_for_root(str(root))
    deps = resolve_tree(env, "/app/prog2")
    assert [d.path for d in deps if d.name == "libout.so.1"] == [None]


def test_inhibit_cache_and_library_path(root):
    env = loader_env_for_root(str(root), inhibit_cache=True, ld_library_path="/nowhere;/app/lib")
    deps = {d.name: d for d in resolve_tree(env, "/app/prog")}
    assert deps["libcached.so.1"].path is None
    assert deps["libsys.so.1"].how == "default dir"
    assert deps["libdirect.so.1"].how == "LD_LIBRARY_PATH"
    assert deps["libindirect.so.1"].path == "/app/lib/libindirect.so.1"


def test_format_ldd_lines(root):
    env = loader_env_for_root(str(root), inhibit_cache=True)
    text = format_ldd(resolve_tree(env, "/app/prog"))
    assert "\tlibdirect.so.1 => /app/lib/libdirect.so.1\n" in text
    assert "\tlibindirect.so.1 => not found\n" in text
    assert "\t/lib64/ld-linux-x86-64.so.2\n" in text
    assert "0x" not in text


def test_corrupt_candidate_ends_the_list(tmp_path):
    build_lib(tmp_path / "good", "libk.so.1")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/libk.so.1").write_bytes(b"1234567")
    exe = build_exe(tmp_path, "exe", needed=("libk.so.1",), runpath="/bad:/good")
    deps = resolve_tree(loader_env_for_root(str(tmp_path), hwcaps=()), "/exe")
    assert deps[-1].error == "file too short" and deps[-1].path == "/bad/libk.so.1"
    assert exe.exists()


def test_wrong_class_skipped_for_a_32_bit_main(tmp_path):
    build_lib(tmp_path / "d64", "libw.so.1")
    build_lib(tmp_path / "d32", "libw.so.1", m32=True)
    build_lib(tmp_path / "top", "libtop.so.1", m32=True, needed=("libw.so.1",), runpath="/d64:/d32")
    deps = resolve_tree(loader_env_for_root(str(tmp_path), hwcaps=()), "/top/libtop.so.1")
    assert [d.path for d in deps if d.name == "libw.so.1"] == ["/d32/libw.so.1"]


# ----------------------------------------------------------------- the command

def _run_cli(capsys, *argv) -> tuple[int, str, str]:
    rc = cli.main(["ldd", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_text_and_exit_codes(root, capsys, tmp_path):
    rc, out, err = _run_cli(capsys, "--root", str(root), "/app/prog")
    assert rc == 0 and "\tlibindirect.so.1 => not found\n" in out and err == ""
    (root / "app/lib/libindirect.so.1").rename(root / "app/lib/libindirect.so.1.keep")
    try:
        (root / "app/lib/libsys.so.1").write_bytes(b"short")
        rc, out, err = _run_cli(capsys, "--root", str(root), "--inhibit-cache", "/app/prog")
        assert rc == 127
        assert err == "/app/prog: error while loading shared libraries: /app/lib/libsys.so.1: file too short\n"
    finally:
        (root / "app/lib/libsys.so.1").unlink()
        (root / "app/lib/libindirect.so.1.keep").rename(root / "app/lib/libindirect.so.1")
    rc, out, err = _run_cli(capsys, "--root", str(root), "/app/prog", "/app/prog2")
    assert out.startswith("/app/prog:\n") and "\n/app/prog2:\n" in out


def test_cli_json_matches_schema(root, capsys, tmp_path):
    import jsonschema

    (tmp_path / "notelf").write_text("hello\n" * 10)
    rc, out, _ = _run_cli(capsys, "--root", str(root), "--json", "/app/prog", "/app/prog2")
    doc = json.loads(out)
    jsonschema.validate(doc, load_schema("ldd.schema.json"))
    assert rc == 0
    first = doc["files"][0]
    assert first["interpreter"] == "/lib64/ld-linux-x86-64.so.2"
    assert first["search"]["system_dirs"][0] == "/lib/x86_64-linux-gnu"
    assert {d["how"] for d in first["dependencies"]} >= {"RUNPATH of /app/prog", "not found", "interpreter"}
    rc, out, _ = _run_cli(capsys, "--json", str(tmp_path / "notelf"))
    doc = json.loads(out)
    jsonschema.validate(doc, load_schema("ldd.schema.json"))
    assert rc == 127 and "not an ELF file" in doc["files"][0]["error"]["reason"]


def test_search_order_is_glibcs_one_model():
    """RPATH (only without RUNPATH), LD_LIBRARY_PATH, RUNPATH, the cache's first hit, the system dirs;
    DF_1_NODEFLIB drops the system dirs and a cache hit inside them (elf/dl-load.c `_dl_map_object`)."""
    from pyxis_hook.loader.searchpath import search_order

    asked = []

    def cached():
        asked.append(1)
        return "/usr/lib/libx.so.1"

    order = list(search_order("libx.so.1", rpath=[(("/r",), "RPATH of /bin/p")], ld_library_path=("/l",),
                              runpath=(("/u",), "RUNPATH of /bin/p"), cached=cached, system_dirs=("/usr/lib",),
                              subdirs=("glibc-hwcaps/x86-64-v3", "")))
    assert order == [("/r/glibc-hwcaps/x86-64-v3/libx.so.1", "RPATH of /bin/p"), ("/r/libx.so.1", "RPATH of /bin/p"),
                     ("/l/glibc-hwcaps/x86-64-v3/libx.so.1", "LD_LIBRARY_PATH"), ("/l/libx.so.1", "LD_LIBRARY_PATH"),
                     ("/u/glibc-hwcaps/x86-64-v3/libx.so.1", "RUNPATH of /bin/p"), ("/u/libx.so.1", "RUNPATH of /bin/p"),
                     ("/usr/lib/libx.so.1", "ld.so.cache"),
                     ("/usr/lib/glibc-hwcaps/x86-64-v3/libx.so.1", "default dir"), ("/usr/lib/libx.so.1", "default dir")]
    first = search_order("libx.so.1", ld_library_path=("/l",), cached=cached, system_dirs=("/usr/lib",))
    asked.clear()
    assert next(first) == ("/l/libx.so.1", "LD_LIBRARY_PATH") and asked == []  # the cache only when reached
    assert list(search_order("libx.so.1", cached=cached, system_dirs=("/usr/lib",), nodeflib=True)) == []


def test_ldcheck_walks_resolves_order(tmp_path):
    """ldcheck's candidates are `search_order`'s, LD_LIBRARY_PATH filled in as glibc's `fillin_rpath`
    does it: trailing slashes stripped, repeats dropped, an element naming $ORIGIN (unknown to a dlopen
    check) dropped."""
    from pyxis_hook.diag import ldmodel

    setup = ldmodel.search_setup(str(tmp_path), 64, "/opt/a/:$ORIGIN/x:/opt/a:", None)
    assert setup.ld_library_path == ("/opt/a", ".")
    from pyxis_hook.loader.searchpath import search_order

    assert list(ldmodel._candidates(setup, "libx.so.1")) == list(search_order(
        "libx.so.1", ld_library_path=("/opt/a", "."), system_dirs=setup.system_dirs, subdirs=setup.subdirs))
