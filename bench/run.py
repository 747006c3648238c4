#!/usr/bin/env python3
"""The hook's speed targets and its cost beside runc and glibc's ldconfig, in one run, interleaved.

    sudo python bench/run.py [--peer PATH] [--rounds 11] [--imports] [--mounts N]

Root is needed (overlay mounts, mknod'ed fake GPU nodes, runc).  Everything
is built under --work (default a temp dir): a fake driver (tests/fixtures),
fake GPU hosts with 1, 4, 8 and 64 GPUs, a small glibc image and 1,000- and
5,000-library images (bench/mkimage.py).  Every timed container start gets a
fresh overlay over the image, as a runtime gives it, so nothing one run
writes (mount points, links, the cache) helps the next.

Cases, each timed as the wall time of one process, medians of --rounds,
every round running every case once in a shuffled order:

* `bare`: `python -I -S -c pass`, the interpreter's floor;
* `ldconfig -r`: glibc's full cache rebuild of the image, what
  nvidia-container-cli's time is dominated by (its own work is a flat ~9 ms);
* `hook`: `python -I -S .../pyxis_hook/__main__.py prestart` with the OCI state on stdin,
  for a container process started here (`unshare -m` over the rootfs,
  standing in for runc's container before pivot_root), so one hook run is
  measured by itself; `no-cgroups = true` since that process has no cgroup
  of its own; the `-I -m` rows are the same hook with Python's site scan; the `launcher`
  rows run it as engines do once `pyxis-hook install` registered it (the launcher file);
* `runc run` of the same bundle (`/bin/true`) without and with the hook;
* `enroot`: the enroot hook as its shim runs it (`python -I -S .../__main__.py enroot`),
  `nsenter`'ed into the stand-in's namespace with ENROOT_* set;
* `user namespace`: the enroot hook as enroot runs it for an ordinary user's job (uid
  USER_UID, a user namespace mapping it to itself, the container's mount namespace, the node's
  own python3), beside the same start as root: the node artifact and start image root wrote;
* `peer` (with --peer): nvidia-container-cli `configure` on the same
  rootfs and container process, interleaved.

`--mounts N` runs it all on a busy node: in a private mount namespace holding N more
mounts, as a Kubernetes node's pods give it thousands (the hook reads the mount tables).

No timing is asserted anywhere; the table is the result (bench/README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(HERE))

import mkimage  # noqa: E402
from fixtures.container import make_bundle, make_rootfs  # noqa: E402
from fixtures.fakedriver import make_fake_driver  # noqa: E402
from fixtures.hosttree import fake_gpus, make_host_tree  # noqa: E402

PY = os.path.realpath(sys.executable)
#: how the hook is run: the interpreter with -I (isolated) and -S (no site scan: .pth files, an editable
#: install's finder), the package's __main__.py as a file (it puts its own parent on sys.path)
HOOK_ARGS = [PY, "-I", "-S", str(REPO / "pyxis_hook" / "__main__.py"), "prestart"]
#: the form with the site scan (`python -I -m pyxis_hook`), for comparison
HOOK_ARGS_SITE = [PY, "-I", "-m", "pyxis_hook", "prestart"]
DRIVER_VERSION = "535.216.03"
GPU_COUNTS = (1, 4, 8, 64)
IMAGES = {"small": 0, "1k": 1000, "5k": 5000}
GPU_ENV = ("NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=compute,utility")
#: the ordinary user of the user-namespace rows, and the node's own interpreter they run the hook with
USER_UID = 2001
NODE_PY = "/usr/bin/python3"
#: nvidia-container-cli's own work per start, measured once on these fixtures (its time minus its ldconfig run)
PEER_OWN_MS = 9.0


def launcher(work: Path) -> list[str]:
    """The registered form: the launcher `pyxis-hook install` writes, for this interpreter and checkout."""
    from pyxis_hook.engines.launcher import launcher_text

    path = work / "pyxis-hook-launcher"
    path.write_text(launcher_text(PY, str(REPO / "pyxis_hook" / "__main__.py")))
    path.chmod(0o755)
    return [str(path), "prestart"]


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=True, capture_output=True, **kw)


class World:
    """Everything the cases need, built once."""

    def __init__(self, work: Path, peer: str | None) -> None:
        self.work = work
        self.peer = peer
        self.ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
        self.driver = make_fake_driver(work / "driver", version=DRIVER_VERSION)
        self.confs: dict[tuple[int, bool], Path] = {}
        for n in GPU_COUNTS:
            tree = make_host_tree(work / f"host{n}", gpus=fake_gpus(n), driver_version=DRIVER_VERSION)
            for no_cgroups in (True, False):
                conf = work / f"pyxis-{n}-{'nocg' if no_cgroups else 'cg'}.conf"
                conf.write_text("\n".join([
                    f'driver-root = "{self.driver}"', f'dev-root = "{tree.dev_root}"',
                    f'proc-root = "{tree.proc_root}"', f'snapshot-dir = "{work}/snapshot{n}"',
                    'log-level = "warning"', f"no-cgroups = {'true' if no_cgroups else 'false'}", ""]))
                self.confs[n, no_cgroups] = conf
        self.images: dict[str, Path] = {}
        small = make_rootfs(work / "img-small", gputest=False)
        self.images["small"] = small
        for name, count in IMAGES.items():
            if count:
                dest = work / f"img-{name}"
                shutil.copytree(small, dest, symlinks=True)
                mkimage.write_libs(dest, count)
                mkimage.ldconfig(dest)
                self.images[name] = dest
        self.seq = 0
        self.launcher = launcher(work)
        self.user_image = user_image(work, small)


    # -- fresh rootfs per run --------------------------------------------------
    def overlay(self, image: str) -> tuple[Path, Path]:
        self.seq += 1
        base = self.work / "ov" / str(self.seq)
        for d in ("upper", "work", "mnt"):
            (base / d).mkdir(parents=True)
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir={self.images[image]},upperdir={base}/upper,workdir={base}/work", str(base / "mnt"))
        return base, base / "mnt"

    def drop(self, base: Path) -> None:
        subprocess.run(["umount", "-l", str(base / "mnt")], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)

    def hook_env(self, n: int, no_cgroups: bool) -> dict[str, str]:
        return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "PYXIS_HOOK_CONFIG": str(self.confs[n, no_cgroups])}

    def hook_entry(self, n: int) -> dict:
        env = self.hook_env(n, False)
        return {"path": PY, "args": HOOK_ARGS,
                "env": [f"{k}={v}" for k, v in env.items()]}


def _container(rootfs: Path) -> subprocess.Popen:
    """A process in its own mount namespace over the rootfs: runc's container before pivot_root.

    As runc does, the rootfs is bind-mounted onto itself in that namespace (the mount the hook
    pins), and the container's /dev is a fresh tmpfs (config.json's first mounts), so device
    mount points are made there and not on the image's overlay.
    """
    p = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c",
                          'mount --bind "$PWD" "$PWD" && cd "$PWD" && '
                          "mount -t tmpfs -o nosuid,strictatime,mode=755,size=65536k tmpfs dev && exec sleep 600"],
                         cwd=rootfs)
    for _ in range(4000):  # ready once /dev is mounted and sh has become sleep
        try:
            with open(f"/proc/{p.pid}/comm") as f:
                if f.read().strip() == "sleep":
                    return p
        except OSError:
            pass
        if p.poll() is not None:
            break
        time.sleep(0.0005)
    p.kill()
    raise RuntimeError("the container stand-in did not start (unshare, mount of /dev)")


def case_bare(w: World) -> float:
    t = time.perf_counter()
    sh(PY, "-I", "-S", "-c", "pass")
    return time.perf_counter() - t


def case_ldconfig(w: World, image: str) -> float:
    base, root = w.overlay(image)
    try:
        t = time.perf_counter()
        sh(w.ldconfig, "-r", str(root))
        return time.perf_counter() - t
    finally:
        w.drop(base)


@contextlib.contextmanager
def _stand_in(w: World, image: str):
    """(overlay dir, rootfs, container process) over a fresh overlay of `image`; all gone after."""
    base, root = w.overlay(image)
    proc = _container(root)
    try:
        yield base, root, proc
    finally:
        proc.kill()
        proc.wait()
        w.drop(base)


def _timed(what: str, cmd: list[str], **kw) -> float:
    """The wall time of one run of `cmd`; RuntimeError with its stderr when it fails."""
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, **kw)
    dt = time.perf_counter() - t
    if r.returncode:
        raise RuntimeError(f"{what} failed: {r.stderr.decode(errors='replace')}")
    return dt


def _state(w: World, proc: subprocess.Popen, bundle: Path) -> bytes:
    return json.dumps({"ociVersion": "1.0.2", "id": f"bench{w.seq}", "status": "creating",
                       "pid": proc.pid, "bundle": str(bundle)}).encode()


def case_hook(w: World, image: str, n: int, env: tuple[str, ...], peer: bool = False,
              argv: list[str] | None = None) -> float:
    with _stand_in(w, image) as (base, root, proc):
        bundle = base / "bundle"
        make_bundle(bundle, root, env=env)
        if peer:
            return _timed("peer", [w.peer, f"--root={w.driver}", "configure", f"--ldconfig=@{w.ldconfig}",
                                   "--device=all", "--compute", "--utility", f"--pid={proc.pid}", str(root)])
        return _timed("hook", argv or HOOK_ARGS, input=_state(w, proc, bundle), env=w.hook_env(n, True))


def case_enroot(w: World, argv: list[str], n: int = 4) -> float:
    """The enroot hook as enroot runs it: in the container's mount namespace, ENROOT_* set, GPUs asked in the file.

    `nsenter` into the stand-in's namespace is part of each run (~5 ms here): enroot runs its
    hooks there, so the rows are comparable with one another, not with the `prestart` rows.
    """
    with _stand_in(w, "small") as (base, root, proc):
        environ = base / "environ"
        environ.write_text("".join(f"{e}\n" for e in GPU_ENV) + "PATH=/usr/bin:/bin\n")
        env = dict(w.hook_env(n, True), ENROOT_PID=str(proc.pid), ENROOT_ROOTFS=str(root),
                   ENROOT_ENVIRON=str(environ))
        return _timed("enroot hook", ["nsenter", "-t", str(proc.pid), "-m", "--", *argv], env=env)


def user_image(work: Path, small: Path) -> Path | None:
    """The small image owned by USER_UID, as enroot unpacks a user's image; None without the node's python3."""
    if not os.access(NODE_PY, os.X_OK):
        print(f"no user-namespace rows: no {NODE_PY}", file=sys.stderr)
        return None
    os.chmod(work, 0o755)  # the user walks to the fixtures, as to a node's driver and config
    dest = work / "img-user"
    shutil.copytree(small, dest, symlinks=True)
    sh("chown", "-R", f"{USER_UID}:{USER_UID}", str(dest))
    return dest


def case_user_ns(w: World, as_user: bool, n: int = 4) -> float:
    """The enroot hook as enroot runs it for a job: in a new mount namespace (and, for the user, a user
    namespace mapping USER_UID to itself, capabilities kept), ENROOT_PID its own pid, the node's python3.

    Root's row is the same command as uid 0 without the user namespace: the ratio is what being an
    ordinary user in a user namespace costs.
    """
    base = w.work / "ov" / f"u{w.seq}"
    w.seq += 1
    for d in ("upper", "work", "mnt"):
        (base / d).mkdir(parents=True)
    uid = USER_UID if as_user else 0
    os.chown(base / "upper", uid, uid)
    sh("mount", "-t", "overlay", "overlay", "-o",
       f"lowerdir={w.user_image},upperdir={base}/upper,workdir={base}/work", str(base / "mnt"))
    try:
        environ = base / "environ"
        environ.write_text("".join(f"{e}\n" for e in GPU_ENV) + "PATH=/usr/bin:/bin\n")
        os.chown(environ, uid, uid)
        ns = ["unshare", "--user", "--map-current-user", "--mount", "--keep-caps"] if as_user else ["unshare", "--mount"]
        env = dict(w.hook_env(n, True), ENROOT_ROOTFS=str(base / "mnt"), ENROOT_ENVIRON=str(environ))
        hook = f"ENROOT_PID=$$ exec {NODE_PY} -I -S {REPO / 'pyxis_hook' / '__main__.py'} enroot"
        return _timed("user-namespace start" if as_user else "root start",
                      ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *ns, "--",
                       "sh", "-c", hook], env=env)
    finally:
        w.drop(base)


def case_runc(w: World, image: str, n: int, with_hook: bool) -> float:
    base, root = w.overlay(image)
    bundle = base / "bundle"
    hooks = {"prestart": [w.hook_entry(n)]} if with_hook else {}
    make_bundle(bundle, root, env=GPU_ENV if with_hook else (), args=("/bin/true",), hooks=hooks)
    name = f"pyxis-bench-{os.getpid()}-{w.seq}"
    try:
        t = time.perf_counter()
        r = subprocess.run(["runc", "run", name], cwd=bundle, capture_output=True, stdin=subprocess.DEVNULL)
        dt = time.perf_counter() - t
        if r.returncode:
            raise RuntimeError(f"runc run failed: {r.stderr.decode(errors='replace')}")
        return dt
    finally:
        subprocess.run(["runc", "delete", "-f", name], capture_output=True)
        w.drop(base)


def cases(w: World) -> dict[str, object]:
    c: dict[str, object] = {"bare python -I -S": lambda: case_bare(w)}
    for img in IMAGES:
        c[f"ldconfig -r, {img} image"] = lambda img=img: case_ldconfig(w, img)
    c["hook, no GPU asked (void), small"] = lambda: case_hook(w, "small", 4, ())
    c["launcher, no GPU asked (void), small"] = lambda: case_hook(w, "small", 4, (), argv=w.launcher)
    c["launcher, 4 GPUs, small"] = lambda: case_hook(w, "small", 4, GPU_ENV, argv=w.launcher)
    c["hook -I -m (site scan), void, small"] = lambda: case_hook(w, "small", 4, (), argv=HOOK_ARGS_SITE)
    c["hook -I -m (site scan), 4 GPUs, small"] = lambda: case_hook(w, "small", 4, GPU_ENV, argv=HOOK_ARGS_SITE)
    for n in GPU_COUNTS:
        c[f"hook, {n} GPUs, small"] = lambda n=n: case_hook(w, "small", n, GPU_ENV)
    for img in ("1k", "5k"):
        c[f"hook, 4 GPUs, {img}"] = lambda img=img: case_hook(w, img, 4, GPU_ENV)
    c["hook, 64 GPUs, 5k"] = lambda: case_hook(w, "5k", 64, GPU_ENV)
    c["enroot hook (shim's form), 4 GPUs, small"] = lambda: case_enroot(w, HOOK_ARGS[:-1] + ["enroot"])
    if w.user_image is not None:  # root's first: its warm-up writes the node python's start image
        c["enroot-style start as root, node python3, 4 GPUs"] = lambda: case_user_ns(w, False)
        c["enroot-style start as a user, user namespace, 4 GPUs"] = lambda: case_user_ns(w, True)
    if w.peer:
        for img in IMAGES:
            c[f"peer configure, 4 GPUs, {img}"] = lambda img=img: case_hook(w, img, 4, GPU_ENV, peer=True)
    if shutil.which("runc"):
        for img in ("small", "5k"):
            c[f"runc run, no hook, {img}"] = lambda img=img: case_runc(w, img, 4, False)
        for n in (1, 8, 64):
            c[f"runc run + hook, {n} GPUs, small"] = lambda n=n: case_runc(w, "small", n, True)
        c["runc run + hook, 4 GPUs, 5k"] = lambda: case_runc(w, "5k", 4, True)
    return c


#: the speed targets: (name, how, numerator case, denominator case, limit); the denominator None: bare
TARGETS = (
    ("GPU start / bare interpreter", "hook 4 GPUs, small image, as registered (the launcher) / python -I -S -c pass",
     "launcher, 4 GPUs, small", None, 2.0),
    ("user's start / root's start", "the enroot hook as a user in a user namespace / as root, node python3",
     "enroot-style start as a user, user namespace, 4 GPUs", "enroot-style start as root, node python3, 4 GPUs", 1.1),
    ("no GPU / bare interpreter", "hook, no GPU asked, as registered (the launcher) / python -I -S -c pass",
     "launcher, no GPU asked (void), small", None, 1.0),
    ("5,000-lib image / small image", "hook 5,000-lib image / hook small image (4 GPUs)",
     "hook, 4 GPUs, 5k", "hook, 4 GPUs, small", 1.1),
    ("64 GPUs / 1 GPU", "hook 64 GPUs / 1 GPU (small image)", "hook, 64 GPUs, small", "hook, 1 GPUs, small", 1.2),
)


def goals(m: dict[str, float], peer: bool) -> list[tuple[str, str, float, float, bool]]:
    """(what is compared, how, value, limit, met): the speed targets bench/README.md states."""
    out = []
    bare = m["bare python -I -S"]
    for name, how, num, den, limit in TARGETS:
        if num in m and (den is None or den in m):
            r = m[num] / (bare if den is None else m[den])
            out.append((name, how, r, limit, r <= limit))
    small4 = m["hook, 4 GPUs, small"]
    if peer:
        r = small4 / m["peer configure, 4 GPUs, small"]
        out.append(("GPU start / nvidia-container-cli", "hook / nvidia-container-cli configure, small, 4 GPUs",
                    r, 1.5, r <= 1.5))
    else:
        r = small4 / (PEER_OWN_MS / 1000 + m["ldconfig -r, small image"])
        out.append(("GPU start / C-tool estimate", f"hook / est. C tool (its own {PEER_OWN_MS:.0f} ms + ldconfig "
                    "-r measured here), small, 4 GPUs", r, 1.5, r <= 1.5))
    return out


def render(m: dict[str, float], spread: dict[str, float], rounds: int, peer: bool,
           times: dict[str, list[float]] | None = None) -> str:
    bare = m["bare python -I -S"]
    lines = ["| case | median ms | ±IQR/2 ms | × bare python | × ldconfig -r (same image) | × runc run no hook |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, v in m.items():
        img = next((i for i in IMAGES if name.endswith((f", {i}", f", {i} image"))), None)
        ld = m.get(f"ldconfig -r, {img} image") if img else None
        rn = m.get(f"runc run, no hook, {img}") if img else None
        lines.append(f"| {name} | {v * 1e3:.1f} | {spread[name] * 1e3:.1f} | {v / bare:.2f} | "
                     f"{'' if ld is None or name.startswith('ldconfig') else f'{v / ld:.2f}'} | "
                     f"{'' if rn is None or not name.startswith('runc run +') else f'{v / rn:.2f}'} |")
    # The target is the ratio of the two medians.  Beside it, the median over rounds of the ratio
    # within each round (the two runs minutes apart at most): what is left when the machine's
    # speed drifts between rounds, shown so that a reader can tell drift from a change.
    paired: list[list[float]] = []
    if times:
        for i in range(min(len(v) for v in times.values())):
            paired.append([g[2] for g in goals({k: v[i] for k, v in times.items()}, peer)])
    lines += ["", "| target | ratio of medians | median of per-round ratios | limit | met |",
              "|---|---:|---:|---:|---|"]
    for j, (g, how, val, lim, met) in enumerate(goals(m, peer)):
        per_round = f"{statistics.median(r[j] for r in paired):.2f}" if paired else ""
        lines.append(f"| {g}: {how} | {val:.2f} | {per_round} | ≤ {lim} | {'yes' if met else 'no'} |")
    return "\n".join(lines)


def machine() -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return (f"{cpu or platform.processor()}, {os.cpu_count()} CPUs, Linux {platform.release()}, "
            f"Python {platform.python_version()} ({PY})")


def imports(w: World) -> str:
    """`-X importtime` of the hook for a void and a GPU request: the modules it loads, by self time."""
    out = []
    for label, env in (("void", ()), ("GPU, 4 GPUs, small image", GPU_ENV)):
        with _stand_in(w, "small") as (base, root, proc):
            bundle = base / "bundle"
            make_bundle(bundle, root, env=env)
            r = subprocess.run([PY, "-X", "importtime"] + HOOK_ARGS[1:], input=_state(w, proc, bundle),
                               capture_output=True, env=w.hook_env(4, True))
        rows = []
        for line in r.stderr.decode().splitlines():
            if not line.startswith("import time:") or "self [us]" in line:
                continue
            _, rest = line.split(":", 1)
            self_us, _cum, name = (x.strip() for x in rest.split("|"))
            rows.append((int(self_us), name.strip()))
        total = sum(s for s, _ in rows)
        out.append(f"{label}: {len(rows)} modules, {total / 1000:.1f} ms of imports (self times summed)")
        for s, name in sorted(rows, reverse=True)[:15]:
            out.append(f"  {s / 1000:6.2f} ms  {name}")
        ours = sorted(name for _, name in rows if name.startswith("pyxis_hook"))
        out.append(f"  imported, ours ({len(ours)}): {' '.join(n[len('pyxis_hook.'):] or n for n in ours)}")
        # what runs from the start image's sections, which -X importtime does not see: the boot section (the
        # dispatch and the no-GPU check, every start) and, past the no-GPU exit, the start section
        for what, section in (("the boot section", "boot"), ("the start section", "start")) if env else (
                ("the boot section", "boot"),):
            held = subprocess.run([PY, "-I", "-S", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                                   "from pyxis_hook import startimage; "
                                   "print(*startimage.held(section=sys.argv[2]))", str(REPO), section],
                                  capture_output=True, text=True).stdout.split()
            out.append(f"  from {what} ({len(held)}): {' '.join(held)}")
    return "\n".join(out)


#: set in the re-run of `--mounts N` inside its private mount namespace
_MOUNTS_DONE = "PYXIS_BENCH_MOUNTS"


def busy_node(n: int) -> None:
    """N tmpfs mounts in this (private) mount namespace, under a temp dir, by mount(2) directly (seconds, not minutes)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    base = Path(tempfile.mkdtemp(prefix="pyxis-bench-mounts-"))
    for i in range(n):
        d = base / f"pod-{i:05d}" / "volumes" / "kube-api-access"
        d.mkdir(parents=True)
        if libc.mount(b"tmpfs", str(d).encode(), b"tmpfs", 0, b"size=64k") != 0:
            raise OSError(ctypes.get_errno(), f"mount tmpfs on {d}")
    print(f"{n} tmpfs mounts under {base} (this mount namespace only)", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="pyxis-hook speed targets and its cost beside runc and ldconfig")
    ap.add_argument("--peer", metavar="PATH", help="an nvidia-container-cli binary to time interleaved")
    ap.add_argument("--rounds", type=int, default=11, help="runs of each case (median); default 11")
    ap.add_argument("--work", metavar="DIR", help="where to build the fixtures (default: a temp dir, removed)")
    ap.add_argument("--imports", action="store_true", help="also show -X importtime of the hook")
    ap.add_argument("--only", metavar="TEXT", action="append", help="run only cases whose name contains TEXT")
    ap.add_argument("--mounts", type=int, default=0, metavar="N",
                    help="run on a node with N more mounts (a Kubernetes node's pods have thousands): every case "
                         "runs in a private mount namespace holding N tmpfs mounts")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        ap.error("needs root (overlay mounts, device nodes, runc)")
    if args.mounts and os.environ.get(_MOUNTS_DONE) != str(args.mounts):
        # again, in a private mount namespace: the N mounts are made there, and the containers'
        # namespaces (copies of it) hold them too, as on a busy node
        again = sys.argv[1:] if argv is None else argv
        return subprocess.run(["unshare", "-m", "--propagation", "private", PY, __file__, *again],
                              env=dict(os.environ, **{_MOUNTS_DONE: str(args.mounts)})).returncode
    if args.mounts:
        busy_node(args.mounts)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="pyxis-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        w = World(work, args.peer)
        print(f"fixtures built in {time.perf_counter() - t0:.1f} s under {work}", file=sys.stderr)
        all_cases = cases(w)
        if args.only:
            keep = {"bare python -I -S", "hook, 4 GPUs, small", "hook, 1 GPUs, small", "launcher, 4 GPUs, small"}
            all_cases = {k: v for k, v in all_cases.items() if k in keep or any(o in k for o in args.only)}
        # warm-up, twice: the first start of a host builds its node artifact, the next writes the start
        # image, so every timed start is a steady one (page cache filled too)
        for _ in range(2):
            for fn in all_cases.values():
                fn()
        times: dict[str, list[float]] = {k: [] for k in all_cases}
        rng = random.Random(7)
        for i in range(args.rounds):
            order = list(all_cases)
            rng.shuffle(order)
            for k in order:
                times[k].append(all_cases[k]())
            print(f"round {i + 1}/{args.rounds}", file=sys.stderr)
        med = {k: statistics.median(v) for k, v in times.items()}
        spread = {}
        for k, v in times.items():
            q = statistics.quantiles(v, n=4) if len(v) >= 2 else [v[0]] * 3
            spread[k] = (q[2] - q[0]) / 2
        print(f"command: python bench/run.py{' --peer ' + args.peer if args.peer else ''} --rounds {args.rounds}"
              f"{f' --mounts {args.mounts}' if args.mounts else ''}")
        print(f"machine: {machine()}")
        print(f"medians of {args.rounds} interleaved runs; baseline: "
              + ("nvidia-container-cli (--peer), " if args.peer else "no nvidia-container-cli given: glibc's ldconfig "
                 "-r and the bare interpreter, ")
              + "runc run without the hook\n")
        if all(k in med for k in ("hook, 4 GPUs, small", "hook, 4 GPUs, 5k", "hook, 64 GPUs, small",
                                   "hook, 1 GPUs, small", "hook, no GPU asked (void), small",
                                   "ldconfig -r, small image")):
            print(render(med, spread, args.rounds, bool(args.peer), times))
        else:
            for k, v in med.items():
                print(f"{k}: {v * 1e3:.1f} ms")
        if args.imports:
            print()
            print(imports(w))
    finally:
        ov = work / "ov"
        if ov.exists():
            for d in ov.iterdir():
                subprocess.run(["umount", "-l", str(d / "mnt")], capture_output=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
