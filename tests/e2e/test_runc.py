"""The prestart hook, end to end, with real runc and crun (root).

Each test builds a fake GPU host (procfs + real char nodes made with
mknod), a driver tree, and a small glibc rootfs, then starts the container
with the runtime and asserts from inside: the device nodes, the driver
libraries the loader finds, what the libraries answer (as a GPU node without
the kernel module would), and that the host's mount table did not change.
"""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest

from e2e.conftest import bundle_for, make_host, mount_table, run_container

pytestmark = [pytest.mark.e2e, pytest.mark.root, pytest.mark.slow]

RUNTIMES = [r for r in ("runc", "crun") if shutil.which(r)]

PROBE = ("ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; "
         "for n in /dev/nvidia*; do [ -c $n ] && stat -c 'node %n %t:%T' $n; done; "
         "/usr/bin/gputest; ldconfig -p | grep -c nvidia-ml | sed 's/^/nvml-cache-entries=/'; "
         "cat /dev/nvidia0 2>&1 | head -1 | sed 's/^/open0: /'; "
         "if [ -x /usr/bin/nvidia-smi ]; then nvidia-smi; echo smi-rc=$?; fi; "
         "echo CVD=$CUDA_VISIBLE_DEVICES")


def _nodes(out: str) -> set[str]:
    first = out.splitlines()[0] if out else ""
    return set(first.split())


def _start(runtime, tmp_path, host, env, script=PROBE, **kw):
    bundle = bundle_for(tmp_path, host, env, script, **kw)
    before = mount_table()
    res = run_container(runtime, bundle, f"pyxis-{os.getpid()}-{tmp_path.name[-12:]}")
    assert mount_table() == before, "host mount table changed"
    return res


@pytest.fixture
def host(tmp_path):
    return make_host(tmp_path)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_subset_gets_exactly_those_gpus(runtime, tmp_path, host):
    r = _start(runtime, tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0,2",))
    assert r.rc == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia-uvm", "nvidia-uvm-tools", "nvidia0", "nvidia2", "nvidiactl"}
    assert "node /dev/nvidia2 c3:2" in r.stdout  # 195 = 0xc3
    assert "node /dev/nvidiactl c3:ff" in r.stdout
    assert "cuDriverGetVersion=12020 rc=0" in r.stdout
    assert "cuInit=100" in r.stdout and "nvmlInit_v2=9" in r.stdout
    assert "nvml-cache-entries=1" in r.stdout
    assert "smi-rc=9" in r.stdout and "couldn't communicate with the NVIDIA driver" in r.stdout
    # device cgroup: the allowed node opens as far as the (absent) driver: ENXIO, not EPERM
    assert "open0: cat: can't open '/dev/nvidia0': No such device or address" in r.stdout, r.stdout


def test_the_hook_runs_under_the_interpreter_that_registered_it(tmp_path, host):
    """hook_entry registers this interpreter (hookd.interpreter): the start's log names its start image by cache tag.

    What makes `.ci/run`'s pass under each interpreter test that interpreter as the hook's, not only as pytest's.
    """
    r = _start(RUNTIMES[0], tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",))
    assert r.rc == 0, r.stderr
    images = set(re.findall(r"/__pycache__/start-image\.([a-z]+-[0-9]+)-", (host.base / "hook.log").read_text()))
    assert images == {sys.implementation.cache_tag}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_all_and_uuid(runtime, tmp_path, host):
    r = _start(runtime, tmp_path / "a", host, ("NVIDIA_VISIBLE_DEVICES=all",))
    assert r.rc == 0, r.stderr
    assert {"nvidia0", "nvidia1", "nvidia2", "nvidia3"} <= _nodes(r.stdout)
    uuid = host.tree.gpus[3].uuid
    r = _start(runtime, tmp_path / "b", host, (f"NVIDIA_VISIBLE_DEVICES={uuid}",))
    assert r.rc == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia-uvm", "nvidia-uvm-tools", "nvidia3", "nvidiactl"}


def test_none_void_unset(tmp_path, host):
    r = _start("runc", tmp_path / "none", host, ("NVIDIA_VISIBLE_DEVICES=none",))
    assert r.rc == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"}
    assert "cuDriverGetVersion=12020" in r.stdout
    for env in (("NVIDIA_VISIBLE_DEVICES=void",), (), ("NVIDIA_VISIBLE_DEVICES=",)):
        sub = tmp_path / ("case%d" % len(os.listdir(tmp_path)))
        r = _start("runc", sub, host, env)
        assert r.rc == 0, r.stderr
        assert _nodes(r.stdout) == set()
        assert "libcuda.so.1: cannot open shared object file" in r.stdout


def test_utility_only_gets_no_cuda(tmp_path, host):
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=utility"))
    assert r.rc == 0, r.stderr
    assert _nodes(r.stdout) == {"nvidia1", "nvidiactl"}  # no uvm without compute
    assert "libcuda.so.1: cannot open shared object file" in r.stdout
    assert "nvmlInit_v2=9" in r.stdout and "smi-rc=9" in r.stdout


def test_failing_requirement_fails_creation_with_our_message(tmp_path, host):
    r = _start("runc", tmp_path / "fail", host, ("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"))
    assert r.rc != 0
    assert "pyxis-hook: error: requirement error: unsatisfied condition: cuda>=12.4" in r.stderr
    assert "Traceback" not in r.stderr
    r = _start("runc", tmp_path / "ok", host, ("NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.4",
                                               "NVIDIA_DISABLE_REQUIRE=true"))
    assert r.rc == 0, r.stderr
    assert "nvidia0" in _nodes(r.stdout)


def test_unknown_device_is_one_line(tmp_path, host):
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=7",))
    assert r.rc != 0
    line = [x for x in r.stderr.splitlines() if "pyxis-hook: error:" in x]
    assert len(line) == 1 and "7" in line[0], r.stderr
    assert "Traceback" not in r.stderr


def test_create_runtime_stage(tmp_path, host):
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), stage="createRuntime")
    assert r.rc == 0, r.stderr
    assert "nvidia0" in _nodes(r.stdout)
    assert "cuDriverGetVersion=12020" in r.stdout


def test_host_without_kernel_module_fails_clearly(tmp_path):
    """No module: no /proc/driver/nvidia and no nodes; a GPU request fails with one line, naming the cause."""
    host = make_host(tmp_path, kernel_module=False)
    r = _start("runc", tmp_path / "one", host, ("NVIDIA_VISIBLE_DEVICES=0",))
    assert r.rc != 0
    errors = [x for x in r.stderr.splitlines() if "pyxis-hook: error:" in x]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    r = _start("runc", tmp_path / "none", host, ("NVIDIA_VISIBLE_DEVICES=none",))
    assert r.rc != 0
    assert "nvidiactl: missing" in r.stderr


def test_container_proc_without_driver_dir_is_skipped(tmp_path, host):
    """This machine's procfs has no /proc/driver/nvidia: the view is skipped on purpose, the rest works."""
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=2",),
               script="ls /proc/driver/nvidia 2>&1 | head -1; /usr/bin/gputest")
    assert r.rc == 0, r.stderr
    assert "No such file or directory" in r.stdout
    assert "cuDriverGetVersion=12020" in r.stdout
    log = (host.base / "hook.log").read_text()
    assert "/proc/driver/nvidia" in log


def test_proc_driver_view_with_module(tmp_path, host):
    """A node with the module: the container's /proc/driver/nvidia exists (here: the fixture's, bound in
    by the bundle as a GPU node's procfs would show it); the hook covers it with a tmpfs holding a
    patched params and only the selected GPU's directory."""
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=2",),
                        "ls /proc/driver/nvidia/gpus; grep ModifyDeviceFiles /proc/driver/nvidia/params")
    import json
    cfg = json.loads((bundle / "config.json").read_text())
    cfg["mounts"].insert(1, {"destination": "/proc/driver", "type": "bind",
                             "source": os.path.join(host.proc_root, "driver"), "options": ["rbind", "ro"]})
    (bundle / "config.json").write_text(json.dumps(cfg))
    before = mount_table()
    # runc refuses any mount under /proc; crun allows this stand-in for a module-loaded procfs
    r = run_container("crun", bundle, f"pyxis-proc-{os.getpid()}")
    assert mount_table() == before
    assert r.rc == 0, r.stderr
    gpu2 = host.tree.gpus[2].bus_id
    assert r.stdout.split()[0].lower() == gpu2.lower()
    assert len(r.stdout.split("\n")[0].split()) == 1
    assert "ModifyDeviceFiles: 0" in r.stdout
    with open(os.path.join(host.proc_root, "driver/nvidia/params")) as f:
        assert "ModifyDeviceFiles: 1" in f.read()  # the host's copy is untouched


def test_non_debian_image_gets_lib64(tmp_path, host):
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), rootfs_kw={"debian": False},
               script="ls /usr/lib64 | grep -c libcuda; /usr/bin/gputest")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout


def test_image_without_ldconfig_still_loads(tmp_path, host):
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",),
               rootfs_kw={"with_ldconfig": False, "with_ld_so_conf": False}, script="/usr/bin/gputest")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout


def test_hostile_symlinked_libdir_stays_inside(tmp_path, host):
    """/usr/lib/x86_64-linux-gnu -> / in the image: mounts land inside the rootfs, the host is untouched."""
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "ls /libcuda.so.* 2>&1; /usr/bin/gputest")
    rootfs = bundle / "rootfs"
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    moved = rootfs / "usr/lib/real-gnu"
    libdir.rename(moved)
    libdir.symlink_to("/")
    (rootfs / "etc/ld.so.conf.d/real.conf").write_text("/usr/lib/real-gnu\n")
    (rootfs / "lib64/ld-linux-x86-64.so.2").unlink()
    (rootfs / "lib64/ld-linux-x86-64.so.2").symlink_to("../usr/lib/real-gnu/ld-linux-x86-64.so.2")
    host_root_before = sorted(os.listdir("/"))
    before = mount_table()
    r = run_container("runc", bundle, f"pyxis-hostile-{os.getpid()}")
    assert mount_table() == before
    assert sorted(os.listdir("/")) == host_root_before
    assert not any(n.startswith("libcuda") for n in os.listdir("/"))
    assert "pyxis-hook: error" not in r.stderr, r.stderr
    # the library landed inside the rootfs, at the link's target resolved there: its root
    assert re.search(r"^/libcuda\.so\.", r.stdout, re.M), r.stdout


def test_hostile_ld_so_cache_link_to_host_file(tmp_path, host):
    """/etc/ld.so.cache -> ../../../../<host file>: the cache update stays in the rootfs; the host file is untouched."""
    canary = tmp_path / "host-canary"
    canary.write_bytes(b"host data\n")
    before_stat = os.stat(canary)
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    cache = bundle / "rootfs/etc/ld.so.cache"
    cache.unlink()
    cache.symlink_to("../../../../../../../../.." + str(canary))
    before = mount_table()
    r = run_container("runc", bundle, f"pyxis-cachelink-{os.getpid()}")
    assert mount_table() == before
    assert canary.read_bytes() == b"host data\n"
    after_stat = os.stat(canary)
    assert (after_stat.st_ino, after_stat.st_mtime_ns) == (before_stat.st_ino, before_stat.st_mtime_ns)
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout


def test_readonly_rootfs(tmp_path, host):
    """root.readonly: runc makes the rootfs read-only after the prestart hooks, so injection still works."""
    r = _start("runc", tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), readonly=True,
               script="/usr/bin/gputest; touch /x 2>&1 | head -1")
    assert r.rc == 0, r.stderr
    assert "cuDriverGetVersion=12020" in r.stdout
    assert "Read-only file system" in r.stdout


def test_dotdot_chain_in_image(tmp_path, host):
    """usr/lib/x86_64-linux-gnu -> ../../../../../../tmp/<dir>: resolved inside the rootfs, not on the host."""
    target = tmp_path / "outside"
    target.mkdir()
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    rootfs = bundle / "rootfs"
    libdir = rootfs / "usr/lib/x86_64-linux-gnu"
    real = rootfs / "usr/lib/real-gnu"
    libdir.rename(real)
    libdir.symlink_to("../../../../../../../.." + str(target))
    (rootfs / "etc/ld.so.conf.d/real.conf").write_text("/usr/lib/real-gnu\n")
    (rootfs / "lib64/ld-linux-x86-64.so.2").unlink()
    (rootfs / "lib64/ld-linux-x86-64.so.2").symlink_to("../usr/lib/real-gnu/ld-linux-x86-64.so.2")
    before = mount_table()
    r = run_container("runc", bundle, f"pyxis-dotdot-{os.getpid()}")
    assert mount_table() == before
    assert "pyxis-hook: error" not in r.stderr, r.stderr  # the hook succeeded, inside the rootfs
    assert os.listdir(target) == []  # nothing created on the host side of the link


@pytest.mark.parametrize("ldcache", ["merge", "ldconfig"])
@pytest.mark.parametrize("image", ["fifo", "dev-zero", "include-loop", "glob-everything"])
def test_unsafe_loader_config_fails_the_start_in_one_line(tmp_path, host, image, ldcache):
    """What would make glibc's ldconfig block, read a device as root or spin is refused before it runs.

    The start fails with the reader's reason, no ldconfig ran (the image's cache is untouched) and the
    host's mounts are as before.  `/dev/zero` is runc's, inside the container's /dev at prestart.
    """
    host.write_conf(ldcache=ldcache)
    bundle = bundle_for(tmp_path, host, ("NVIDIA_VISIBLE_DEVICES=0",), "/usr/bin/gputest")
    rootfs = bundle / "rootfs"
    conf = rootfs / "etc/ld.so.conf"
    conf.unlink()
    if image == "fifo":
        os.mkfifo(conf)
        why = "/etc/ld.so.conf (in %s): a FIFO" % rootfs
    elif image == "dev-zero":
        conf.symlink_to("/dev/zero")
        why = "/etc/ld.so.conf (in %s): a character device" % rootfs
    elif image == "include-loop":
        conf.write_text("include /etc/ld.so.conf\ninclude /etc/ld.so.conf\n")
        why = "includes itself"
    else:  # the live /proc and /sys are never walked; the image's own tree is past the reader's budget
        conf.write_text("include /*/*/*/*/*/*\n" * 300)
        why = "look at more than"
    cache = (rootfs / "etc/ld.so.cache").read_bytes()
    before = mount_table()
    r = run_container("runc", bundle, f"pyxis-ldconf-{os.getpid()}-{tmp_path.name[-12:]}")
    assert mount_table() == before
    assert r.rc != 0
    errors = [x for x in r.stderr.splitlines() if "pyxis-hook: error:" in x]
    assert len(errors) == 1, r.stderr
    assert "ld.so.cache not updated: the image's loader configuration is refused: " in errors[0], r.stderr
    assert why in errors[0], r.stderr
    assert "Traceback" not in r.stderr
    assert (rootfs / "etc/ld.so.cache").read_bytes() == cache
