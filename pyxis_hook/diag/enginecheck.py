"""Doctor's checks of what `pyxis-hook install ENGINE` wrote: the launcher and enroot's hooks.d.

Every registration names the launcher (engines/launcher.py); an upgrade that
moves the interpreter or the package leaves it naming paths that are gone,
and every GPU start fails until `pyxis-hook install ENGINE` rewrites it.
"""

from __future__ import annotations

import os

from pyxis_hook.diag.findings import Finding
from pyxis_hook.engines import enginefiles as ef
from pyxis_hook.engines.launcher import LAUNCHER, parse_launcher


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 16)
    except OSError:
        return None


def check_launcher(root: str = "/") -> list[Finding]:
    """The launcher, when there is one: the interpreter and package it names still exist."""
    text = _read(os.path.join(root, LAUNCHER.lstrip("/")))
    if text is None:
        return []
    got = parse_launcher(text)
    if got is None:
        return [Finding("warning", "launcher-foreign", f"{LAUNCHER} is not a launcher pyxis-hook wrote",
                        "every registration runs it", "pyxis-hook install ENGINE (for each engine in use)")]
    gone = [p for p in got if not os.path.exists(os.path.join(root, p.lstrip("/")))]
    if gone:
        return [Finding("error", "registration-stale", f"{LAUNCHER} names {', '.join(gone)}, which is gone "
                        "(an interpreter or package upgrade)", "every GPU container start through it fails",
                        "pyxis-hook install ENGINE (for each engine in use), with the upgraded install")]
    return [Finding("ok", "launcher", f"{LAUNCHER} runs {got[1]} with {got[0]}")]


def check_enroot(root: str = "/") -> list[Finding]:
    """On a node with enroot: our shim present and executable, NVIDIA's hook disabled, Pyxis in plugstack."""
    from pyxis_hook.engines.filetexts import is_nvidia_stub

    hooks = os.path.join(root, ef.ENROOT_HOOKS_D.lstrip("/"))
    if not os.path.isdir(hooks):
        return []
    out = []
    shim = os.path.join(hooks, "98-pyxis-hook.sh")
    if not os.access(shim, os.X_OK):
        out.append(Finding("warning", "enroot-hook-missing", f"{shim} is missing or not executable",
                           "enroot/Pyxis containers get no GPU from pyxis-hook", "pyxis-hook install enroot"))
    else:
        out.append(Finding("ok", "enroot-hook", f"{shim} installed"))
    nv = os.path.join(hooks, "98-nvidia.sh")
    text = _read(nv)
    if text is not None and not is_nvidia_stub(text) and os.access(nv, os.X_OK):
        out.append(Finding("warning", "enroot-nvidia-hook-active", f"{nv} is NVIDIA's hook, still active",
                           "it runs nvidia-container-cli beside pyxis-hook (or fails without it)",
                           "pyxis-hook install enroot (disables it so that an enroot upgrade keeps it disabled)"))
    plug = [os.path.join(root, "etc/slurm/plugstack.conf")]
    d = os.path.join(root, "etc/slurm/plugstack.conf.d")
    plug += sorted(os.path.join(d, n) for n in (os.listdir(d) if os.path.isdir(d) else ()))
    if os.path.isdir(os.path.join(root, "etc/slurm")) and not any("spank_pyxis.so" in (_read(p) or "") for p in plug):
        out.append(Finding("info", "pyxis-plugstack", "no spank_pyxis.so line in plugstack.conf(.d)",
                           "srun --container-image needs Pyxis's SPANK plugin",
                           "add `required spank_pyxis.so` to /etc/slurm/plugstack.conf.d/pyxis.conf"))
    return out
