"""The CLI's contract: one error line, exit codes, tracebacks only in the log file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from fixtures.cli import run_cli, write_conf
from pyxis_hook import cli, errors, log
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
    assert rc == errors.INTERNAL == 70
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"internal error: RuntimeError: simulated bug (traceback in {logfile})" in err
    text = logfile.read_text()
    assert "Traceback (most recent call last)" in text and "simulated bug" in text


def test_internal_error_without_log_file_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    conf = tmp_path / "pyxis.conf"
    conf.write_text("")
    monkeypatch.setattr(info, "run", lambda args, config: 1 / 0)
    assert cli.main(["--config", str(conf), "info"]) == errors.INTERNAL
    err = capsys.readouterr().err
    assert "ZeroDivisionError" in err and "set log-file in pyxis.conf" in err and err.count("\n") == 1


def test_internal_signals_are_no_user_errors(tmp_path, monkeypatch, capsys):
    """CannotMerge, LoadFailed, ArtifactError and SyscallError are caught by their own callers:
    one that reaches the CLI is a bug (exit 70), never a `pyxis-hook: error:` line of exit 3,
    and an `except PyxisHookError` around user errors never swallows one."""
    from pyxis_hook.kernel.syscall import SyscallError
    from pyxis_hook.loader.ldmerge import CannotMerge
    from pyxis_hook.loader.resolve import LoadFailed

    conf = tmp_path / "pyxis.conf"
    conf.write_text("")
    signals = (CannotMerge("c"), LoadFailed("libx.so", "file too short"), errors.ArtifactError("s"),
               SyscallError("mount /x: Permission denied", 1))
    for signal in signals:
        assert isinstance(signal, errors.InternalSignal) and not isinstance(signal, errors.PyxisHookError)

        def raises(args, config, signal=signal):
            raise signal

        monkeypatch.setattr(info, "run", raises)
        assert cli.main(["--config", str(conf), "info"]) == errors.INTERNAL
        err = capsys.readouterr().err
        assert err.startswith(f"pyxis-hook: error: internal error: {type(signal).__name__}: "), err


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
    assert cli.main(["--config", str(conf), "info"]) == errors.FAILED
    assert "Traceback" not in capsys.readouterr().err


def test_exit_codes_tell_usage_config_failure_and_findings_apart(tmp_path):
    """A script can tell "the check found problems" (1) from bad usage (2), a failure (3) and a bug (70)."""
    from fixtures.container import make_bundle

    empty = tmp_path / "empty"
    empty.mkdir()
    conf = write_conf(tmp_path / "pyxis.conf", driver_root=empty, proc_root=empty, dev_root=empty,
                      snapshot_dir=tmp_path / "snap")
    bundle = make_bundle(tmp_path / "b", env=("NVIDIA_VISIBLE_DEVICES=all",))
    assert run_cli("plan", "--bundle", str(bundle), conf=conf).returncode == errors.FINDINGS
    assert run_cli("plan", "--no-such-option", conf=conf).returncode == errors.USAGE
    bad = tmp_path / "bad.conf"
    bad.write_text("log-level = 7\n")
    r = run_cli("plan", "--bundle", str(bundle), conf=bad)
    assert r.returncode == errors.USAGE and r.stderr.startswith("pyxis-hook: error: ")
    r = run_cli("plan", "--bundle", str(tmp_path / "missing"), conf=conf)
    assert r.returncode == errors.FAILED and r.stderr.count("\n") == 1


def test_the_exit_code_table_is_in_help_and_the_troubleshooting_guide():
    import subprocess

    text = subprocess.run([sys.executable, "-m", "pyxis_hook", "--help"], capture_output=True, text=True).stdout
    guide = (Path(__file__).resolve().parents[3] / "docs" / "troubleshooting.md").read_text()
    assert len({code for code, _ in errors.EXIT_CODES}) == len(errors.EXIT_CODES)
    for code, meaning in errors.EXIT_CODES:
        assert f"  {code:<4}{meaning}" in text
        assert f"| {code} | {meaning} |" in guide


def test_an_error_quoting_a_control_character_is_still_one_line():
    """A value with a newline (an image's environment) is quoted escaped: the runtime shows one line."""
    e = errors.RequestError("NVIDIA_VISIBLE_DEVICES: '0\n0\r\x1b[2J': unknown device")
    assert str(e) == "NVIDIA_VISIBLE_DEVICES: '0\\n0\\r\\x1b[2J': unknown device"
    assert str(errors.RequestError("GPU é ok")) == "GPU é ok"


def test_the_named_command_alone_is_imported():
    """`pyxis-hook [options] COMMAND ...` builds that command's parser only; help and unknown words get all."""
    assert cli.named_command(["cdi", "hook", "update-ldcache", "--lib", "x"]) == "cdi"
    assert cli.named_command(["--config", "plan", "--debug", "info", "--json"]) == "info"  # --config's value skipped
    assert cli.named_command(["--config=/x", "createRuntime"]) == "createRuntime"
    assert cli.named_command(["--help", "plan"]) is None and cli.named_command(["bogus"]) is None
    assert cli.named_command(["--debug"]) is None
    # (importlib.import_module, which the parser uses, is invisible to -X importtime: ask sys.modules)
    r = subprocess.run([sys.executable, "-c", "import sys; from pyxis_hook import cli\ntry:\n cli.main(['ldcache', '--help'])\n"
                        "finally:\n print(' '.join(sys.modules), file=sys.stderr)"], capture_output=True, text=True)
    assert "usage: pyxis-hook ldcache" in r.stdout, r.stderr
    loaded = set(r.stderr.split())
    assert "pyxis_hook.commands.ldcache" in loaded
    assert not {"pyxis_hook.commands.doctor", "pyxis_hook.commands.plan", "pyxis_hook.commands.cdi"} & loaded
