"""ldcheck: each cause of "CUDA does not see the GPU" inside an image gives its exact finding.

Images are built by tests/fixtures/container.py, the driver by fakedriver.py
(plus a gcc-built libGLX_nvidia that needs libX11.so.6), the host procfs by
hosttree.py.  The root-only oracle runs the image's real glibc loader in a
chroot (LD_DEBUG=libs) after copying the driver files in, and compares the
file it loads with what ldcheck predicted.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fixtures.container import make_bundle, make_rootfs
from fixtures.fakedriver import make_fake_driver
from fixtures.hosttree import make_host_tree
from fixtures.synth import build_lib
from pyxis_hook import cli
from pyxis_hook.diag import cudacheck, ldcheck, ldmodel
from pyxis_hook.loader import cachelookup
from pyxis_hook.spec.config import Config
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.diag.findings import SEVERITIES, Finding, format_finding, worst
from pyxis_hook.host.discovery import discover
from pyxis_hook.plan.build import COMPAT_DIR

VERSION = "535.104.05"
LIBDIR = "usr/lib/x86_64-linux-gnu"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    base = tmp_path_factory.mktemp("ldcheck-host")
    drv = make_fake_driver(base / "drv", VERSION)
    glx = build_lib(base / "glx", "libGLX_nvidia.so.0", filename=f"libGLX_nvidia.so.{VERSION}",
                    needed=("libX11.so.6",))
    shutil.copy2(glx, drv / LIBDIR / glx.name)
    (drv / LIBDIR / "libGLX_nvidia.so.0").symlink_to(glx.name)
    subprocess.run(["ldconfig", "-r", str(drv)], check=True)
    tree = make_host_tree(base, driver_version=VERSION, make_nodes=False)
    cfg = Config(driver_root=str(drv), proc_root=tree.proc_root, dev_root=tree.dev_root,
                 snapshot_dir=str(base / "snap"))
    inv = discover(cfg, strict=False)
    assert inv.usable and inv.cuda_version == 12020
    conf = base / "pyxis.conf"
    conf.write_text(f'driver-root = "{drv}"\nproc-root = "{tree.proc_root}"\ndev-root = "{tree.dev_root}"\n'
                    f'snapshot-dir = "{base / "snap"}"\n')
    return cfg, inv, conf


@pytest.fixture
def image(tmp_path):
    return make_rootfs(tmp_path / "img", gputest=False)


def check(host, root, env=None, caps=None, source="bundle", **cfg_changes):
    cfg, inv, _ = host
    if cfg_changes:
        from pyxis_hook.record import replace
        cfg = replace(cfg, **cfg_changes)
    env = {"NVIDIA_VISIBLE_DEVICES": "all", **(env or {})}
    return ldcheck.check_image(str(root), env, inv, cfg, capabilities=caps, source=source)


def only(report, code) -> Finding:
    hits = [f for f in report.findings if f.code == code]
    assert len(hits) == 1, (code, report.findings)
    return hits[0]


def codes(report) -> set[str]:
    return {f.code for f in report.findings}


def errors(report) -> list[Finding]:
    return [f for f in report.findings if f.severity == "error"]


def put_lib(root: Path, rel_dir: str, soname: str, filename: str | None = None, **kw) -> Path:
    built = build_lib(root.parent / "build" / rel_dir.strip("/").replace("/", "_"), soname,
                      filename=filename, **kw)
    d = root / rel_dir.strip("/")
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, d / built.name)
    return d / built.name


# --------------------------------------------------------------------- the clean case


def test_clean_image_resolves_every_library_to_the_host_file(host, image):
    r = check(host, image)
    assert not errors(r)
    sonames = {x.soname for x in r.libraries}
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= sonames
    for res in r.libraries:
        assert res.outcome == "host" and res.is_host_file
        assert res.injected == f"/{LIBDIR}/{res.soname.split('.so')[0]}.so.{VERSION}"
        assert res.how == "ld.so.cache"  # the merged cache lists the injected SONAME link
    assert only_ok(r, "libcuda.so.1")


def test_non_debian_image_gets_usr_lib64(host, tmp_path):
    image = make_rootfs(tmp_path / "rhel", debian=False, gputest=False)
    r = check(host, image)
    assert not errors(r)
    cuda = next(x for x in r.libraries if x.soname == "libcuda.so.1")
    assert cuda.outcome == "host" and cuda.injected == f"/usr/lib64/libcuda.so.{VERSION}"


def only_ok(r, soname) -> bool:
    return any(f.code == "resolves-to-host" and f.what.startswith(soname + " ->") for f in r.findings)


# --------------------------------------------------------------------- shadowing


def test_toolkit_stub_on_ld_library_path_shadows_libcuda(host, image):
    put_lib(image, "usr/local/cuda/lib64/stubs", "libcuda.so.1")
    r = check(host, image, {"LD_LIBRARY_PATH": "/usr/local/cuda/lib64/stubs"})
    f = only(r, "stub-shadows-driver")
    assert f.severity == "error"
    assert "/usr/local/cuda/lib64/stubs/libcuda.so.1" in f.what and "LD_LIBRARY_PATH" in f.what
    assert f.fix == "remove /usr/local/cuda/lib64/stubs from LD_LIBRARY_PATH (image ENV or the container's environment)"
    res = next(x for x in r.libraries if x.soname == "libcuda.so.1")
    assert res.outcome == "image" and res.path == "/usr/local/cuda/lib64/stubs/libcuda.so.1"
    # the other libraries are unaffected
    assert next(x for x in r.libraries if x.soname == "libnvidia-ml.so.1").outcome == "host"


def test_old_compat_dir_on_ld_library_path_shadows_libcuda(host, image):
    lib = put_lib(image, "usr/local/cuda/compat", "libcuda.so.1", filename="libcuda.so.470.57.02")
    (lib.parent / "libcuda.so.1").symlink_to(lib.name)
    r = check(host, image, {"LD_LIBRARY_PATH": "/usr/local/cuda/compat:/usr/local/nvidia/lib64"})
    f = only(r, "compat-shadows-driver")
    assert f.severity == "error"
    assert "/usr/local/cuda/compat/libcuda.so.1 (-> /usr/local/cuda/compat/libcuda.so.470.57.02)" in f.what
    assert "driver 470" in f.why and VERSION in f.why
    assert "remove /usr/local/cuda/compat from LD_LIBRARY_PATH" in f.fix
    only(r, "compat-not-used")


def test_newer_compat_libcuda_is_reported_not_failed(host, image):
    lib = put_lib(image, "usr/local/cuda/compat", "libcuda.so.1", filename="libcuda.so.550.54.15")
    (lib.parent / "libcuda.so.1").symlink_to(lib.name)
    r = check(host, image, {"LD_LIBRARY_PATH": "/usr/local/cuda/compat"})
    f = only(r, "compat-libcuda-used")
    assert f.severity == "info" and "driver 550 on a 535 host" in f.what
    assert not errors(r)


def test_bundled_libnvidia_ml_shadows_the_host_one(host, image):
    put_lib(image, "opt/app/lib", "libnvidia-ml.so.1")
    r = check(host, image, {"LD_LIBRARY_PATH": "/opt/app/lib"})
    f = only(r, "image-copy-shadows-driver")
    assert f.what.startswith("libnvidia-ml.so.1 resolves to the image's own /opt/app/lib/libnvidia-ml.so.1 "
                             "via LD_LIBRARY_PATH")
    assert f"/{LIBDIR}/libnvidia-ml.so.{VERSION}" in f.what
    assert "version mismatch" in f.why


def test_image_copy_at_the_soname_path_is_covered_by_the_host_file(host, image):
    """A regular libnvidia-ml.so.1 of the image in the injection dir, in its cache (via /lib -> usr/lib): the hook
    binds the host's file over it (plan.link_edit), so it resolves to the host's file, with a warning naming it.
    A directory at libcuda.so.1 cannot be covered: the loader meets the image's directory."""
    put_lib(image, LIBDIR, "libnvidia-ml.so.1")
    (image / LIBDIR / "libcuda.so.1").mkdir()
    subprocess.run(["ldconfig", "-r", str(image)], check=True)
    r = check(host, image)
    nvml = next(x for x in r.libraries if x.soname == "libnvidia-ml.so.1")
    assert nvml.outcome == "host" and nvml.injected == f"/{LIBDIR}/libnvidia-ml.so.{VERSION}"
    f = only(r, "image-file-covered")
    assert f.severity == "warning"
    assert f.what.startswith(f"/{LIBDIR}/libnvidia-ml.so.1 is the image's own file; the hook covers it with "
                             "the host's ")
    assert f.fix.startswith(f"delete /{LIBDIR}/libnvidia-ml.so.1 from the image")
    cuda = next(x for x in r.libraries if x.soname == "libcuda.so.1")
    assert cuda.outcome != "host"


def test_ld_library_path_tokens_expand_like_ld_so(host, image):
    put_lib(image, "opt/lib/x86_64-linux-gnu", "libnvidia-ml.so.1")
    r = check(host, image, {"LD_LIBRARY_PATH": "/opt/$LIB:$ORIGIN/../lib"})
    assert "/opt/lib/x86_64-linux-gnu/libnvidia-ml.so.1" in only(r, "image-copy-shadows-driver").what


def test_ld_library_path_without_driver_copies_is_harmless(host, image):
    (image / "opt/empty").mkdir(parents=True)
    r = check(host, image, {"LD_LIBRARY_PATH": "/opt/empty::/nonexistent"})
    assert not errors(r)


@pytest.mark.parametrize("content,reason", [(b"\x7fELF\x02\x01\x01", "file too short"),
                                            (b"not an ELF file at all, but long enough " * 4, "invalid ELF header")])
def test_corrupt_candidate_before_the_host_file_is_fatal(host, image, content, reason):
    d = image / "opt/broken"
    d.mkdir(parents=True)
    (d / "libcuda.so.1").write_bytes(content)
    r = check(host, image, {"LD_LIBRARY_PATH": "/opt/broken"})
    f = only(r, "fatal-shadowing")
    assert f.what.startswith(f"/opt/broken/libcuda.so.1: {reason}")
    assert f"/{LIBDIR}/libcuda.so.{VERSION}" in f.what
    assert "remove /opt/broken from LD_LIBRARY_PATH" in f.fix
    assert next(x for x in r.libraries if x.soname == "libcuda.so.1").outcome == "fatal"


def test_32bit_copy_in_a_64bit_search_dir_is_skipped_and_reported(host, image):
    put_lib(image, "opt/lib", "libnvidia-ml.so.1", m32=True)
    r = check(host, image, {"LD_LIBRARY_PATH": "/opt/lib"})
    f = only(r, "wrong-class")
    assert f.severity == "warning"
    assert f.what.startswith("/opt/lib/libnvidia-ml.so.1 is a 32-bit ELF")
    res = next(x for x in r.libraries if x.soname == "libnvidia-ml.so.1")
    assert res.outcome == "host"
    assert [c.outcome for c in res.tried] == ["skipped", "host"]


# --------------------------------------------------------------------- non-driver dependencies


def test_glx_without_libx11_in_the_image(host, image):
    r = check(host, image, caps="graphics")
    f = only(r, "missing-dependency")
    assert f.severity == "error"
    assert f.what == "libX11.so.6 (64-bit), needed by libGLX_nvidia.so.0, is not in the image"
    assert "apt-get install libx11-6" in f.fix and "dnf install libX11" in f.fix
    assert "missing-dependency" not in codes(check(host, image, caps="compute,utility"))


def test_glx_with_libx11_in_the_image(host, image):
    put_lib(image, LIBDIR, "libX11.so.6")
    subprocess.run(["ldconfig", "-r", str(image)], check=True)
    assert "missing-dependency" not in codes(check(host, image, caps="graphics"))


# --------------------------------------------------------------------- CUDA compatibility


def test_require_cuda_newer_than_the_host_driver(host, image):
    r = check(host, image, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brand=tesla,driver>=470,driver<471"})
    f = only(r, "cuda-version-mismatch")
    assert f.severity == "error"
    assert f.what.startswith("NVIDIA_REQUIRE_CUDA='cuda>=12.4")
    assert f"host driver {VERSION} provides CUDA 12.2" in f.what
    assert "insufficient" in f.why
    assert "CUDA 12.4" in f.fix


def test_legacy_cuda_version_newer_than_the_host_driver(host, image):
    f = only(check(host, image, {"CUDA_VERSION": "12.4.1"}), "cuda-version-mismatch")
    assert f.what == ("CUDA_VERSION='12.4.1' (legacy image without NVIDIA_REQUIRE_CUDA) needs CUDA 12.4 "
                      f"but the host driver {VERSION} provides CUDA 12.2")


def test_satisfied_requirement_gives_no_finding(host, image):
    r = check(host, image, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "CUDA_VERSION": "12.0.1"})
    assert not {"cuda-version-mismatch", "cuda-needs-compat"} & codes(r)


def test_shipped_cudart_newer_than_the_host_driver(host, image):
    put_lib(image, "usr/local/cuda/lib64", "libcudart.so.12", filename="libcudart.so.12.4.127")
    f = only(check(host, image), "cudart-newer-than-driver")
    assert f.what.startswith("/usr/local/cuda/lib64/libcudart.so.12.4.127 is CUDA 12.4")


def compat_lib(image: Path, version: str, drivers=None) -> Path:
    """The image's /usr/local/cuda/compat/libcuda.so.<version> with its SONAME link, and with NVIDIA's
    `.note.cuda.fwd_compatibility` listing `drivers` (None: no note), added by objcopy as CUDA's are."""
    lib = put_lib(image, COMPAT_DIR, "libcuda.so.1", filename=f"libcuda.so.{version}")
    (lib.parent / "libcuda.so.1").symlink_to(lib.name)
    if drivers is not None:
        desc = json.dumps({"CUDA Version": "12.4", "Driver": list(drivers)}).encode()
        owner = b"NVIDIA Corporation\0"
        pad = lambda b: b + b"\0" * (-len(b) % 4)  # noqa: E731
        raw = image.parent / f"note-{version}.bin"
        raw.write_bytes(struct.pack("<III", len(owner), len(desc), 1) + pad(owner) + pad(desc))
        subprocess.run(["objcopy", "--add-section", f".note.cuda.fwd_compatibility={raw}", str(lib)],
                       check=True, capture_output=True)
    return lib


def libcuda(report):
    return next(x for x in report.libraries if x.soname == "libcuda.so.1" and x.elfclass == 64)


NEEDS_12_4 = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}


def test_forward_compat_bridges_the_gap(host, image):
    """No note: NVIDIA's majors rule (550 > 535): the hook puts the compat dir first, ldcheck agrees."""
    compat_lib(image, "550.54.15")
    r = check(host, image, NEEDS_12_4)
    f = only(r, "cuda-needs-compat")
    assert f.severity == "warning" and "/usr/local/cuda/compat/libcuda.so.550.54.15 (driver 550)" in f.what
    assert not errors(r) and "compat-not-used" not in codes(r)
    # the container's libcuda.so.1 is the compat one, found through the cache the hook writes
    res = libcuda(r)
    assert (res.outcome, res.path, res.how) == ("image", f"{COMPAT_DIR}/libcuda.so.1", "ld.so.cache")
    used = only(r, "compat-libcuda-used")
    assert "driver 550 on a 535 host" in used.what and 'cuda-compat = "disabled"' in used.fix


def test_cuda_compat_disabled_leaves_the_gap(host, image):
    compat_lib(image, "550.54.15")
    r = check(host, image, NEEDS_12_4, cuda_compat="disabled")
    f = only(r, "cuda-version-mismatch")
    assert "cannot bridge it" in f.why and "cuda-compat = 'disabled'" in f.why
    assert "cuda-needs-compat" not in codes(r)
    assert "cuda-compat = 'disabled'" in only(r, "compat-not-used").what
    assert libcuda(r).outcome == "host"


def test_note_without_the_host_branch_is_not_used(host, image):
    """A newer major whose note lists other branches: NVIDIA's rule says no, so the hook and ldcheck do."""
    compat_lib(image, "550.54.15", drivers=(525, 545))
    r = check(host, image, NEEDS_12_4)
    assert "cuda-needs-compat" not in codes(r)
    f = only(r, "cuda-version-mismatch")
    assert "supports driver branches 525, 545, not the host's 535" in f.why
    assert "supports driver branches 525, 545, not the host's 535" in only(r, "compat-not-used").what
    assert libcuda(r).outcome == "host" and "compat-libcuda-used" not in codes(r)


def test_note_without_the_host_branch_on_ld_library_path_shadows(host, image):
    """On LD_LIBRARY_PATH the loader takes it anyway: the same rule makes that an error."""
    compat_lib(image, "550.54.15", drivers=(525, 545))
    f = only(check(host, image, {"LD_LIBRARY_PATH": COMPAT_DIR}), "compat-shadows-driver")
    assert "not the host's 535" in f.why and f.severity == "error"


def test_note_with_the_host_branch_compares_full_versions(host, image):
    """With the note, a newer minor of the host's own branch is used; without it, majors decide."""
    compat_lib(image, "535.300.01", drivers=(535, 550))
    r = check(host, image, NEEDS_12_4)
    assert "libcuda.so.535.300.01 (driver 535) bridges the gap" in only(r, "cuda-needs-compat").what
    assert libcuda(r).path == f"{COMPAT_DIR}/libcuda.so.1" and not errors(r)


def test_no_note_same_major_is_not_used(host, image):
    compat_lib(image, "535.300.01")
    r = check(host, image, NEEDS_12_4)
    assert "not newer than the host driver" in only(r, "compat-not-used").what
    assert "cuda-needs-compat" not in codes(r) and libcuda(r).outcome == "host"


@pytest.mark.parametrize("version,drivers,changes", [
    ("550.54.15", None, {}), ("535.300.01", None, {}), ("470.57.02", None, {}),
    ("550.54.15", (535,), {}), ("550.54.15", (550,), {}), ("535.104.05", (535,), {}),
    ("550.54.15", None, {"cuda_compat": "disabled"}),
])
def test_ldcheck_agrees_with_the_hooks_decision(host, tmp_path, version, drivers, changes):
    """`bridges the gap` and the compat libcuda in the cache exactly when plan.cuda_compat (the hook) says so."""
    from pyxis_hook.plan.container import container_facts
    from pyxis_hook.plan.build import cuda_compat
    from pyxis_hook.record import replace

    image = make_rootfs(tmp_path / "img", gputest=False)
    compat_lib(image, version, drivers)
    cfg = replace(host[0], **changes)
    use, note = cuda_compat(cfg, ("utility", "compute"), container_facts(str(image)), VERSION)
    r = check(host, image, NEEDS_12_4, **changes)
    assert ("cuda-needs-compat" in codes(r)) is use
    assert ("compat-not-used" in codes(r)) is not use
    assert (libcuda(r).path == f"{COMPAT_DIR}/libcuda.so.1") is use
    if not use:
        assert note.removeprefix("cuda-compat: ") in only(r, "cuda-version-mismatch").why
    # compute not asked: the hook leaves the compat dir out whatever its version
    assert "cuda-needs-compat" not in codes(check(host, image, NEEDS_12_4, caps="utility", **changes))


def test_unparsable_requirement(host, image):
    f = only(check(host, image, {"NVIDIA_REQUIRE_CUDA": "cuda>>12"}), "bad-requirement")
    assert "NVIDIA_REQUIRE_CUDA" in f.what


# --------------------------------------------------------------------- the image's loader setup


def test_stale_cache_entry(host, image):
    lib = put_lib(image, "opt/gone", "libgone.so.1")
    (image / "etc/ld.so.conf.d/gone.conf").write_text("/opt/gone\n")
    subprocess.run(["ldconfig", "-r", str(image)], check=True)
    lib.unlink()
    f = only(check(host, image), "stale-cache-entry")
    assert f.what == "/etc/ld.so.cache lists libgone.so.1 -> /opt/gone/libgone.so.1, which does not exist"


def test_corrupt_and_missing_cache(host, image):
    (image / "etc/ld.so.cache").write_bytes(b"garbage, not a cache")
    f = only(check(host, image), "corrupt-ld-so-cache")
    assert f.what.startswith("/etc/ld.so.cache: ")
    (image / "etc/ld.so.cache").unlink()
    r = check(host, image)
    only(r, "no-ld-so-cache")
    assert all(x.outcome == "host" for x in r.libraries)  # the hook's entries alone still find them


def test_include_of_a_missing_file_and_missing_ld_so_conf(host, image):
    (image / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\ninclude /etc/cuda.conf\n")
    (image / "etc/ld.so.conf.d/libc.conf").write_text("/usr/local/lib\n")
    f = only(check(host, image), "include-matches-nothing")
    assert f.severity == "warning" and f.what == "/etc/ld.so.conf:2: include /etc/cuda.conf matches nothing"
    (image / "etc/ld.so.conf").unlink()
    only(check(host, image), "no-ld-so-conf")


def test_refused_and_unreadable_ld_so_conf(host, image, no_hang):
    """What the hook refuses (a FIFO, an include loop) is an error; a looping link it falls back on, a warning."""
    conf = image / "etc/ld.so.conf"
    conf.unlink()
    os.mkfifo(conf)
    f = only(check(host, image), "ld-so-conf-refused")
    assert f.severity == "error" and f.what == f"/etc/ld.so.conf (in {image}): a FIFO, not a configuration file"
    conf.unlink()
    conf.write_text("include /etc/ld.so.conf.d/*.conf\n")
    (image / "etc/ld.so.conf.d/again.conf").write_text("include ../ld.so.conf\n")
    f = only(check(host, image), "ld-so-conf-refused")
    assert "includes itself" in f.what
    (image / "etc/ld.so.conf.d/again.conf").unlink()
    (image / "etc/ld.so.conf.d/loop.conf").symlink_to("loop.conf")
    f = only(check(host, image), "ld-so-conf-unreadable")
    assert f.severity == "warning" and "/etc/ld.so.conf.d/loop.conf" in f.what
    assert not [x for x in check(host, image).findings if x.code == "ld-so-conf-refused"]


def test_ldconfig_wrapper_and_missing_ldconfig(host, image):
    ldc = image / "sbin/ldconfig"
    ldc.unlink()
    ldc.write_text('#!/bin/sh\nexec /sbin/ldconfig.real "$@"\n')
    f = only(check(host, image), "ldconfig-wrapper")
    assert f.severity == "info"  # the hook uses the host's ldconfig
    f = only(check(host, image, ldconfig="/sbin/ldconfig"), "ldconfig-wrapper")
    assert f.severity == "error" and f.what == "/sbin/ldconfig is a shell script"
    shutil.copy2("/sbin/ldconfig", image / "sbin/ldconfig.real")
    assert only(check(host, image, ldconfig="/sbin/ldconfig"), "ldconfig-wrapper").severity == "info"
    ldc.unlink()
    f = only(check(host, image, ldconfig="/sbin/ldconfig"), "ldconfig-missing")
    assert f.severity == "error" and f.what == "/sbin/ldconfig is missing in the image"


def test_no_gpu_requested(host, image):
    r = check(host, image, source="bundle")
    assert "no-gpu-requested" not in codes(r)
    cfg, inv, _ = host
    r = ldcheck.check_image(str(image), {}, inv, cfg, source="bundle")
    assert only(r, "no-gpu-requested").what == "NVIDIA_VISIBLE_DEVICES is unset in the container's environment"


# --------------------------------------------------------------------- command line and JSON


def test_cli_bundle_json_validates_and_exit_codes(host, image, tmp_path, capsys):
    _, _, conf = host
    schema = load_schema("ldcheck.schema.json")
    make_bundle(tmp_path / "b", image, env=("NVIDIA_VISIBLE_DEVICES=all",))
    assert cli.main(["--config", str(conf), "ldcheck", "--bundle", str(tmp_path / "b"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, schema)
    assert doc["ok"] and doc["source"] == "bundle"
    put_lib(image, "usr/local/cuda/lib64/stubs", "libcuda.so.1")
    make_bundle(tmp_path / "b", image, env=("NVIDIA_VISIBLE_DEVICES=all",
                                            "LD_LIBRARY_PATH=/usr/local/cuda/lib64/stubs"))
    assert cli.main(["--config", str(conf), "ldcheck", "--bundle", str(tmp_path / "b"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    jsonschema.validate(doc, schema)
    assert not doc["ok"] and "stub-shadows-driver" in {f["code"] for f in doc["findings"]}
    assert cli.main(["--config", str(conf), "ldcheck", str(image),
                     "--env", "LD_LIBRARY_PATH=/usr/local/cuda/lib64/stubs"]) == 1
    out = capsys.readouterr().out
    assert "✗ [stub-shadows-driver] libcuda.so.1 resolves to the CUDA toolkit stub" in out
    assert "    fix: remove /usr/local/cuda/lib64/stubs from LD_LIBRARY_PATH" in out


def test_cli_usage_errors(host, image, capsys):
    _, _, conf = host
    assert cli.main(["--config", str(conf), "ldcheck"]) == 2
    assert "give exactly one of ROOTFS, --bundle DIR, --pid PID" in capsys.readouterr().err
    assert cli.main(["--config", str(conf), "ldcheck", str(image), "--env", "NOEQUALS"]) == 2
    assert "--env 'NOEQUALS'" in capsys.readouterr().err


# --------------------------------------------------------------------- oracle: the image's own ld.so


def _inject_copy(host, image: Path) -> None:
    """What the hook does, by copying: the versioned files, their links, then the image's cache."""
    _, inv, _ = host
    for f in inv.select(("compute", "utility"), kinds=("lib",)):
        dest = image / LIBDIR / f.name
        shutil.copy2(f.host_path, dest)
        for link, target in f.links:
            p = image / LIBDIR / link
            if p.is_symlink() or p.exists():
                p.unlink()
            p.symlink_to(target)
    subprocess.run(["ldconfig", "-r", str(image)], check=True)


def _loaded_by_ld_so(image: Path, env: dict[str, str]) -> tuple[str, str]:
    """(path of libcuda.so.1 ld.so loaded or "", gputest's output) from LD_DEBUG=libs in a chroot."""
    out = subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", str(image), "/usr/bin/gputest"], capture_output=True, text=True,
                         env={"LD_DEBUG": "libs", "PATH": "/usr/bin:/bin", **env}, timeout=30)
    loaded = ""
    for line in out.stderr.splitlines():
        if "calling init:" in line and "libcuda" in line:
            loaded = line.split("calling init:")[1].strip()
    return loaded, out.stdout


# --------------------------------------------------------------------- the real driver


@pytest.mark.realdriver
@pytest.mark.slow
def test_real_driver_glx_needs_libx11(tmp_path):
    from fixtures.realdriver import require_driver_root

    drv = require_driver_root("535", "debian")
    cfg = Config(driver_root=str(drv), proc_root=str(tmp_path / "noproc"), dev_root=str(tmp_path),
                 snapshot_dir=str(tmp_path / "snap"))
    inv = discover(cfg, strict=False)
    image = make_rootfs(tmp_path / "img", gputest=False)
    r = ldcheck.check_image(str(image), {"NVIDIA_VISIBLE_DEVICES": "all"}, inv, cfg, capabilities="graphics,compute,utility")
    libx11 = [f for f in r.findings if f.code == "missing-dependency" and f.what.startswith("libX11.so.6 (64-bit)")]
    assert len(libx11) == 1 and "libGLX_nvidia.so.0" in libx11[0].what
    cuda = next(x for x in r.libraries if x.soname == "libcuda.so.1")
    assert cuda.outcome == "host" and cuda.injected == f"/{LIBDIR}/libcuda.so.{inv.driver_version}"
    # a bundled libnvidia-ml of the real package on LD_LIBRARY_PATH shadows the injected one
    (image / "opt/nv").mkdir(parents=True)
    nvml = next(f for f in inv.files if f.soname == "libnvidia-ml.so.1" and f.kind == "lib")
    shutil.copy2(nvml.host_path, image / "opt/nv/libnvidia-ml.so.1")
    r = ldcheck.check_image(str(image), {"NVIDIA_VISIBLE_DEVICES": "all", "LD_LIBRARY_PATH": "/opt/nv"}, inv, cfg)
    assert only(r, "image-copy-shadows-driver").what.startswith(
        "libnvidia-ml.so.1 resolves to the image's own /opt/nv/libnvidia-ml.so.1 via LD_LIBRARY_PATH")


# --------------------------------------------------------------------- findings


@settings(max_examples=50)
@given(st.lists(st.sampled_from(SEVERITIES), max_size=6), st.text(max_size=30))
def test_finding_lines_and_worst(sevs, text):
    fs = [Finding(s, "x-y", "w" + text, text, text) for s in sevs]
    assert worst(fs) == (max(sevs, key=SEVERITIES.index) if sevs else "ok")
    for f in fs:
        assert "\n" not in f.what + f.why + f.fix
        assert format_finding(f).count("\n") <= 2


def test_finding_rejects_unknown_severity():
    with pytest.raises(ValueError):
        Finding("fatal", "x", "y")


# --------------------------------------------------------------------- capabilities as the hook decides them


def test_legacy_cuda_version_image_gets_every_capability(host, image):
    """A CUDA_VERSION image without NVIDIA_DRIVER_CAPABILITIES: the hook injects all supported capabilities."""
    cfg, _, _ = host
    r = check(host, image, {"CUDA_VERSION": "12.0.1", "NVIDIA_REQUIRE_CUDA": ""})
    assert set(r.capabilities) == set(cfg.supported_capabilities)
    assert set(check(host, image).capabilities) == set(cfg.default_capabilities)


def test_unknown_capability_is_the_hooks_error(host, image):
    f = only(check(host, image, {"NVIDIA_DRIVER_CAPABILITIES": "compute,warp"}), "bad-capabilities")
    assert f.severity == "error" and "'compute,warp'" in f.what
    r = check(host, image, caps="utility,nope")
    assert only(r, "bad-capabilities").severity == "error" and r.capabilities == () and r.libraries == ()


# --------------------------------------------------------------------- the machine's loader


def test_loader_and_cache_flags_follow_the_machine():
    accepted = cachelookup.accepted_flags
    assert accepted(64, "x86_64") == (0x0303,) and accepted(32, "x86_64") == (1, 3)
    assert accepted(64, "aarch64") == (0x0A03,) and accepted(32, "aarch64") == (3, 0x0903)
    assert ldmodel.loader_of(64, "aarch64") == (183, "/lib/ld-linux-aarch64.so.1", "aarch64")
    assert ldmodel.loader_of(64, "x86_64") == (62, "/lib64/ld-linux-x86-64.so.2", "x86_64")
    assert ldmodel.loader_of(32, "x86_64") == (3, "/lib/ld-linux.so.2", "i686")
    assert ldmodel._fallback_dirs(64, "aarch64")[:2] == ("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")


def test_injected_32_bit_entries_get_ldconfigs_flags():
    """As ldmerge writes them: a 32-bit library without DT_NEEDED is plain ELF (1), with libc.so.6 libc6 (3)."""
    libs = (ldmodel.InjectedFile("libplain.so.1", "/usr/lib/i386-linux-gnu/libplain.so.1.0", (), "/x", 32, "compute"),
            ldmodel.InjectedFile("libc6ish.so.1", "/usr/lib/i386-linux-gnu/libc6ish.so.1.0", (), "/y", 32, "compute",
                                ("libc.so.6",)),
            ldmodel.InjectedFile("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1.0", (), "/z", 64, "compute"))
    flags = {e.key: e.flags for e in ldmodel.cache_after_injection(None, libs).entries}
    assert flags["libplain.so.1"] == 0x0001 and flags["libc6ish.so.1"] == 0x0003
    assert flags["libcuda.so.1"] == cachelookup.accepted_flags(64)[0]


def test_cudart_versions_parse_as_cudaversion_does(tmp_path):
    root = tmp_path / "r"
    d = root / "usr/local/cuda/lib64"
    d.mkdir(parents=True)
    for n in ("libcudart.so.12", "libcudart.so.12.4", "libcudart.so.11.8.89", "libcudart.so.x.y"):
        (d / n).write_bytes(b"")
    facts = cudacheck.cuda_facts(str(root), ())
    assert dict(facts.cudart) == {"/usr/local/cuda/lib64/libcudart.so.11.8.89": 11080,
                                  "/usr/local/cuda/lib64/libcudart.so.12.4": 12040}
