"""Writing the files that register pyxis-hook on a host (hooks.d JSON, CDI spec, enroot shim).

One way for all of them: a temporary file next to the target, opened
O_NOFOLLOW (never through a link someone planted), then renamed over the
target, so an engine watching the directory never reads half a file.
"""

from __future__ import annotations

import os

from pyxis_hook.errors import UsageError


def install_text(path: str, text: str, mode: int = 0o644) -> str:
    """Atomically write `text` to `path` with `mode`, as UTF-8 (surrogate escapes back to the bytes they
    stand for, so text read with `surrogateescape` is written back unchanged); UsageError naming the path.

    The directory must exist ("<dir>: not a directory"): an install never
    creates engine configuration directories the engine does not read.
    """
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise UsageError(f"{d}: not a directory")
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8", "surrogateescape"))
        os.chmod(tmp, mode)  # the umask may have trimmed it
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UsageError(f"{path}: cannot write: {e.strerror}") from None
    return path
