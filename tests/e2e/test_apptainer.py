"""The hook with the REAL Apptainer (Debian unstable's), run from an unstable root (`fixtures.apptainer`).

- `apptainer oci run` with the hook registered as docs/apptainer.md says
  (`pyxis-hook hookd --stage createRuntime`, the `hook` object copied into
  config.json): the container loads the fixture host's real 535 libcuda
  (cuDriverGetVersion=12020, cuInit=100: no kernel module).  The same hook
  registered as `prestart` is never run by that engine.
- The CDI spec from `pyxis-hook cdi generate`, merged into a bundle's
  config.json as CDI engines merge it (env, device nodes, mounts, hooks), under
  `apptainer oci run`: its createContainer hooks run and the image's
  ld.so.cache gets the driver.
- `apptainer exec --nv`, for comparison: what its nvliblist.conf finds through
  the root's `ldconfig -p` and PATH, bound into /.singularity.d/libs.
- A SIF built with `apptainer build` from our e2e image, made a bundle by
  `apptainer oci mount`, started through the hook.
- An ordinary user (uid 2001, a passwd entry in the session's root): `apptainer
  oci run` is refused before any hook runs, `run`/`exec` have no `--oci`
  option, and `exec --nv` runs in the user's own user namespace (what such a
  user gets instead; docs/apptainer.md, "Ordinary users").

The fixture GPU host (fake /proc/driver/nvidia and /dev nodes, real driver
files) is bound into the root at its own paths, so pyxis.conf names it there too.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from e2e.conftest import fresh_rootfs, make_host
from fixtures.apptainer import VENV, exec_caps, oci_caps, require_session
from fixtures.container import make_bundle, merge_cdi
from fixtures.realdriver import driver_version, require_driver_root
from fixtures.standin import tree_state

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow, pytest.mark.realdriver]

PYXIS = f"{VENV}/bin/pyxis-hook"
PROBE = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; /usr/bin/gputest; "
         "ldconfig -p | grep -E 'libcuda.so.1 |libnvidia-ml.so.1 ' | sort")


@pytest.fixture(scope="module")
def session():
    s = require_session()
    yield s
    s.close()


def _real_host(base: Path, layout: str = "debian"):
    """The fixture GPU host with the real 535 files; its procfs reports the same driver version."""
    root = require_driver_root("535", layout)
    host = make_host(base, driver_root=root)
    version = driver_version("535")
    Path(host.proc_root, "driver/nvidia/version").write_text(
        f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Jan  1 00:00:00 UTC 2026\n")
    return host, root


def _bundle(base: Path, script: str, env: tuple[str, ...] = ()) -> Path:
    bundle = base / "bundle"
    fresh_rootfs(bundle / "rootfs")
    make_bundle(bundle, env=env, args=("/bin/sh", "-c", script))
    _edit(bundle, oci_caps)
    return bundle


def _edit(bundle: Path, change) -> dict:
    path = bundle / "config.json"
    config = change(json.loads(path.read_text()))
    path.write_text(json.dumps(config, indent=2))
    return config


def _registered(session, host, binds, stage: str) -> dict:
    """The hook object `pyxis-hook hookd --stage STAGE` prints in the root (what the docs tell users to copy)."""
    p = session.enter([PYXIS, "--config", str(host.conf), "hookd", "--stage", stage], binds)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["hook"]


def _oci_run(session, bundle: Path, binds, name: str):
    return session.enter(["apptainer", "oci", "run", "-b", str(bundle), name], binds)


def test_oci_run_with_the_documented_createruntime_registration(session, tmp_path):
    host, root = _real_host(tmp_path)
    binds = (tmp_path, root)
    bundle = _bundle(tmp_path, PROBE, ("NVIDIA_VISIBLE_DEVICES=1",))
    hook = _registered(session, host, binds, "createRuntime")
    assert hook["path"] == f"{VENV}/bin/python3" and hook["args"][1:3] == ["-I", "-S"]
    _edit(bundle, lambda c: {**c, "hooks": {"createRuntime": [hook]}})
    r = _oci_run(session, bundle, binds, f"pyxis-oci-{os.getpid()}")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"], r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout and "cuInit=100" in r.stdout and "nvmlInit_v2=9" in r.stdout
    assert re.search(r"\tlibcuda\.so\.1 \(libc6,x86-64\) => (/usr)?/lib/x86_64-linux-gnu/libcuda\.so\.1\n", r.stdout)
    log = (host.base / "hook.log").read_text()
    # the engine pivoted before the hook ran: the image was read and its cache merged through the pinned root
    assert "ld.so.cache: merged 7 entries (new format)" in log, log
    assert "/apptainer-oci/" in log  # the device cgroup the engine made for the container got the GPU's rules


def test_a_prestart_registration_is_never_run_by_the_oci_engine(session, tmp_path):
    host, root = _real_host(tmp_path)
    binds = (tmp_path, root)
    bundle = _bundle(tmp_path, PROBE, ("NVIDIA_VISIBLE_DEVICES=1",))
    hook = _registered(session, host, binds, "prestart")
    _edit(bundle, lambda c: {**c, "hooks": {"prestart": [hook]}})
    r = _oci_run(session, bundle, binds, f"pyxis-oci-pre-{os.getpid()}")
    assert r.returncode == 0, r.stderr
    assert "libcuda: libcuda.so.1: cannot open shared object file" in r.stdout, r.stdout
    assert "container" not in (host.base / "hook.log").read_text()  # `hookd` made the log; no start wrote to it


def test_the_cdi_spec_merged_into_a_bundle_runs_with_its_hooks(session, tmp_path):
    host, root = _real_host(tmp_path)
    binds = (tmp_path, root)
    spec_path = tmp_path / "pyxis-gpu.json"
    p = session.enter([PYXIS, "--config", str(host.conf), "cdi", "generate", "--output", str(spec_path)], binds)
    assert p.returncode == 0, p.stderr
    spec = json.loads(spec_path.read_text())
    bundle = _bundle(tmp_path, PROBE)
    config = _edit(bundle, lambda c: merge_cdi(c, spec, "1"))
    assert [h["args"][6] for h in config["hooks"]["createContainer"]] == ["create-symlinks", "update-ldcache",
                                                                          "proc-driver"]
    r = _oci_run(session, bundle, binds, f"pyxis-cdi-{os.getpid()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia1", "nvidiactl"], r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
    # the update-ldcache hook ran: the loader finds the driver through the image's cache, not a search path
    assert "\tlibcuda.so.1 (libc6,x86-64) => " in r.stdout and "\tlibnvidia-ml.so.1 (libc6,x86-64) => " in r.stdout
    log = (host.base / "hook.log").read_text()
    assert "ld.so.cache: merged" in log
    # the engine runs createContainer hooks in its own mount namespace, after the container pivoted: they pin
    # its root and work in its namespace, where /proc is the container's own procfs (and this machine has no
    # NVIDIA kernel module, so no /proc/driver/nvidia to put the view on)
    assert "/proc/driver/nvidia: not in the container's /proc" in log, log
    assert "root.path" not in log, log


def test_cdi_hooks_refuse_a_root_path_repointed_after_the_engine_read_it(session, tmp_path):
    """The engine runs the CDI hooks on the host, naming the bundle by its host path: a createRuntime hook
    standing in for the bundle's owner points root.path at a host directory; the hooks refuse, it is untouched."""
    host, root = _real_host(tmp_path)
    binds = (tmp_path, root)
    spec_path = tmp_path / "pyxis-gpu.json"
    p = session.enter([PYXIS, "--config", str(host.conf), "cdi", "generate", "--output", str(spec_path)], binds)
    assert p.returncode == 0, p.stderr
    canary = fresh_rootfs(tmp_path / "host-dir")
    before = tree_state(canary)
    bundle = _bundle(tmp_path, PROBE)
    flip = {"path": "/bin/sh", "args": ["sh", "-c", f"cd {bundle} && sed -i 's#\"path\": \"rootfs\"#\"path\": "
                                                     f"\"{canary}\"#' config.json"]}
    config = _edit(bundle, lambda c: merge_cdi(c, json.loads(spec_path.read_text()), "1"))
    _edit(bundle, lambda c: {**c, "hooks": {**config["hooks"], "createRuntime": [flip]}})
    r = _oci_run(session, bundle, binds, f"pyxis-cdiflip-{os.getpid()}")
    assert r.returncode != 0
    assert tree_state(canary) == before, "a CDI hook changed the host directory root.path was re-pointed at"
    log = (host.base / "hook.log").read_text()
    assert f"root.path {canary} is not the root directory of container process" in log, log


def _sif(session, tmp_path: Path, binds) -> Path:
    image = fresh_rootfs(tmp_path / "image")
    sif = tmp_path / "gputest.sif"
    p = session.enter(["apptainer", "build", str(sif), str(image)], binds)
    assert p.returncode == 0, p.stderr
    return sif


def test_exec_nv_binds_what_nvliblist_finds_and_nothing_else(session, tmp_path):
    """--nv looks libraries up in the host's `ldconfig -p` and binaries on PATH (nvliblist.conf), binds them
    into /.singularity.d/libs (on LD_LIBRARY_PATH of the image's environment) and /usr/bin; no device node
    the host lacks, no ld.so.cache, every capability's libraries at once."""
    _host, root = _real_host(tmp_path, "installer")
    binds = (tmp_path, root)
    sif = _sif(session, tmp_path, binds)
    script = (f"echo {root}/usr/lib/x86_64-linux-gnu > /etc/ld.so.conf.d/nvidia.conf && ldconfig && "
              f"PATH={root}/usr/bin:$PATH apptainer exec {' '.join(exec_caps())} --nv {sif} /bin/sh -c "
              "'echo LD=$LD_LIBRARY_PATH; ls /.singularity.d/libs | tr \"\\n\" \" \"; echo; "
              "echo nodes=$(ls /dev | grep nvidia); command -v nvidia-smi; /usr/bin/gputest; "
              "echo cached=$(ldconfig -p | grep -c nvidia)'")
    before = sorted(n for n in os.listdir("/dev") if "nvidia" in n)
    try:
        r = session.sh(script, binds)
    finally:
        # --nv shares the machine's /dev, and the real libnvidia-ml, run as root without a kernel module
        # (no /proc/driver/nvidia/params to say ModifyDeviceFiles: 0), mknods /dev/nvidiactl there
        for n in set(os.listdir("/dev")) - set(before):
            if "nvidia" in n:
                os.unlink(f"/dev/{n}")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "LD=/.singularity.d/libs"
    libs = set(out[1].split())
    assert {"libcuda.so.1", "libnvidia-ml.so.1", "libGLX_nvidia.so.0", "libEGL_nvidia.so.0", "libnvcuvid.so.1",
            "libnvidia-encode.so.1"} <= libs, libs
    # the "host" /dev (the root's is the machine's): exactly its NVIDIA nodes, the fixture host's are not seen
    assert out[2] == "nodes=" + " ".join(before)
    assert out[3] == "/usr/bin/nvidia-smi"
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
    assert out[-1] == "cached=0"


def test_a_sif_built_by_apptainer_runs_through_the_hook(session, tmp_path):
    """`apptainer build` from our image, `apptainer oci mount` makes it a bundle, the documented hook starts it."""
    host, root = _real_host(tmp_path)
    binds = (tmp_path, root)
    sif = _sif(session, tmp_path, binds)
    hook = _registered(session, host, binds, "createRuntime")
    bundle = tmp_path / "sif-bundle"
    edit = ("import json, sys; p = sys.argv[1] + '/config.json'; c = json.load(open(p)); "
            "c['hooks'] = {'createRuntime': [json.loads(sys.argv[2])]}; "
            "c['process']['args'] = ['/bin/sh', '-c', sys.argv[3]]; "
            "c['process']['env'].append('NVIDIA_VISIBLE_DEVICES=2'); c['process']['terminal'] = False; "
            "json.dump(c, open(p, 'w'))")
    script = (f"apptainer oci mount {sif} {bundle} && "
              f"{VENV}/bin/python3 -c \"$EDIT\" {bundle} '{json.dumps(hook)}' \"$PROBE\" && "
              f"apptainer oci run -b {bundle} pyxis-sif-{os.getpid()}; rc=$?; apptainer oci umount {bundle}; exit $rc")
    r = session.sh(script, binds, env={"EDIT": edit, "PROBE": PROBE})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split() == ["nvidia-uvm", "nvidia-uvm-tools", "nvidia2", "nvidiactl"], r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
    assert "\tlibcuda.so.1 (libc6,x86-64) => " in r.stdout
    assert "ld.so.cache: merged 7 entries" in (host.base / "hook.log").read_text()


#: the ordinary user of the ordinary-user cases, with a passwd entry in the session's root (`_user`)
USER = 2001


def _user(session) -> None:
    """uid USER in the root's passwd, group and subordinate-id files (rootless engines map with these)."""
    p = session.sh(f"grep -q '^pyxisuser:' /etc/passwd || {{ echo 'pyxisuser:x:{USER}:{USER}::/tmp:/bin/sh' "
                   f">> /etc/passwd; echo 'pyxisuser:x:{USER}:' >> /etc/group; "
                   f"echo 'pyxisuser:100000:65536' >> /etc/subuid; echo 'pyxisuser:100000:65536' >> /etc/subgid; }}")
    assert p.returncode == 0, p.stderr


def _as_user(session, cmd: str, binds) -> subprocess.CompletedProcess:
    """`cmd` (a shell line) run in the root as uid USER, with its own HOME."""
    _user(session)
    return session.sh(f"mkdir -p /tmp/home && chown {USER}:{USER} /tmp/home && HOME=/tmp/home exec setpriv "
                      f"--reuid={USER} --regid={USER} --init-groups /bin/sh -c \"$CMD\"", binds, env={"CMD": cmd})


def test_an_ordinary_users_oci_run_is_refused_before_any_hook_runs(session, tmp_path):
    """`apptainer oci` is root's alone in Apptainer (each `oci` command checks the euid first): an ordinary
    user's `oci run` of a bundle with the documented registration (or a merged CDI spec, the same command)
    fails with one line, and no hook runs: nothing reaches the hook's log or the node artifact."""
    host, root = _real_host(tmp_path)
    binds = (tmp_path, root)
    p = session.enter([PYXIS, "--config", str(host.conf), "refresh"], binds)
    assert p.returncode == 0, p.stderr
    before = tree_state(host.base / "snapshot")
    bundle = _bundle(tmp_path, PROBE, ("NVIDIA_VISIBLE_DEVICES=1",))
    hook = _registered(session, host, binds, "createRuntime")
    _edit(bundle, lambda c: {**c, "hooks": {"createRuntime": [hook]}})
    for d in (tmp_path, bundle):  # the user can read the bundle: the refusal is not about the files
        os.chmod(d, 0o755)
    r = _as_user(session, f"id -u; apptainer oci run -b {bundle} pyxis-user-{os.getpid()}", binds)
    assert r.returncode == 255, r.stdout + r.stderr
    assert r.stdout == f"{USER}\n"
    assert r.stderr == 'FATAL:   "apptainer oci run" command requires root privileges\n'
    assert "container" not in (host.base / "hook.log").read_text()
    assert tree_state(host.base / "snapshot") == before


def test_apptainer_has_no_oci_mode_for_run_or_exec(session, tmp_path):
    """`--oci` (SingularityCE's rootless OCI mode) is no option of Apptainer's `run`/`exec`."""
    r = _as_user(session, "for c in run exec; do out=$(apptainer $c --oci docker://busybox true 2>&1); "
                          "echo rc=$?; echo \"$out\" | head -1; done", (tmp_path,))
    assert r.stdout.splitlines() == ["rc=1", 'Error for command "run": unknown flag: --oci',
                                     "rc=1", 'Error for command "exec": unknown flag: --oci'], r.stdout + r.stderr


def test_what_an_ordinary_user_gets_instead_exec_nv_in_a_user_namespace(session, tmp_path):
    """The native engine as an ordinary user: the package's starter is not setuid, so the container runs in a
    user namespace of the user's own; `--nv` binds what the host's `ldconfig -p` lists (the admin's part)."""
    _host, root = _real_host(tmp_path, "installer")
    binds = (tmp_path, root)
    sif = _sif(session, tmp_path, binds)
    os.chmod(tmp_path, 0o755)
    p = session.sh(f"echo {root}/usr/lib/x86_64-linux-gnu > /etc/ld.so.conf.d/nvidia.conf && ldconfig", binds)
    assert p.returncode == 0, p.stderr
    r = _as_user(session, f"PATH={root}/usr/bin:$PATH apptainer exec --nv {sif} /bin/sh -c '"
                          "id -u; cat /proc/self/uid_map; echo LD=$LD_LIBRARY_PATH; /usr/bin/gputest'", binds)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert out[0] == str(USER) and out[1].split() == [str(USER), str(USER), "1"], r.stdout  # its own namespace
    assert out[2] == "LD=/.singularity.d/libs"
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
