"""installpaths: what the site scan would add for the hook run with -S, and nothing else."""

from __future__ import annotations

import sys

from pyxis_hook import installpaths


def test_site_packages_as_site_lists_them_lib64_first(tmp_path, monkeypatch):
    """EL's python3 keeps compiled modules (jsonschema's pyrsistent) under lib64: both directories are searched."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for lib in ("lib64", "lib"):
        (tmp_path / lib / version / "site-packages").mkdir(parents=True)
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python3")  # not a venv
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    monkeypatch.setattr(sys, "platlibdir", "lib64")
    monkeypatch.setattr(sys, "path", ["/first"])
    installpaths.add()
    assert sys.path == ["/first", f"{tmp_path}/lib64/{version}/site-packages", f"{tmp_path}/lib/{version}/site-packages"]
