"""Doctor's checks of how pyxis-hook itself is installed: its hooks.d file, its command, its start images.

`doctor.run_checks` runs them with the host checks; they look at this
installation (the interpreter, the package's files, the command on the
search path) rather than at the driver or the node.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

from pyxis_hook.diag.doctorenv import DoctorEnv
from pyxis_hook.diag.findings import Finding


def _strs(value) -> list[str]:
    """A hooks.d `args`/`env` as a list of strings; anything else (a foreign file's `1`) as []."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _main_file(hook: dict) -> str | None:
    """The pyxis_hook/__main__.py a hook runs (`python -I -S .../__main__.py`), realpath'd; None for `-m`."""
    for a in _strs(hook.get("args")):
        if a.endswith("pyxis_hook/__main__.py"):
            return os.path.realpath(a)
    return None


def _runs_pyxis_hook(hook: dict) -> bool:
    args = _strs(hook.get("args"))
    return ("pyxis_hook" in args or _main_file(hook) is not None
            or os.path.basename(str(hook.get("path", ""))) == "pyxis-hook")


def check_hooks_d(config, env: DoctorEnv) -> list[Finding]:
    """The oci-hooks file podman/CRI-O read: present, and running this install with this config."""
    from pyxis_hook.engines.hookd import CONFIG_ENV, base_argv, config_path, interpreter

    python = env.python or interpreter()
    want_conf = config_path(config)
    this_main = os.path.realpath(base_argv(python)[-1])
    found = []
    for d in env.hooks_dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if not name.endswith(".json"):
                continue
            p = os.path.join(d, name)
            try:
                with open(p, encoding="utf-8") as f:
                    doc = json.load(f)
            except (OSError, ValueError):
                continue
            hook = doc.get("hook") if isinstance(doc, dict) else None
            if isinstance(hook, dict) and _runs_pyxis_hook(hook):
                found.append((p, hook))
    if not found:
        return [Finding("warning", "hook-not-installed", f"no pyxis-hook file in {' or '.join(env.hooks_dirs)}",
                        "podman and CRI-O run only hooks listed there (plain runc and enroot users can ignore this)",
                        f"pyxis-hook hookd --install {env.hooks_dirs[-1]}")]
    out = []
    for p, hook in found:
        path = str(hook.get("path", ""))
        conf = next((e.split("=", 1)[1] for e in _strs(hook.get("env")) if e.startswith(CONFIG_ENV + "=")), None)
        if not os.access(path, os.X_OK):
            out.append(Finding("error", "hook-path-missing", f"{p}: hook path {path} is not an executable file",
                               "the engine fails every container start with this hook", "pyxis-hook hookd --install "
                               + os.path.dirname(p)))
        elif os.path.realpath(path) != os.path.realpath(python) or _main_file(hook) not in (None, this_main):
            out.append(Finding("warning", "hook-other-install", f"{p} runs {path}, not this install's {python}",
                               "containers get another pyxis-hook (version, configuration) than the one checked here",
                               "pyxis-hook hookd --install " + os.path.dirname(p)))
        elif want_conf and (os.path.abspath(conf) if conf else None) != want_conf:
            out.append(Finding("warning", "hook-other-config", f"{p} uses configuration {conf or 'the default'}, "
                               f"not {want_conf}", "the hook would read another pyxis.conf than this check",
                               "pyxis-hook --config " + want_conf + " hookd --install " + os.path.dirname(p)))
        else:
            out.append(Finding("ok", "hook-installed", f"{p} runs this install ({path})"))
    return out


def check_command(config, env: DoctorEnv) -> list[Finding]:
    """Whether the `pyxis-hook` command runs without Python's site scan: the one on the search path, and
    the one running doctor (`env.command`).

    pip drops the flags of the command's first line; its first run by its
    owner puts `-IS` back (engines/command.py).  Only a hook registered by
    that name, by hand, is concerned: `hookd --install` and `enroot
    --install` write the interpreter and flags themselves.
    """
    from pyxis_hook.engines import command

    search = ":".join(env.search_path if env.search_path is not None else config.path)
    found = [env.command] if env.command else []
    found.append(shutil.which("pyxis-hook", path=search) or "")
    out: list[Finding] = []
    seen: set[str] = set()
    for exe in found:
        if not exe or os.path.realpath(exe) in seen:
            continue
        seen.add(os.path.realpath(exe))
        why, real, _ = command.why_not(exe, parent=env.package)
        if why == "fast":
            out.append(Finding("ok", "command", f"{exe}: runs without Python's site scan (-IS)"))
        elif not why:
            out.append(Finding("info", "command-pending", f"{exe}: runs Python's site scan until its next run",
                               "its next run by its owner rewrites its first line to skip it", "nothing to do"))
        else:
            out.append(Finding("info", "command-site-scan", f"{why}: the command keeps pip's form and runs "
                               "Python's site scan on every run",
                               "a hook registered by this name pays ~3 ms more per container start than the "
                               "forms `hookd --install` and `enroot --install` write",
                               f"register the hook with `pyxis-hook hookd --install DIR`, or make {real} and "
                               "its directory its owner's alone and run it once as that user"))
    return out


def check_start_images() -> list[Finding]:
    """`check_start_image` for each kind of start's image that exists, or the runtime's when none does.

    A node whose containers start only through enroot (Pyxis) or CDI has no
    `prestart` image and never will: that is not a pending one.  Each kind's
    planner tier (`-plan`) is checked where it exists: it appears after a
    start that had to plan, and a node whose starts all take their plan from
    the decision cache never needs it; so is its boot tier (`-boot`: what
    its start imports before its image), which the start that wrote the
    image wrote too.
    """
    from pyxis_hook import startimage

    paths = [startimage.image_path(entry) for entry in startimage.ENTRIES]
    present = [p for p in paths if os.path.lexists(p)]
    tiers = [t for e in startimage.ENTRIES for tier in ("plan", startimage.BOOT)
             if os.path.lexists(t := startimage.image_path(e, tier))]
    return [f for p in (present or paths[:1]) + tiers for f in check_start_image(p)]


def check_start_image(path: str = "") -> list[Finding]:
    """Whether GPU starts run their modules from the start image (pyxis_hook/startimage.py) or import them."""
    from pyxis_hook import startimage

    path = path or startimage.image_path()
    count, why = startimage.state(path)
    if not why:
        return [Finding("ok", "start-image", f"start image {path}: current, {count} modules")]
    if startimage.writable(path):
        return [Finding("info", "start-image-pending", f"start image {path}: not used now ({why})",
                        "a GPU start imports its modules one by one until the image is (re)written",
                        "nothing to do: the next GPU start that needs no snapshot rebuild writes it")]
    return [Finding("warning" if os.geteuid() == 0 else "info", "start-image-unwritable",
                    f"start image {path}: not used ({why}) and not written: its directory is not writable "
                    "by this user, or is another user's or writable by others (no start would trust what was "
                    "written there), or Python runs with -B",
                    "every GPU start then imports its ~50 modules through the import system, ~14% of a start",
                    "run one GPU container start as root after installing or upgrading (the image is written "
                    "beside the package's bytecode), or install the package in a directory root owns and "
                    "only root may write")]


def running_command() -> str | None:
    """The `pyxis-hook` script this process runs (its basename), or None (`python -m pyxis_hook`, tests)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 if os.path.basename(argv0) == "pyxis-hook" and os.path.isfile(argv0) else None
