"""A pyxis.conf's kept verdict: the bytes the schema accepted, kept beside the node artifact so a start need not check them again.

`holds(raw, path, snapshot_dir)` is True when `<snapshot-dir>/pyxis-conf-<digest of path>.ok`
passes the trust rule (`pyxis_hook.trust`: the package owner's, writable by
nobody else), holds exactly `raw` and names the schema file it was checked
against with that file's stat signature as it is now: a changed pyxis.conf,
a changed or reinstalled schema, or no file at all is False (the caller then
checks with jsonschema, `spec.confcheck`).  Reads only: one stat of the
directory, one open, one stat of the schema file.

`keep(...)` writes such a file whole after a successful check, only as the
package's owner (`trust.may_write`), in snapshot-dir (made, one level, when
absent: the node artifact's build would make it on the same start, after
the check); it never raises.  Only valid bytes are kept: an invalid file is checked
(and refused) on every start.
"""

import posix

from pyxis_hook import trust
from pyxis_hook.rootfs import read_to_end

#: the file's first line: bumped when its layout changes
FORMAT = b"pyxis-hook pyxis.conf verdict 1\n"
#: the largest verdict read: pyxis.conf's own limit and the header
LIMIT = (1 << 20) + (1 << 12)
_DIGEST_PRIME = 4294967291  # 2**32 - 5, as the node artifact's name


def verdict_path(path: str, snapshot_dir: str) -> str:
    """`<snapshot_dir>/pyxis-conf-<digest of the configuration's path>.ok`: one file per pyxis.conf path."""
    digest = int.from_bytes(path.encode("utf-8", "surrogateescape"), "big") % _DIGEST_PRIME
    return f"{snapshot_dir.rstrip('/')}/pyxis-conf-{digest:08x}.ok"


def signature(st) -> str:
    """A file's stat signature as a verdict line holds it: any rewrite, reinstall or replacement changes it."""
    return f"{st.st_dev} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}"


def holds(raw: bytes, path: str, snapshot_dir: str) -> bool:
    """Whether a trusted verdict says `raw` (pyxis.conf at `path`) passed the schema as it is now (module doc)."""
    fd, why = trust.open_trusted(verdict_path(path, snapshot_dir))
    if why:
        return False
    try:
        kept = read_to_end(fd, LIMIT)  # closes fd
    except OSError:
        return False
    if not kept.startswith(FORMAT):
        return False
    line, sep, body = kept[len(FORMAT):].partition(b"\n")
    if not sep or body != raw:
        return False
    sig, _, schema = line.decode("utf-8", "surrogateescape").partition(" /")
    try:
        return signature(posix.stat("/" + schema)) == sig
    except OSError:
        return False


def keep(raw: bytes, path: str, snapshot_dir: str, schema: str, schema_signature: str) -> None:
    """Record that `raw` (pyxis.conf at `path`) passed the schema file `schema` with `schema_signature`.

    Nothing when this process may not write cache files, the directory is
    untrusted (or cannot be made), or any write fails: the next start checks again.
    """
    if not trust.may_write() or not schema.startswith("/") or "\n" in schema:
        return
    target = verdict_path(path, snapshot_dir)
    try:
        try:
            st = posix.stat(snapshot_dir)
        except FileNotFoundError:
            posix.mkdir(snapshot_dir, 0o755)
            posix.chmod(snapshot_dir, 0o755)  # whatever the umask
            st = posix.stat(snapshot_dir)
        if trust.why_untrusted(st):
            return
        data = FORMAT + f"{schema_signature} {schema}\n".encode("utf-8", "surrogateescape") + raw
        trust.write_whole(target, data)
    except OSError:
        return
