"""log.py: the debug log file (never through a link) and its level filter."""

from __future__ import annotations

from pyxis_hook import log


def test_log_file_is_never_opened_through_a_link(tmp_path, capsys):
    victim = tmp_path / "victim"
    victim.write_text("host file\n")
    link = tmp_path / "hook.log"
    link.symlink_to(victim)
    try:
        log.configure(str(link), "debug")
        log.info("hello")
    finally:
        log.close()
    assert victim.read_text() == "host file\n"
    assert f"cannot open log file {link}" in capsys.readouterr().err


def test_file_level_filters(tmp_path):
    path = tmp_path / "hook.log"
    try:
        log.configure(str(path), "warning", stderr_level="error")
        log.info("not this")
        log.warning("but this")
    finally:
        log.close()
    text = path.read_text()
    assert "but this" in text and "not this" not in text
    assert log.log_path() == ""
