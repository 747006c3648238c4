"""The embedded demo: a fake 4-GPU host, a driver tree, a small container, and the hook.

Builds everything under ./demo-out (or the directory given), shows
`pyxis-hook plan` for a container asking for GPUs 0 and 2, then — when run as
root with runc installed — starts that container with pyxis-hook as its
prestart hook and prints what the container sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from fixtures.container import make_bundle, make_rootfs  # noqa: E402
from fixtures.fakedriver import make_fake_driver  # noqa: E402
from fixtures.hosttree import fake_gpus, make_host_tree  # noqa: E402

VERSION = "535.216.03"
SCRIPT = ("echo '--- inside the container ---'; ls -l /dev | grep nvidia; echo; /usr/bin/gputest; echo; "
          "ldconfig -p | grep -E 'libcuda|libnvidia-ml'; echo; nvidia-smi; echo \"nvidia-smi exit code: $?\"")


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "demo-out").resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    print(f"building the demo in {out}")
    host = make_host_tree(out / "host", gpus=fake_gpus(4), driver_version=VERSION)
    driver = make_fake_driver(out / "driver", version=VERSION)
    conf = out / "pyxis.conf"
    conf.write_text(f'driver-root = "{driver}"\ndev-root = "{host.dev_root}"\nproc-root = "{host.proc_root}"\n'
                    f'snapshot-dir = "{out}/snapshot"\nlog-file = "{out}/hook.log"\nlog-level = "debug"\n')
    bundle = out / "bundle"
    make_rootfs(bundle / "rootfs")
    from pyxis_hook.engines.hookd import hook_argv, interpreter

    python = interpreter()  # not its realpath: a venv's python finds the venv's pyelftools

    hook = {"path": python, "args": hook_argv("prestart", python),
            "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin", f"PYXIS_HOOK_CONFIG={conf}"]}
    make_bundle(bundle, env=("NVIDIA_VISIBLE_DEVICES=0,2",), args=("/bin/sh", "-c", SCRIPT),
                hooks={"prestart": [hook]})
    cmd = [python, "-m", "pyxis_hook", "--config", str(conf), "plan", "--bundle", str(bundle)]
    print("\n$ " + " ".join(["pyxis-hook", "--config", str(conf), "plan", "--bundle", str(bundle)]))
    rc = subprocess.run(cmd).returncode
    if os.geteuid() != 0:
        print("\n(not root: the fake host has no device nodes, so the plan lists them as problems and the "
              "container is not started; run `sudo bash demo.sh` for the whole demo)")
        return 0
    if rc != 0:
        return rc
    if not shutil.which("runc"):
        print("\n(no runc: showing the plan only; install runc to start the container)")
        return 0
    print(f"\n$ cd {bundle} && runc run pyxis-demo")
    r = subprocess.run(["runc", "run", f"pyxis-demo-{os.getpid()}"], cwd=bundle, stdin=subprocess.DEVNULL)
    subprocess.run(["runc", "delete", "-f", f"pyxis-demo-{os.getpid()}"], capture_output=True)
    print(f"\nrunc exit code: {r.returncode}; hook log: {out}/hook.log")
    return r.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
