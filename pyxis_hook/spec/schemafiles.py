"""Where this installation's JSON schemas are, and reading one: for the tools, the tests and `spec.confcheck`.

The schemas (`schemas/*.json`, the one copy) describe what the commands
print and what pyxis.conf may hold.  A steady container start reads none:
it takes the verdict on its pyxis.conf the node artifact records
(`spec.config`); only a start whose pyxis.conf changed finds
pyxis-conf.schema.json, through `spec.confcheck`.
"""

from __future__ import annotations

import sys

from pyxis_hook import pathnames


def _schema_dir() -> str:
    """The source tree's schemas/, else the installed data files.

    An installed copy has them in `<prefix>/share/pyxis-hook/schemas`, where
    <prefix> is whatever scheme pip used (venv, /usr/local, --user, --prefix)
    or /usr for the .deb and .rpm (modules in /usr/lib/python3/dist-packages
    or /usr/lib/python3.9/site-packages: four levels up): found by walking
    up from the package rather than from sys.prefix, which under `-I -S` is
    the base interpreter's.
    """
    pkg = pathnames.realpath(__file__)
    for _ in range(__name__.count(".")):  # up to the package's own dir, wherever this module sits in it
        pkg = pathnames.dirname(pkg)
    here = pathnames.join(pathnames.dirname(pkg), "schemas")
    if pathnames.isfile(pathnames.join(here, "pyxis-conf.schema.json")):
        return here
    up = pkg
    for _ in range(5):
        up = pathnames.dirname(up)
        cand = pathnames.join(up, "share", "pyxis-hook", "schemas")
        if pathnames.isdir(cand):
            return cand
    return pathnames.join(sys.prefix, "share", "pyxis-hook", "schemas")


def schema_path(name: str) -> str:
    """The path of schema file `name` (`pyxis-conf.schema.json`...) in `_schema_dir()`; not checked for existence."""
    return pathnames.join(_schema_dir(), name)


def schema_dir():
    """The directory holding our JSON schemas (source tree or installed data files), as a Path."""
    from pathlib import Path

    return Path(_schema_dir())


def load_schema(name: str) -> dict:
    """The schema file `name` (`pyxis-conf.schema.json`, `plan.schema.json`...), parsed."""
    from pyxis_hook import fastjson

    with open(schema_path(name), "rb") as f:
        return fastjson.loads(f.read())
