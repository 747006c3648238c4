"""The real-driver fixture's apt sources come from the machine's own apt configuration, whatever its mirror."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import aptsources, realdriver

MIRROR = "http://mirror.example/debian"
SECURITY = "http://mirror.example/debian-security"


def fake_etc(tmp_path: Path) -> Path:
    """sources.list (one-line), a deb822 part with a comment inside a stanza, a disabled stanza,
    third-party repositories and files apt does not read."""
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text(
        "# the machine's mirror\n"
        f"deb [arch=amd64 signed-by=/usr/share/keyrings/local.gpg] {MIRROR} bookworm main contrib\n"
        f"deb-src {MIRROR} bookworm main\n"
        "deb http://vendor.example/debian bookworm stable  # a third-party repository's own component\n")
    (etc / "sources.list.d/debian.sources").write_text(
        "Types: deb\n"
        "# a snapshot comment inside the stanza\n"
        f"URIs: {SECURITY}\nSuites: bookworm-security\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://old.example/debian\nSuites: bookworm-backports\nComponents: main\n\n"
        "Enabled: no\nTypes: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\n")
    (etc / "sources.list.d/node.sources").write_text(
        "Types: deb\nURIs: https://node.example/node\nSuites: nodistro\nComponents: main\n")
    (etc / "sources.list.d/cloud.list.disabled").write_text(f"deb {MIRROR}-x bookworm main\n")
    return etc


def os_release(tmp_path: Path, name: str = "bookworm") -> Path:
    p = tmp_path / "os-release"
    p.write_text(f'PRETTY_NAME="Debian GNU/Linux 12 ({name})"\nVERSION_CODENAME={name}\nID=debian\n')
    return p


def test_machine_release_keeps_its_mirrors_with_every_component(tmp_path):
    text = aptsources.sources_for(etc=fake_etc(tmp_path), os_release=os_release(tmp_path))
    assert text == (
        f"Types: deb\nURIs: {MIRROR}\nSuites: bookworm\nComponents: main contrib non-free non-free-firmware\n"
        "Signed-By: /usr/share/keyrings/local.gpg\n\n"
        f"Types: deb\nURIs: {SECURITY}\nSuites: bookworm-security\n"
        "Components: main contrib non-free non-free-firmware\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n")


def test_another_release_comes_from_the_machines_mirror(tmp_path):
    text = aptsources.sources_for("trixie", etc=fake_etc(tmp_path), os_release=os_release(tmp_path))
    assert text == (f"Types: deb\nURIs: {MIRROR}\nSuites: trixie\n"
                    "Components: main contrib non-free non-free-firmware\n"
                    "Signed-By: /usr/share/keyrings/local.gpg\n")


def test_inline_key_and_trusted_options_kept(tmp_path):
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list.d/local.sources").write_text(
        f"Types: deb deb-src\nURIs: {MIRROR}\nSuites: bookworm bookworm-updates\nComponents: main\n"
        "Signed-By:\n -----BEGIN PGP PUBLIC KEY BLOCK-----\n .\n xsBN\n -----END PGP PUBLIC KEY BLOCK-----\n")
    (etc / "sources.list.d/plain.list").write_text("deb [ trusted=yes ] http://lan.example/debian bookworm main\n")
    entries = aptsources.debian_entries(aptsources.read_entries(etc), "bookworm")
    assert [(e.uri, e.suites, e.trusted) for e in entries] == [  # parts in name order, as apt reads them
        (MIRROR, ("bookworm", "bookworm-updates"), ""), ("http://lan.example/debian", ("bookworm",), "yes")]
    assert entries[0].signed_by.split("\n")[1:] == [" -----BEGIN PGP PUBLIC KEY BLOCK-----", " .", " xsBN",
                                                    " -----END PGP PUBLIC KEY BLOCK-----"]


@pytest.mark.parametrize("files, match", [
    ({}, "no Debian archive entry for bookworm"),
    ({"sources.list.d/vendor.list": "deb http://vendor.example/debian bookworm stable\n"},
     "no Debian archive entry for bookworm"),
])
def test_no_debian_archive_is_a_clear_error(tmp_path, files, match):
    etc = tmp_path / "apt"
    (etc / "sources.list.d").mkdir(parents=True)
    for name, text in files.items():
        (etc / name).write_text(text)
    with pytest.raises(aptsources.AptSourcesError, match=match):
        aptsources.sources_for(etc=etc, os_release=os_release(tmp_path))
    with pytest.raises(aptsources.AptSourcesError, match="os-release-missing: No such file"):
        aptsources.sources_for(etc=etc, os_release=tmp_path / "os-release-missing")
    (tmp_path / "bare").write_text("ID=debian\n")
    with pytest.raises(aptsources.AptSourcesError, match="no VERSION_CODENAME"):
        aptsources.sources_for(etc=etc, os_release=tmp_path / "bare")


def test_realdriver_private_states_use_the_machines_mirror(tmp_path, monkeypatch):
    """Both private apt states (the machine's release, trixie for 550) name the configured mirror;
    a machine without a Debian archive entry is a DownloadError (a skip, or a failure in CI)."""
    etc, read = fake_etc(tmp_path), aptsources.read_entries
    monkeypatch.setattr(aptsources, "read_entries", lambda *a: read(etc))
    monkeypatch.setattr(aptsources, "codename", lambda *a: "bookworm")
    for line in ("535", "550"):
        d = tmp_path / line
        d.mkdir()
        realdriver._write_sources(d, line)
        uris = [x for x in (d / "debian.sources").read_text().splitlines() if x.startswith("URIs:")]
        assert uris == ([f"URIs: {MIRROR}", f"URIs: {SECURITY}"] if line == "535" else [f"URIs: {MIRROR}"])
    monkeypatch.setattr(aptsources, "read_entries", lambda *a: [])
    with pytest.raises(realdriver.DownloadError, match="no Debian archive entry"):
        realdriver._write_sources(tmp_path, "550")
