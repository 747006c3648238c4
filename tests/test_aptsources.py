"""The test image is fetched from the machine's own apt sources: one-line and deb822 files, one release only."""

from __future__ import annotations

from fixtures.aptsources import entries, os_codename, release_sources


def test_release_sources_from_both_formats(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list").write_text(
        "# a comment\n"
        "deb [arch=amd64 signed-by=/k/local.gpg] http://mirror.example/debian bookworm main contrib # tail\n"
        "deb-src http://mirror.example/debian bookworm main\n"
        "deb http://mirror.example/debian trixie main\n")
    (tmp_path / "sources.list.d/debian.sources").write_text(
        "Types: deb\n# http://snapshot.example/archive\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\nSigned-By: /k/archive.gpg\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm-updates\nComponents: main\nEnabled: no\n")
    (tmp_path / "sources.list.d/vendor.list").write_text("deb https://vendor.example/apt cloud-sdk-bookworm main\n")
    (tmp_path / "sources.list.d/ignored.list.disabled").write_text("deb http://no.example/debian bookworm main\n")
    assert len(entries(tmp_path)) == 5
    assert release_sources("bookworm", tmp_path) == (
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\nComponents: main contrib\n"
        "Architectures: amd64\nSigned-By: /k/local.gpg\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n"
        "Signed-By: /k/archive.gpg\n")
    assert release_sources("bullseye", tmp_path) == ""


def test_os_codename(tmp_path):
    (tmp_path / "os-release").write_text('PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\n')
    assert os_codename(tmp_path / "os-release") == "bookworm"
    assert os_codename(tmp_path / "missing") == ""
