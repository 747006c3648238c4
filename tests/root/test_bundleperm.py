"""bundleperm: who besides root can change a bundle a root hook reads (the `writable-bundle` key)."""

from __future__ import annotations

import os

import pytest

from pyxis_hook.spec.bundleperm import WritableBundleError, bundle_writers, check_bundle
from pyxis_hook.spec.config import parse_config
from pyxis_hook.errors import ConfigError

pytestmark = pytest.mark.root  # chown

NOBODY = 65534


@pytest.fixture
def bundle(tmp_path):
    """tmp_path/a/bundle/config.json, all root's, 0755/0644 (tmp_path's parents are root's too)."""
    d = tmp_path / "a/bundle"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "config.json").chmod(0o644)
    d.chmod(0o755)
    (tmp_path / "a").chmod(0o755)
    return d


def _writers(d):
    return bundle_writers(str(d), str(d / "config.json"))


def test_a_root_owned_bundle_has_no_other_writer(bundle):
    assert _writers(bundle) is None


@pytest.mark.parametrize("change, words", [
    (lambda d: os.chown(d, NOBODY, -1), "bundle is owned by uid 65534"),
    (lambda d: os.chown(d / "config.json", NOBODY, -1), "config.json is owned by uid 65534"),
    (lambda d: (d / "config.json").chmod(0o666), "config.json is writable by every user (mode 0666)"),
    (lambda d: d.chmod(0o775), "bundle is writable by group 0 (mode 0775)"),
    (lambda d: d.chmod(0o1777), "bundle is writable by every user (mode 1777)"),
    (lambda d: os.chown(d.parent, NOBODY, -1), "/a is owned by uid 65534"),
    (lambda d: d.parent.chmod(0o777), "/a is writable by every user (mode 0777)"),
])
def test_the_first_place_another_user_can_write_is_named(bundle, change, words):
    change(bundle)
    assert words in _writers(bundle)


def test_a_sticky_dir_above_counts_only_for_an_entry_that_is_not_roots(bundle):
    bundle.parent.chmod(0o1777)  # as /tmp: others may add entries, not rename root's bundle
    assert _writers(bundle) is None
    os.chown(bundle, NOBODY, -1)
    assert "bundle is owned by uid 65534" in _writers(bundle)


def test_warn_returns_the_line_refuse_raises_it(bundle):
    os.chown(bundle, NOBODY, -1)
    line = check_bundle(str(bundle), str(bundle / "config.json"), "warn", euid=0)
    assert line and "\n" not in line and 'writable-bundle = "refuse"' in line
    with pytest.raises(WritableBundleError, match=f"bundle {bundle}: {bundle} is owned by uid 65534"):
        check_bundle(str(bundle), str(bundle / "config.json"), "refuse", euid=0)


def test_a_hook_not_running_as_root_is_not_concerned(bundle):
    os.chown(bundle, NOBODY, -1)
    assert check_bundle(str(bundle), str(bundle / "config.json"), "refuse", euid=1000) is None


def test_the_key_takes_warn_or_refuse_and_defaults_to_warn():
    assert parse_config(b"").writable_bundle == "warn"
    assert parse_config(b'writable-bundle = "refuse"\n').writable_bundle == "refuse"
    with pytest.raises(ConfigError, match="writable-bundle"):
        parse_config(b'writable-bundle = "ignore"\n')
