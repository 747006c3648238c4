"""Root tests: pyxis_hook.loader.ldcache and pyxis_hook.loader.ldconf without running ldconfig (oracle tests: tests/oracles/).

They need root (mounts, mknod, namespaces, chown); the unit tests of the same module are in
`tests/unit/loader/test_ldcache.py`, whose helpers and fixtures they share.
"""

from __future__ import annotations

import os
import pytest
from unit.loader.test_ldcache import (  # noqa: F401 - helpers and fixtures shared with the unit tests
    _read_conf,
    conf_mode,
    write,
)


@pytest.mark.root
@pytest.mark.parametrize("kind", ["fifo", "device", "huge", "dir"])
def test_ld_so_conf_fifo_device_and_huge_file_are_not_read(tmp_path, conf_mode, no_hang, kind):
    import stat as S

    from pyxis_hook.loader.conftree import CONF_LIMIT, DEVICE, LIMIT, NOT_REGULAR

    write(tmp_path, "/etc/ld.so.conf", "/opt/a\ninclude /etc/ld.so.conf.d/*.conf\n/opt/b\n")
    d = tmp_path / "etc/ld.so.conf.d"
    d.mkdir()
    f = d / "1.conf"
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "device":
        os.mknod(f, S.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero: never ends
    elif kind == "huge":
        f.write_bytes(b"/opt/huge\n" + b"#" * CONF_LIMIT)
    else:
        f.mkdir()  # ldconfig reads a directory as empty, silently
    write(tmp_path, "/etc/ld.so.conf.d/2.conf", "/opt/two\n")
    conf = _read_conf(tmp_path, conf_mode)
    if kind == "dir":
        assert conf.dirs == ("/opt/a", "/opt/two", "/opt/b") and not conf.truncated
        return
    assert conf.dirs == ("/opt/a",)  # the read stops at the first problem
    assert conf.truncated and conf.unsafe and len(conf.problems) == 1
    assert conf.stop == {"fifo": NOT_REGULAR, "device": DEVICE, "huge": LIMIT}[kind]
    assert "/etc/ld.so.conf.d/1.conf" in conf.problems[0]
    assert {"fifo": "a FIFO", "device": "a character device", "huge": "larger than"}[kind] in conf.problems[0]
