"""`python -m pyxis_hook` is the same program as the `pyxis-hook` command (bin/pyxis-hook imports this module).

It also runs as a file, `python -I -S <dir>/pyxis_hook/__main__.py prestart`:
`-S` skips the site scan (.pth files, an editable install's finder: 10-25 ms
per container start, bench/README.md) and `-I` ignores the environment, so
the package's own parent directory is put on sys.path here, and nothing else.
"""

import sys

if not __package__:  # run as a file: no site scan, find ourselves
    # `posix` is os's builtin core: under -S nothing has imported `os` yet, and it costs ~1 ms of
    # the ~9 ms a container that asks for no GPU may take (1.3x a bare interpreter); os is used only for a link
    import posix

    def _mode(path: str) -> int:
        try:
            return posix.stat(path).st_mode & 0o170000
        except OSError:
            return 0

    _file = __file__
    if posix.lstat(_file).st_mode & 0o170000 == 0o120000:  # __main__.py is a symlink: where it points
        import os

        _file = os.path.realpath(_file)
    elif not _file.startswith("/"):
        _file = posix.getcwd() + "/" + _file
    sys.path.insert(0, _file.rpartition("/")[0].rpartition("/")[0] or "/")
    # a venv's interpreter: do what site.venv() would (sys.prefix = the venv), minus .pth files,
    # so its site-packages (pyelftools) and share/pyxis-hook (our schemas) are found.  Only for an
    # absolute interpreter path: an empty or relative one would make the answer depend on the
    # working directory (the bundle, under runc), where a planted pyvenv.cfg could then choose
    # the directories root imports from.
    _venv = sys.executable.rpartition("/")[0].rpartition("/")[0] if sys.executable.startswith("/") else ""
    if _venv and _mode(_venv + "/pyvenv.cfg") == 0o100000:
        sys.prefix = sys.exec_prefix = _venv
    # our dependencies (pyelftools, for a snapshot rebuild) stay reachable: this installation's
    # site-packages as plain directories, searched last; no .pth file is read or executed
    _v = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for _d in (f"{sys.prefix}/lib/{_v}/site-packages", f"{sys.prefix}/lib/python3/dist-packages"):
        if _d not in sys.path and _mode(_d) == 0o040000:
            sys.path.append(_d)

from pyxis_hook.commands.prestart import dispatch_fast  # noqa: E402 — the runtime's call: not even cli.py

_rc = dispatch_fast(sys.argv[1:])
if _rc is not None:
    # The runtime's call ends here without the interpreter's teardown: freeing ~80 modules'
    # objects one by one is ~10% of a GPU start and frees nothing the kernel does not free at
    # exit.  The log file is written unbuffered (log.py) and the apply child has exited, so only
    # Python's own stdout/stderr buffers hold anything: flushed first.
    import posix

    for _stream in (sys.stdout, sys.stderr):
        try:
            _stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say to it
            pass
    posix._exit(_rc & 0xFF)
from pyxis_hook.cli import main  # noqa: E402

sys.exit(main())
