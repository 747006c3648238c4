"""`python -m pyxis_hook` is the same program as the `pyxis-hook` command (bin/pyxis-hook imports this module).

It also runs as a file, `python -I -S <dir>/pyxis_hook/__main__.py prestart`:
`-S` skips the site scan (.pth files, an editable install's finder) and `-I`
ignores the environment, so the package's own parent directory is put on
sys.path here, and nothing else (`installpaths` adds this installation's
own directories, whenever the site scan did not run: also under the
launcher `pyxis-hook install` writes, which imports this module).  Run as
a file, this module is compiled on every run: what can live elsewhere does.
"""

import sys

if not __package__:  # run as a file: find ourselves; `posix`, not `os` (docs/decisions/2026-12-07-start-costs.md)
    import posix

    _file = __file__
    if posix.lstat(_file).st_mode & 0o170000 == 0o120000:  # a symlink: where it points
        import os

        _file = os.path.realpath(_file)
    elif not _file.startswith("/"):
        _file = posix.getcwd() + "/" + _file
    sys.path.insert(0, _file.rpartition("/")[0].rpartition("/")[0] or "/")
from pyxis_hook import startimage  # noqa: E402

if startimage.fast_kind(sys.argv[1:]) is not None:  # a container start: the dispatch and no-GPU check from the image
    startimage.load_boot()
if sys.flags.no_site:  # run as a file or by the launcher, without the site scan
    from pyxis_hook import installpaths

    installpaths.add()

from pyxis_hook import start  # noqa: E402 — the runtime's call: not even cli.py

_rc = start.dispatch(sys.argv[1:])
if _rc is not None:
    start.end(_rc)
from pyxis_hook.cli import main  # noqa: E402

sys.exit(main())
