"""The CLI's contract: one error line, exit codes, tracebacks only in the log file."""

from __future__ import annotations

from fixtures.cli import run_cli, write_conf
from pyxis_hook import cli, log
from pyxis_hook.commands import info


def test_internal_error_is_one_line_and_the_traceback_goes_to_the_log(tmp_path, monkeypatch, capsys):
    logfile = tmp_path / "hook.log"
    conf = tmp_path / "pyxis.conf"
    conf.write_text(f'log-file = "{logfile}"\nlog-level = "debug"\n')

    def boom(args, config):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(info, "run", boom)
    try:
        rc = cli.main(["--config", str(conf), "info"])
    finally:
        log.close()
    err = capsys.readouterr().err
    assert rc == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"internal error: RuntimeError: simulated bug (traceback in {logfile})" in err
    text = logfile.read_text()
    assert "Traceback (most recent call last)" in text and "simulated bug" in text


def test_internal_error_without_log_file_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "pyxis.conf"
    conf.write_text("")
    monkeypatch.setattr(info, "run", lambda args, config: 1 / 0)
    assert cli.main(["--config", str(conf), "info"]) == 1
    err = capsys.readouterr().err
    assert "ZeroDivisionError" in err and "set log-file in pyxis.conf" in err and err.count("\n") == 1


def test_no_command_prints_usage_exit_2():
    r = run_cli()
    assert r.returncode == 2 and "usage: pyxis-hook" in r.stderr


def test_unknown_command_exit_2():
    r = run_cli("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr


def test_every_listed_command_has_a_module():
    import importlib

    for name, (module, _help, _aliases) in cli.COMMANDS.items():
        mod = importlib.import_module(f"pyxis_hook.commands.{module}")
        assert callable(mod.add_arguments) and callable(mod.run), name


def test_debug_flag_shows_debug_lines_on_stderr(tmp_path):
    from fixtures.container import make_bundle

    empty = tmp_path / "empty"
    empty.mkdir()
    conf = write_conf(tmp_path / "pyxis.conf", driver_root=empty, proc_root=empty, dev_root=empty,
                      snapshot_dir=tmp_path / "snap")
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=all",))  # no driver: plan says why
    quiet = run_cli("plan", "--bundle", str(bundle), conf=conf)
    loud = run_cli("--debug", "plan", "--bundle", str(bundle), conf=conf)
    assert quiet.returncode == loud.returncode == 1
    assert "pyxis-hook: debug:" not in quiet.stderr
    assert "pyxis-hook: debug:" in loud.stderr


def test_interrupt_and_broken_pipe_exit_codes(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "pyxis.conf"
    conf.write_text("")

    def raising(exc):
        def run(args, config):
            raise exc
        return run

    monkeypatch.setattr(info, "run", raising(KeyboardInterrupt()))
    assert cli.main(["--config", str(conf), "info"]) == 130
    monkeypatch.setattr(info, "run", raising(BrokenPipeError()))
    assert cli.main(["--config", str(conf), "info"]) == 1
    assert "Traceback" not in capsys.readouterr().err
