"""`pyxis-hook ldd` prints what resolve.format_ldd formats: one formatter of ldd lines."""

from __future__ import annotations

from fixtures.synth import build_exe, build_lib
from pyxis_hook import cli
from pyxis_hook.commands import ldd as ldd_cmd
from pyxis_hook.loader.loaderenv import loader_env_for_root
from pyxis_hook.loader.resolve import format_ldd, resolve_tree


def test_command_text_is_format_ldd(tmp_path, capsys):
    build_lib(tmp_path / "app/lib", "libdirect.so.1")
    build_exe(tmp_path / "app", "prog", needed=("libdirect.so.1", "libgone.so.1"), runpath="/app/lib")
    assert cli.main(["ldd", "--root", str(tmp_path), "/app/prog"]) == 0
    out, err = capsys.readouterr()
    expected = format_ldd(resolve_tree(loader_env_for_root(str(tmp_path)), "/app/prog"))
    assert out == expected and err == ""
    assert "\tlibgone.so.1 => not found\n" in out and "\tlibdirect.so.1 => /app/lib/libdirect.so.1\n" in out
    assert not hasattr(ldd_cmd, "format_text")


def test_load_failure_prints_nothing_on_stdout(tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/libk.so.1").write_bytes(b"1234567")
    build_exe(tmp_path, "exe", needed=("libk.so.1",), runpath="/bad")
    assert cli.main(["ldd", "--root", str(tmp_path), "/exe"]) == ldd_cmd.LOAD_FAILED_EXIT
    out, err = capsys.readouterr()
    assert out == "" and err == "/exe: error while loading shared libraries: /bad/libk.so.1: file too short\n"
