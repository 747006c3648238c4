"""pyxis-hook on a real NVIDIA node: inject the real driver into a small rootfs and query the GPUs.

The script stands in for the runtime: it builds a rootfs (the host's python3
and glibc, nothing of the driver), starts a process in its own mount
namespace over it (`unshare`), runs `pyxis-hook prestart` with the state JSON
on stdin against the default roots (/, /proc: the real driver), then runs
`nvidia-smi -L` and a CUDA device query inside the rootfs (`nsenter` +
`chroot`) and prints a verdict.  Needs root, python3, util-linux, pyelftools
(importable, or carried: see README.md).  Finishes in well under two minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

QUERY = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
v = ctypes.c_int()
print("cuDriverGetVersion", cuda.cuDriverGetVersion(ctypes.byref(v)), v.value)
rc = cuda.cuInit(0)
print("cuInit", rc)
n = ctypes.c_int()
if rc == 0:
    cuda.cuDeviceGetCount(ctypes.byref(n))
    for i in range(n.value):
        d = ctypes.c_int(); cuda.cuDeviceGet(ctypes.byref(d), i)
        name = ctypes.create_string_buffer(128); cuda.cuDeviceGetName(name, 128, d)
        print("device", i, name.value.decode())
print("devices", n.value)
sys.exit(0 if rc == 0 and n.value > 0 else 1)
"""


def sh(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def copy_with_deps(exe: str, rootfs: str) -> None:
    """Copy `exe` and the libraries glibc's loader would load for it (resolved by our own resolver)."""
    from pyxis_hook.loader import loaderenv, resolve

    real = os.path.realpath(exe)
    env = loaderenv.loader_env_for_root("/")
    files = {real}
    for dep in resolve.resolve_tree(env, real):
        if dep.path:
            files.add(dep.path)
    for f in files:  # each under the path the loader resolved (SONAME links become files)
        dest = rootfs + f
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copy2(os.path.realpath(f), dest)


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="pyxis-hook on a real NVIDIA node")
    ap.add_argument("--config", help="extra pyxis.conf lines from this file (tests point the roots at fixtures)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("verdict: SKIPPED (needs root)")
        return 2
    try:
        import elftools  # noqa: F401  (discovery reads the driver's ELF files with it)
    except ImportError:
        print("verdict: SKIPPED: pyelftools is not importable here; carry it (tests/gpu-node/README.md)")
        return 2
    if not shutil.which("unshare") or not shutil.which("nsenter"):
        print("verdict: SKIPPED: util-linux's unshare/nsenter are missing")
        return 2
    t0 = time.monotonic()
    work = tempfile.mkdtemp(prefix="pyxis-gpu-node-")
    rootfs = os.path.join(work, "rootfs")
    for d in ("etc", "proc", "dev", "sys", "tmp", "usr/bin"):
        os.makedirs(os.path.join(rootfs, d), exist_ok=True)
    if os.path.exists("/etc/debian_version"):
        shutil.copy2("/etc/debian_version", os.path.join(rootfs, "etc/debian_version"))
    with open(os.path.join(rootfs, "etc/ld.so.conf"), "w") as f:
        f.write("include /etc/ld.so.conf.d/*.conf\n")
    os.makedirs(os.path.join(rootfs, "etc/ld.so.conf.d"), exist_ok=True)
    py = os.path.realpath(sys.executable)  # the real binary goes into the rootfs
    hook_py = sys.executable  # the hook runs as installed here (a venv keeps its site-packages)
    copy_with_deps(py, rootfs)
    import _ctypes  # its libffi must be in the rootfs for the query's ctypes

    copy_with_deps(_ctypes.__file__, rootfs)
    stdlib = sysconfig.get_paths()["stdlib"]
    os.makedirs(rootfs + stdlib, exist_ok=True)
    with open(os.path.join(rootfs, "query.py"), "w") as f:
        f.write(QUERY)
    subprocess.run(["ldconfig", "-r", rootfs], check=False)
    # the "container": a process in its own mount namespace with the rootfs bind-mounted onto
    # itself (as runc and crun do: the mount the hook pins), stdlib bound read-only
    holder = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               f"mount --bind {rootfs} {rootfs} && "
                               f"mount --bind -o ro {stdlib} {rootfs}{stdlib} && "
                               f"mount -t proc proc {rootfs}/proc && "
                               f"mount -t sysfs -o ro sysfs {rootfs}/sys && "
                               f"mount -t tmpfs -o mode=755 tmpfs {rootfs}/dev && exec sleep 300"])
    try:
        time.sleep(0.5)
        if holder.poll() is not None:
            print("verdict: SKIPPED: cannot make a mount namespace here (unshare -m failed: no CAP_SYS_ADMIN?)")
            return 2
        bundle = os.path.join(work, "bundle")
        os.makedirs(bundle)
        with open(os.path.join(bundle, "config.json"), "w") as f:
            json.dump({"ociVersion": "1.0.2", "root": {"path": rootfs},
                       "process": {"args": ["/bin/sh"], "cwd": "/", "env": [
                           "NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]}}, f)
        conf = os.path.join(work, "pyxis.conf")
        with open(conf, "w") as f:
            f.write(f'no-cgroups = true\nsnapshot-dir = "{work}/snapshot"\nlog-file = "{work}/hook.log"\n'
                    'log-level = "debug"\n')
            if args.config:
                with open(args.config) as extra:
                    f.write(extra.read())
        state = json.dumps({"ociVersion": "1.0.2", "id": "gpu-node-check", "status": "creating",
                            "pid": holder.pid, "bundle": bundle})
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYXIS_HOOK_CONFIG": conf,
               "PYTHONPATH": os.pathsep.join([REPO] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])}
        print(f"$ {py} -m pyxis_hook info")
        print(sh([hook_py, "-m", "pyxis_hook", "info"], env=env).stdout)
        th = time.monotonic()
        hook = sh([hook_py, "-m", "pyxis_hook", "prestart"], input=state, env=env)
        hook_s = time.monotonic() - th
        print(f"hook exit {hook.returncode} in {hook_s * 1000:.0f} ms {hook.stderr.strip()}")
        th = time.monotonic()
        again = sh([hook_py, "-m", "pyxis_hook", "plan", "--bundle", bundle], env=env)
        print(again.stdout[-3000:])
        inside = ["nsenter", "-t", str(holder.pid), "-m", "chroot", rootfs]
        smi = sh(inside + ["/usr/bin/nvidia-smi", "-L"])
        print("$ nvidia-smi -L (inside)\n" + smi.stdout + smi.stderr)
        q = sh(inside + [py, "/query.py"], env={"PYTHONHOME": sys.base_prefix, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        print("$ CUDA device query (inside)\n" + q.stdout + q.stderr)
        ok = hook.returncode == 0 and smi.returncode == 0 and "GPU 0" in smi.stdout and q.returncode == 0
        print(f"elapsed {time.monotonic() - t0:.1f} s")
        print("verdict: " + ("PASS: the container sees the GPUs through pyxis-hook" if ok else "FAIL"))
        return 0 if ok else 1
    finally:
        holder.kill()
        holder.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
