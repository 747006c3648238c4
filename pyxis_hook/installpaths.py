"""This installation's directories, for a run as a file without the site scan.

`python -I -S <dir>/pyxis_hook/__main__.py` skips `site`: no .pth file is
read or executed, and nothing but the package's own parent directory is on
sys.path (`__main__.py` puts it there).  What the site scan would have added
and the hook still needs, `add` adds: a venv's prefix (so share/pyxis-hook,
our schemas, is found) and this installation's site-packages as plain
directories searched last (pyelftools, for a node artifact rebuild).

It lives here, not in `__main__.py`: a script run as a file is compiled on
every run (no bytecode is cached for `__main__`); this module's bytecode is
cached, so no container start compiles these lines
(docs/decisions/2026-12-07-start-costs.md).
"""

import posix
import sys


def _mode(path: str) -> int:
    try:
        return posix.stat(path).st_mode & 0o170000
    except OSError:
        return 0


def add() -> None:
    """Do what `site.venv()` would (sys.prefix = the venv) and append site-packages; no .pth file is read.

    Only for an absolute interpreter path: an empty or relative one would
    make the answer depend on the working directory (the bundle, under
    runc), where a planted pyvenv.cfg could then choose the directories
    root imports from.
    """
    venv = sys.executable.rpartition("/")[0].rpartition("/")[0] if sys.executable.startswith("/") else ""
    if venv and _mode(venv + "/pyvenv.cfg") == 0o100000:
        sys.prefix = sys.exec_prefix = venv
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    # as site.getsitepackages lists them: EL keeps compiled modules (jsonschema's pyrsistent) under lib64
    for d in dict.fromkeys((f"{sys.prefix}/{sys.platlibdir}/{version}/site-packages",
                            f"{sys.prefix}/lib/{version}/site-packages", f"{sys.prefix}/lib/python3/dist-packages")):
        if d not in sys.path and _mode(d) == 0o040000:
            sys.path.append(d)
