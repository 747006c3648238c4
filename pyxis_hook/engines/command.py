"""The `pyxis-hook` command pip installs, made as fast as the registered form on its first run.

pip writes a wheel's script with `#!<python>` and drops whatever flags the
script's own first line had (pip's `fix_script`), so every run of the
installed `pyxis-hook` pays Python's site scan: `import os`, the .pth files
of site-packages, `sitecustomize` (~3 ms, a tenth of a GPU container start).
A runtime that was told `"path": "/usr/local/bin/pyxis-hook"` by hand, or the
enroot shim that execs `pyxis-hook enroot`, would pay it on every container.

So the command's first run by the user who owns it rewrites it, once, into
what `hookd --install` registers: `#!<the same python> -IS` (no site scan, no
environment), a body that puts this package's own directory on sys.path and
then runs the program as before (`installpaths` adds the rest of this
installation, as for `python -I -S .../__main__.py`).  The rewrite is made
only where it cannot do harm, and is skipped silently otherwise (the command
then keeps working with the site scan; `doctor` says why):

* the script is a regular file holding exactly what pip wrote from ours (an
  interpreter line without flags, then our body), so no other file is ever
  written, and this run's interpreter is the one it names;
* the package this run imported is the one installed beside the script
  (under the same prefix), so that nothing the first run's environment
  chose (PYTHONPATH, a user site) is written into it;
* it and its directory belong to the caller (or the directory to root), as
  do the package's directory and the one holding it, and none is writable by
  group or others, the trust rule of the snapshot directory: nobody else can
  have placed or swapped them;
* the new first line fits the kernel's limit (BINPRM_BUF_SIZE, 256 bytes) and
  names an interpreter without whitespace (Linux passes one argument after it:
  `-IS`, both flags in one);
* it is written next to the script with O_EXCL|O_NOFOLLOW, fsync'ed and
  renamed over it, as the snapshot is (`snapshot.write_atomically`): a runtime exec'ing the command meanwhile gets the old file
  or the new one, and concurrent first runs write the same bytes.

pip's RECORD then lists another hash for the file; `pip uninstall` removes it
by path all the same, and a reinstall brings back pip's form until its next
run.
"""

from __future__ import annotations

import os
import stat
import sys

#: what bin/pyxis-hook holds after its first line, as pip installs it (a test keeps the two equal)
SHIPPED_BODY = '''\
"""The `pyxis-hook` command (pip writes this interpreter's path into the first line).

A plain script rather than a `console_scripts` entry point: pip's generated
entry-point script imports `re` before our code runs.  pip drops the flags of
this first line, so this run pays Python's site scan; when it may, it
rewrites this file into the registered form (`-IS`: no site scan), once
(pyxis_hook/engines/command.py says when).  Importing `pyxis_hook.__main__`
runs the program exactly as `python -m pyxis_hook` does.
"""
from pyxis_hook.engines.command import upgrade

upgrade(__file__)
import pyxis_hook.__main__  # noqa: E402,F401  # runs the command and exits
'''

#: the body of the rewritten command; {path} is the directory holding the package
FAST_BODY = '''\
"""The `pyxis-hook` command, rewritten by its first run: no site scan (-IS), as hookd registers it."""
import sys

sys.path.insert(0, {path!r})
from pyxis_hook import installpaths

installpaths.add()
import pyxis_hook.__main__  # runs the command and exits
'''

#: the kernel reads at most this much of an interpreter line (BINPRM_BUF_SIZE since Linux 5.1)
SHEBANG_LIMIT = 256


def package_parent() -> str:
    """The directory whose `pyxis_hook` is this package (site-packages, or a checkout for an editable install)."""
    path = os.path.abspath(__file__)
    for _ in range(__name__.count(".") + 1):  # up from this file past the package's own dir
        path = os.path.dirname(path)
    return path


def fast_text(python: str, parent: str | None = None) -> str:
    """The rewritten command: `#!<python> -IS` and FAST_BODY."""
    return f"#!{python} -IS\n" + FAST_BODY.format(path=parent or package_parent())


def _unsafe(st: os.stat_result, owners: tuple[int, ...]) -> bool:
    return st.st_uid not in owners or bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def why_not(script: str, euid: int | None = None, parent: str | None = None) -> tuple[str, str, bytes]:
    """(the reason `script` is not rewritten, or "", its real path, the new text) without writing.

    The reason is "" when the rewrite may be made; "fast" when the command
    already runs without the site scan.  `parent`: the directory holding
    the package this process runs (`package_parent()`), which the new text
    names: it must be this installation's own (under the script's prefix,
    `<prefix>/bin/pyxis-hook` and `<prefix>/lib/...`, as pip lays out a
    venv, `--user` or a system install) and closed to others, so that
    nothing this run's environment chose (PYTHONPATH, a user site, a .pth
    file) is written into a command root runs.  An editable install
    (the package in a checkout) keeps pip's form.
    """
    reason, real, new, dir_fd, _mode = _examine(script, euid, parent)
    if dir_fd >= 0:
        os.close(dir_fd)
    return reason, real, new


def _examine(script: str, euid: int | None, parent: str | None) -> tuple[str, str, bytes, int, int]:
    """`why_not`'s answer, the script directory's fd (when the rewrite may be made, else -1) and the script's mode.

    The directory is opened once, checked through its fd, and the script
    read and (by `upgrade`) replaced through it: what a swapped directory on
    the way to it would name is never looked at again.
    """
    euid = os.geteuid() if euid is None else euid
    parent = os.path.realpath(parent or package_parent())
    real = os.path.realpath(script)
    directory, name = os.path.split(real)
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return f"{directory}: {e.strerror}", real, b"", -1, 0
    try:
        reason, new, mode = _judge(real, dir_fd, name, euid, parent)
    except BaseException:
        os.close(dir_fd)
        raise
    if reason:
        os.close(dir_fd)
        return reason, real, b"", -1, 0
    return "", real, new, dir_fd, mode


def _judge(real: str, dir_fd: int, name: str, euid: int, parent: str) -> tuple[str, bytes, int]:
    """(the reason not to rewrite, or "", the new text, the script's mode) for `name` in directory `dir_fd`."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as e:
        return f"{real}: cannot open: {e.strerror}", b"", 0
    try:
        st = os.fstat(fd)
        data = os.read(fd, 64 * 1024) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    first, _, rest = data.partition(b"\n")
    if first.endswith(b" -IS") and rest.startswith(FAST_BODY.partition("\n")[0].encode()):
        return "fast", b"", 0
    python = first[2:].decode(errors="replace")
    if not stat.S_ISREG(st.st_mode) or not first.startswith(b"#!/") or rest.decode(errors="replace") != SHIPPED_BODY:
        return f"{real}: not the command as pip installs it", b"", 0
    if any(c.isspace() for c in python) or not os.access(python, os.X_OK):
        return f"{real}: its interpreter {python!r} is not a plain executable path", b"", 0
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return f"{real}: run by {sys.executable}, not by its own interpreter {python}", b"", 0
    prefix = os.path.dirname(os.path.dirname(real))
    if not parent.startswith(os.path.join(prefix, "lib", "")):
        return f"{real}: this run's package ({parent}) is not the one installed beside it", b"", 0
    new = fast_text(python, parent).encode()
    if len(new.partition(b"\n")[0]) >= SHEBANG_LIMIT:
        return f"{real}: its interpreter line would pass the kernel's {SHEBANG_LIMIT}-byte limit", b"", 0
    if _unsafe(st, (euid,)):
        return f"{real}: not the caller's own file, or writable by group or others", b"", 0
    for d, dst in ((os.path.dirname(real), os.fstat(dir_fd)), (parent, None), (os.path.join(parent, "pyxis_hook"), None)):
        try:
            dst = dst or os.stat(d)
        except OSError as e:
            return f"{d}: {e.strerror}", b"", 0
        if _unsafe(dst, (euid, 0)):
            return f"{d}: not the caller's or root's, or writable by group or others", b"", 0
    return "", new, stat.S_IMODE(st.st_mode)


def upgrade(script: str, parent: str | None = None) -> bool:
    """Rewrite the installed command `script` into its fast form when `why_not` allows; True if written.

    Written through the directory fd `_examine` checked.  Never raises: the
    command this runs in must go on whatever happens here.
    """
    if sys.flags.no_site:
        return False
    try:
        reason, real, new, dir_fd, mode = _examine(script, None, parent)
    except (OSError, ValueError):
        return False
    if reason:
        return False
    from pyxis_hook.host.snapshot import write_atomically

    try:
        write_atomically(os.path.basename(real), new, mode, dir_fd=dir_fd)
    except OSError:
        return False
    finally:
        os.close(dir_fd)
    return True
