"""`pyxis-hook cdi generate` and the spec's createContainer hooks.

The spec is validated against the upstream CDI JSON schema, compared with
`build_plan` (the same nodes and files the prestart hook injects), and its
hooks are run for real over a rootfs: symlinks appear, glibc's ldconfig puts
the injected libraries in the image's ld.so.cache.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import jsonschema
import pytest
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from e2e.conftest import DRIVER_VERSION, fresh_rootfs, make_host
from fixtures.cli import run_cli, write_conf
from fixtures.container import make_bundle
from fixtures.oci_state import state_json
from pyxis_hook.engines import cdi, cdihook
from pyxis_hook.spec.config import load_config

REPO = Path(__file__).resolve().parents[3]
#: the CDI project's own JSON schema, unmodified (tests/fixtures/upstream-schemas/README.md: its commit)
SCHEMA_DIR = REPO / "tests" / "fixtures" / "upstream-schemas" / "cdi"


def _validator():
    schema = json.loads((SCHEMA_DIR / "schema.json").read_text())
    defs = json.loads((SCHEMA_DIR / "defs.json").read_text())
    registry = Registry().with_resource("defs.json", Resource.from_contents(defs, default_specification=DRAFT7))
    return jsonschema.Draft7Validator(schema, registry=registry)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    return make_host(tmp_path_factory.mktemp("cdihost"))


@pytest.fixture(scope="module")
def spec(host):
    r = run_cli("cdi", "generate", conf=host.conf)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_spec_validates_against_upstream_schema(spec):
    errors = sorted(_validator().iter_errors(spec), key=str)
    assert not errors, [e.message for e in errors]
    assert spec["cdiVersion"] == cdi.CDI_VERSION and spec["kind"] == "nvidia.com/gpu"


def test_schema_rejects_broken_spec(spec):
    broken = json.loads(json.dumps(spec))
    broken["devices"][0]["containerEdits"]["deviceNodes"][0].pop("path")
    assert list(_validator().iter_errors(broken))


def test_a_device_per_index_uuid_and_all(host, spec):
    names = [d["name"] for d in spec["devices"]]
    gpus = host.tree.gpus
    assert names == ["0", "1", "2", "3"] + [g.uuid for g in gpus] + ["all"]
    by_name = {d["name"]: d["containerEdits"] for d in spec["devices"]}
    assert [n["path"] for n in by_name["2"]["deviceNodes"]] == ["/dev/nvidia2"]
    assert by_name[gpus[3].uuid]["deviceNodes"][0]["minor"] == 3
    assert [n["path"] for n in by_name["all"]["deviceNodes"]] == [f"/dev/nvidia{i}" for i in range(4)]
    node = by_name["1"]["deviceNodes"][0]
    assert node["hostPath"] == os.path.join(host.dev_root, "dev/nvidia1")
    assert os.stat(node["hostPath"]).st_rdev == os.makedev(195, 1)


def test_common_edits_are_the_plan_for_default_capabilities(host, spec):
    """Same mounts, nodes and links as `build_plan` for NVIDIA_VISIBLE_DEVICES=none."""
    from pyxis_hook.host import gpuscan, inventory
    from pyxis_hook.host import artifact
    from pyxis_hook.host.gpuscan import read_proc_driver_files
    from pyxis_hook.plan.build import build_plan
    from pyxis_hook.spec.request import resolve_request

    config = load_config(str(host.conf))
    inv = artifact.load_or_build(config, strict=False)
    hg = gpuscan.discover_gpus(config.proc_root, config.dev_root)
    inv = inventory.with_host(inv, hg)
    req = resolve_request({"NVIDIA_VISIBLE_DEVICES": "none",
                           "NVIDIA_DRIVER_CAPABILITIES": ",".join(config.default_capabilities)}, {}, hg, config)
    plan = build_plan(req, inv, cdi.cdi_facts(), config, proc_files=read_proc_driver_files(config.proc_root))
    common = spec["containerEdits"]
    assert [(m["hostPath"], m["containerPath"]) for m in common["mounts"]] == \
        [(m.host_path, m.container_path) for m in plan.mounts]
    assert all("ro" in m["options"] for m in common["mounts"] if "libcuda" in m["hostPath"])
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so." + DRIVER_VERSION in [m["containerPath"] for m in common["mounts"]]
    assert [n["path"] for n in common["deviceNodes"]] == [d.path for d in plan.devices]
    assert "/dev/nvidiactl" in [n["path"] for n in common["deviceNodes"]]
    assert common["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    hooks = {h["args"][6]: h for h in common["hooks"]}
    assert set(hooks) == {"create-symlinks", "update-ldcache", "proc-driver"}
    links = hooks["create-symlinks"]["args"][7:]
    assert links[::2] == ["--link"] * len(plan.symlinks)
    assert links[1::2] == [f"{s.container_path}::{s.target}" for s in plan.symlinks]
    for h in common["hooks"]:
        assert h["hookName"] == "createContainer"
        assert h["path"] == h["args"][0] and os.path.isabs(h["path"])  # absolute argv[0]: sys.prefix right
        assert h["args"][1:3] == ["-I", "-S"] and h["args"][3].endswith("pyxis_hook/__main__.py")
        assert h["args"][4:6] == ["cdi", "hook"]
        assert f"PYXIS_HOOK_CONFIG={host.conf}" in h["env"]


def test_yaml_output_is_the_same_document(host, spec, tmp_path):
    out = tmp_path / "gpu.yaml"
    r = run_cli("cdi", "generate", "--output", str(out), conf=host.conf)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.startswith("---\n") and not text.lstrip("-\n").startswith("{")
    import yaml  # an independent YAML parser as the oracle (test extras)
    assert yaml.safe_load(text) == spec


def test_yaml_emitter_quotes_what_yaml_would_retype():
    import yaml
    doc = {"yes": ["no", "on", "1", "-1", "0x10", "null", "~", "a: b", "#c", "", "x\ny", "é"],
           "k": {"": [], "on": {}}, "n": None, "t": False, "i": 7}
    assert yaml.safe_load(cdi.to_yaml(doc)) == doc


def test_custom_kind_and_bad_kind(host, tmp_path):
    conf = tmp_path / "k.conf"
    conf.write_text(host.conf.read_text() + 'cdi-kind = "example.org/accel"\n')
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["kind"] == "example.org/accel"
    conf.write_text(host.conf.read_text() + 'cdi-kind = "gpu"\n')
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode != 0
    assert r.stderr.count("\n") == 1 and "'cdi-kind'" in r.stderr and "Traceback" not in r.stderr
    with pytest.raises(Exception, match="cdi-kind 'x/'"):
        cdi.check_kind("x/")


def test_no_gpu_is_one_line_error(tmp_path):
    host = make_host(tmp_path, kernel_module=False)
    r = run_cli("cdi", "generate", conf=host.conf)
    # no kernel module: the control node is missing, which is what the first plan says
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("pyxis-hook: error: device node ") and "nvidiactl: missing" in r.stderr


def test_hook_hidden_from_help():
    r = run_cli("cdi", "--help")
    assert "generate" in r.stdout and "hook" not in r.stdout.split("options")[0].replace("pyxis-hook", "")


def _run_spec_hooks(spec: dict, bundle: Path, rootfs: Path, *, after: str = "") -> str:
    """Apply the spec-wide edits the way runc does: mounts (copied for later looks, and bound read-only over
    the copies inside a stand-in container init, `standin.runc_init_argv`), then each createContainer hook
    run by that init, state on stdin.  The proc-driver view is left out.  Returns what `after` printed."""
    from fixtures.standin import runc_init_argv

    common = spec["containerEdits"]
    mounts = []
    for m in common["mounts"]:
        dest = rootfs / m["containerPath"].lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if os.path.isfile(m["hostPath"]):
            dest.write_bytes(Path(m["hostPath"]).read_bytes())
            mounts.append((m["hostPath"], m["containerPath"]))
    hooks = [h for h in common["hooks"] if h["args"][6] != "proc-driver"]
    state = bundle.parent / f"{bundle.name}.state.json"
    state.write_text(state_json(bundle, id="cdi-test"))
    env = dict(e.split("=", 1) for e in hooks[0]["env"])
    r = subprocess.run(runc_init_argv(rootfs, [h["args"] for h in hooks], state, mounts=mounts, after=after),
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, ([h["args"][6] for h in hooks], r.stderr)
    return r.stdout


def test_no_hooks_spec_binds_links_instead(host, spec):
    r = run_cli("cdi", "generate", "--no-hooks", conf=host.conf)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert not list(_validator().iter_errors(doc))
    assert "hooks" not in json.dumps(doc)
    mounts = {m["containerPath"]: m["hostPath"] for m in doc["containerEdits"]["mounts"]}
    lib = "/usr/lib/x86_64-linux-gnu/"
    real = mounts[lib + "libcuda.so." + DRIVER_VERSION]
    assert mounts[lib + "libcuda.so.1"] == real  # the file itself under its SONAME
    # every link the hooked spec would create is there as a bind of the file it ends at
    hooks = {h["args"][6]: h for h in spec["containerEdits"]["hooks"]}
    linked = [a.split("::")[0] for a in hooks["create-symlinks"]["args"][8::2]]
    assert set(linked) <= set(mounts)
    assert doc["devices"] == [{"name": d["name"], "containerEdits": {k: v for k, v in d["containerEdits"].items()
                                                                      if k != "hooks"}}
                              for d in spec["devices"]]


def test_docs_name_every_hook_step_and_the_version():
    text = (REPO / "docs/cdi.md").read_text()
    for step in cdihook.HOOK_STEPS:
        assert f"cdi hook {step}" in text
    assert f"CDI `{cdi.CDI_VERSION}`" in text
    assert f"{cdi.HOST_DRIVER_VERSION_FLAG}=" in text and "cdi.md#cuda-forward-compatibility" in \
        (REPO / "docs/configuration.md").read_text()
    for page in ("podman.md", "cri-o.md", "apptainer.md"):
        assert "pyxis-hook cdi generate" in (REPO / "docs" / page).read_text()


def _conf_for(tree, driver, tmp_path) -> Path:
    return write_conf(tmp_path / "t.conf", driver_root=driver, proc_root=tree.proc_root, dev_root=tree.dev_root,
                      snapshot_dir=tmp_path / "snap")


def test_proc_driver_hook_plans_the_gpus_the_runtime_was_given(host, tmp_path):
    """The hook reads the GPUs from config.json linux.devices (where CDI put them)."""
    from pyxis_hook.record import replace as record_replace

    from pyxis_hook.spec import oci

    bundle = tmp_path / "b"
    make_bundle(bundle)
    doc = json.loads((bundle / "config.json").read_text())
    doc["linux"]["devices"] = [{"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3},
                               {"path": "/dev/nvidiactl", "type": "c", "major": 195, "minor": 255},
                               {"path": "/dev/nvidia1", "type": "c", "major": 195, "minor": 1}]
    (bundle / "config.json").write_text(json.dumps(doc))
    config = load_config(str(host.conf))
    plan = cdihook.hook_plan("proc-driver", oci.load_bundle(str(bundle)), config)
    gpus = host.tree.gpus
    assert [d.lower() for d in plan.proc_driver.gpu_dirs] == [gpus[1].bus_id.lower(), gpus[3].bus_id.lower()]
    params = dict(plan.proc_driver.files)["params"]
    assert "ModifyDeviceFiles: 0" in params
    # without the kernel module there is nothing to show, and nothing is planned
    config = record_replace(config, proc_root=str(tmp_path / "no-proc"))
    assert cdihook.hook_plan("proc-driver", oci.load_bundle(str(bundle)), config).proc_driver is None


def test_cdi_hooks_get_the_hooks_d_environment(tmp_path, monkeypatch):
    """CDI hooks, hooks.d and the enroot shim share `hookd.hook_env`: PATH and the absolute config."""
    from pyxis_hook.record import replace

    from pyxis_hook.spec.config import Config
    from pyxis_hook.engines.hookd import HOOK_ENV_PATH, hook_env

    monkeypatch.chdir(tmp_path)
    cfg = replace(Config(), source="pyxis.conf")
    _, _, env = cdi.hook_command(cfg, "/usr/bin/python3")
    assert env == hook_env(cfg) == [HOOK_ENV_PATH, f"PYXIS_HOOK_CONFIG={tmp_path}/pyxis.conf"]
    assert not hasattr(cdi, "HOOK_ENV_PATH")


def test_update_ldcache_hook_refuses_an_image_ldconfig(host, tmp_path):
    """`ldconfig` without '@' names a binary in the image: the CDI hook refuses, as the planner does."""
    from pyxis_hook.record import replace as _replace

    from pyxis_hook.engines.cdihook import hook_plan
    from pyxis_hook.spec.config import load_config
    from pyxis_hook.errors import UsageError
    from pyxis_hook.spec.oci import load_bundle

    from fixtures.container import make_bundle as _mk

    bundle = load_bundle(str(_mk(tmp_path / "b")))
    cfg = _replace(load_config(str(host.conf)), ldconfig="/sbin/ldconfig")
    with pytest.raises(UsageError, match="names a binary in the image"):
        hook_plan("update-ldcache", bundle, cfg, folders=("/usr/lib/x86_64-linux-gnu",))
    ok = hook_plan("update-ldcache", bundle, _replace(cfg, ldconfig="@/sbin/ldconfig"),
                   folders=("/usr/lib/x86_64-linux-gnu",))
    assert ok.ldcache.mode == "ldconfig" and ok.ldcache.ldconfig.startswith("/sbin/ldconfig")


# ---------------------------------------------------------------- CUDA forward compat through the CDI hook

COMPAT = "usr/local/cuda/compat"


def _ldcache_hook(spec) -> dict:
    return next(h for h in spec["containerEdits"]["hooks"] if h["args"][6] == "update-ldcache")


def _compat_image(bundle_dir: Path, name: str = "libcuda.so.999.10.01", *, cuda: int = 12080) -> Path:
    """A rootfs whose /usr/local/cuda/compat holds a fake forward-compat libcuda (SONAME libcuda.so.1)."""
    from fixtures.fakedriver import CUDA_C, _lib

    rootfs = fresh_rootfs(bundle_dir / "rootfs")
    make_bundle(bundle_dir, env=(), args=("/bin/true",))
    d = rootfs / COMPAT
    d.mkdir(parents=True)
    (d / name).write_bytes(_lib(CUDA_C % {"cuda": cuda}, "libcuda.so.1", name).read_bytes())
    os.symlink(name, d / "libcuda.so.1")
    return rootfs


def test_spec_records_the_host_driver_version_for_compat(spec):
    """NVIDIA's `--host-driver-version=` on our ldcache hook, first after the step; still a valid spec."""
    args = _ldcache_hook(spec)["args"]
    assert args[7] == f"--host-driver-version={DRIVER_VERSION}"
    assert args.count(args[7]) == 1 and args[8] == "--folder"
    assert not list(_validator().iter_errors(spec))
    # only the spec-wide ldcache hook carries it: no device entry has hooks of its own
    assert not any("hooks" in d["containerEdits"] for d in spec["devices"])


@pytest.mark.parametrize("extra", ['cuda-compat = "disabled"\n', 'default-capabilities = ["utility"]\n'])
def test_no_version_when_compat_cannot_apply(host, tmp_path, extra):
    """cuda-compat = "disabled", or a spec planned without compute: the hook is never asked for compat."""
    conf = tmp_path / "c.conf"
    conf.write_text(host.conf.read_text() + extra)
    r = run_cli("cdi", "generate", conf=conf)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert not list(_validator().iter_errors(doc))
    hooks = doc["containerEdits"].get("hooks", [])
    assert hooks and not any(a.startswith("--host-driver-version") for h in hooks for a in h["args"])


def test_compat_driver_version_keeps_only_dotted_numbers():
    from pyxis_hook.spec.config import Config

    cfg = Config()
    assert cdi.compat_driver_version(cfg, "535.104.05") == "535.104.05"
    for bad in (None, "", "535.*", "5" * 20, "535.104.05 ", "５３５.1", "1.2.3.4.5"):
        assert cdi.compat_driver_version(cfg, bad) == "", bad
    from pyxis_hook.record import replace as _replace

    assert cdi.compat_driver_version(_replace(cfg, cuda_compat="disabled"), "535.104.05") == ""


@pytest.mark.parametrize("mode", ["merge", "ldconfig"])
def test_hook_plan_puts_a_newer_compat_dir_first(host, tmp_path, mode):
    """The prestart hook's decision on the image's facts: a newer compat libcuda leads the cache update."""
    from pyxis_hook.spec import oci
    from pyxis_hook.plan.build import COMPAT_DIR
    from pyxis_hook.record import replace as _replace

    _compat_image(tmp_path / "b")
    bundle = oci.load_bundle(str(tmp_path / "b"))
    cfg = _replace(load_config(str(host.conf)), ldcache=mode)
    lib = "/usr/lib/x86_64-linux-gnu"
    row = f"{lib}/libcuda.so.{DRIVER_VERSION}::libcuda.so.1::0x0303"
    plan = cdihook.hook_plan("update-ldcache", bundle, cfg, folders=(lib,), libs=(row,),
                         host_driver_version=DRIVER_VERSION)
    up = plan.ldcache
    assert up.mode == mode and up.first_dirs == (COMPAT_DIR,) and up.lib_dirs == (COMPAT_DIR, lib)
    if mode == "merge":
        assert (COMPAT_DIR, "libcuda.so.999.10.01", "libcuda.so.1", 0x303) in up.libs
        assert (lib, f"libcuda.so.{DRIVER_VERSION}", "libcuda.so.1", 0x303) in up.libs
    assert len(plan.notes) == 1 and plan.notes[0].startswith(f"cuda-compat: {COMPAT_DIR} comes first")
    # the same image without the version (an old spec, or --no-hooks never runs it): as before
    plain = cdihook.hook_plan("update-ldcache", bundle, cfg, folders=(lib,), libs=(row,))
    assert plain.ldcache.first_dirs == () and plain.ldcache.lib_dirs == (lib,) and plain.notes == ()
    # cuda-compat = "disabled" in the pyxis.conf the hook reads wins over the spec's version
    off = cdihook.hook_plan("update-ldcache", bundle, _replace(cfg, cuda_compat="disabled"), folders=(lib,),
                        libs=(row,), host_driver_version=DRIVER_VERSION)
    assert off.ldcache.first_dirs == () and "cuda-compat = 'disabled'" in off.notes[0]


@pytest.mark.parametrize("name,version,why", [
    ("libcuda.so.470.57.02", DRIVER_VERSION, "not newer than the host driver"),  # older compat
    ("libcuda.so.999.10.01", "1000.1.1", "not newer than the host driver"),  # the host is newer
])
def test_hook_plan_leaves_an_older_compat_dir_out(host, tmp_path, name, version, why):
    from pyxis_hook.spec import oci

    _compat_image(tmp_path / "b", name)
    plan = cdihook.hook_plan("update-ldcache", oci.load_bundle(str(tmp_path / "b")), load_config(str(host.conf)),
                         folders=("/usr/lib/x86_64-linux-gnu",), host_driver_version=version)
    assert plan.ldcache.first_dirs == () and "/usr/local/cuda/compat" not in plan.ldcache.lib_dirs
    assert why in plan.notes[0]


def test_hook_refuses_a_bad_host_driver_version(host, tmp_path):
    from pyxis_hook.spec import oci
    from pyxis_hook.errors import UsageError

    _compat_image(tmp_path / "b")
    bundle = oci.load_bundle(str(tmp_path / "b"))
    for bad in ("535.*", "x", "9" * 5000, "535..1"):
        with pytest.raises(UsageError, match="--host-driver-version"):
            cdihook.hook_plan("update-ldcache", bundle, load_config(str(host.conf)),
                          folders=("/usr/lib/x86_64-linux-gnu",), host_driver_version=bad)
    r = run_cli("cdi", "hook", "update-ldcache", "--host-driver-version=535.*", "--folder", "/usr/lib",
                conf=host.conf, input=state_json(tmp_path / "b", id="cdi-test"))
    assert r.returncode != 0 and "--host-driver-version '535.*'" in r.stderr and "Traceback" not in r.stderr




def test_create_symlinks_plan_covers_an_images_file_with_the_end_of_our_link_chain(tmp_path):
    """link_edit on what the image holds: a regular file -> a bind (from inside the rootfs) of the file our
    links end at, never where the image's own links lead; a symlink -> our link; a directory -> skipped."""
    lib = tmp_path / "rootfs/usr/lib/x86_64-linux-gnu"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.1").write_text("another driver's libcuda\n")
    (lib / "libcuda.so").symlink_to("/etc/shadow")  # the image's link: replaced, never followed
    (lib / "libnvidia-ml.so.1").mkdir()
    d = "/usr/lib/x86_64-linux-gnu"
    links = tuple(cdihook.parse_link(x) for x in (f"{d}/libcuda.so.1::libcuda.so.535.1", f"{d}/libcuda.so::libcuda.so.1",
                                                   f"{d}/libnvidia-ml.so.1::libnvidia-ml.so.535.1"))
    plan = cdihook.link_plan("/b/rootfs", links, str(tmp_path / "rootfs"))
    assert [(m.host_path, m.container_path, m.in_rootfs, "ro" in m.options) for m in plan.mounts] == \
        [(f"{d}/libcuda.so.535.1", f"{d}/libcuda.so.1", True, True)]
    assert "the image's own regular file is covered" in plan.mounts[0].covers
    assert [(s.container_path, s.target) for s in plan.symlinks] == [(f"{d}/libcuda.so", "libcuda.so.1")]
    assert len(plan.notes) == 1 and plan.notes[0].startswith(f"warning: {d}/libnvidia-ml.so.1: a directory")
    # nothing of the image at any link path: the links as the spec names them
    (lib / "libcuda.so.1").unlink()
    assert cdihook.link_plan("/b/rootfs", links[:2], str(tmp_path / "rootfs")).symlinks == links[:2]
