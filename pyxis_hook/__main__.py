"""`python -m pyxis_hook` is the same program as the `pyxis-hook` console script.

It also runs as a file, `python -I -S <dir>/pyxis_hook/__main__.py prestart`:
`-S` skips the site scan (.pth files, an editable install's finder: 10-25 ms
per container start, bench/README.md) and `-I` ignores the environment, so
the package's own parent directory is put on sys.path here, and nothing else.
"""

import sys

if not __package__:  # run as a file: no site scan, find ourselves
    import os

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    # a venv's interpreter: do what site.venv() would (sys.prefix = the venv), minus .pth files,
    # so its site-packages (pyelftools) and share/pyxis-hook (our schemas) are found
    _venv = os.path.dirname(os.path.dirname(os.path.abspath(sys.executable)))
    if os.path.isfile(os.path.join(_venv, "pyvenv.cfg")):
        sys.prefix = sys.exec_prefix = _venv
    # our dependencies (pyelftools, for a snapshot rebuild) stay reachable: this installation's
    # site-packages as plain directories, searched last; no .pth file is read or executed
    _v = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    for _d in (os.path.join(sys.prefix, "lib", _v, "site-packages"),
               os.path.join(sys.prefix, "lib", "python3", "dist-packages")):
        if _d not in sys.path and os.path.isdir(_d):
            sys.path.append(_d)

if sys.argv[1:] in (["prestart"], ["createRuntime"]):  # the runtime's call: not even cli.py
    from pyxis_hook.commands.prestart import main_fast

    sys.exit(main_fast())

from pyxis_hook.cli import main  # noqa: E402

sys.exit(main())
