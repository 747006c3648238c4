"""Doctor's checks of how pyxis-hook itself is installed: its hooks.d file, its node artifact, its start image.

`doctor.run_checks` runs them with the host checks; they probe this
installation (the interpreter, the package's files, the command on the
search path) rather than at the driver or the node.
"""

from __future__ import annotations

import json
import os
import sys

from pyxis_hook.diag.doctorenv import DEFAULT_HOOKS_DIRS, DoctorEnv
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


def _runs(hook: dict) -> tuple[str, str | None, bool]:
    """(interpreter, realpath'd pyxis_hook/__main__.py or None, through a launcher) of a hook: the launcher
    `pyxis-hook install` registers names both; a direct registration runs its path."""
    from pyxis_hook.engines.launcher import parse_launcher

    path = str(hook.get("path", ""))
    try:
        with open(path, "rb") as f:
            named = parse_launcher(f.read(4096).decode("utf-8", "replace"))
    except OSError:
        named = None
    if named is not None:
        return named[0], os.path.realpath(named[1]), True
    return path, _main_file(hook), False


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
        import shutil

        if env.hooks_dirs == DEFAULT_HOOKS_DIRS and not any(shutil.which(p) for p in ("podman", "crio")):
            return []  # neither engine here (an enroot/Pyxis node): enginecheck looks at what it uses
        return [Finding("warning", "hook-not-installed", f"no pyxis-hook file in {' or '.join(env.hooks_dirs)}",
                        "podman and CRI-O run only hooks listed there (plain runc and enroot users can ignore this)",
                        "pyxis-hook install podman (or: install cri-o)")]
    out = []
    for p, hook in found:
        path = str(hook.get("path", ""))
        conf = next((e.split("=", 1)[1] for e in _strs(hook.get("env")) if e.startswith(CONFIG_ENV + "=")), None)
        if not os.access(path, os.X_OK):
            out.append(Finding("error", "hook-path-missing", f"{p}: hook path {path} is not an executable file",
                               "the engine fails every container start with this hook", "pyxis-hook hookd --install "
                               + os.path.dirname(p)))
            continue
        runs, main, launched = _runs(hook)
        again = "install podman (or: install cri-o)" if launched else "hookd --install " + os.path.dirname(p)
        if os.path.realpath(runs) != os.path.realpath(python) or main not in (None, this_main):
            out.append(Finding("warning", "hook-other-install", f"{p} runs {runs}, not this install's {python}",
                               "containers get another pyxis-hook (version, configuration) than the one checked here",
                               "pyxis-hook " + again))
        elif want_conf and (os.path.abspath(conf) if conf else None) != want_conf:
            out.append(Finding("warning", "hook-other-config", f"{p} uses configuration {conf or 'the default'}, "
                               f"not {want_conf}", "the hook would read another pyxis.conf than this check",
                               f"pyxis-hook --config {want_conf} {again}"))
        else:
            out.append(Finding("ok", "hook-installed", f"{p} runs this install ({path})"))
    return out


def check_node_artifact(config) -> list[Finding]:
    """Whether the node artifact (`host/artifact.py`) is trusted and fresh: what every start then reads."""
    from pyxis_hook import trust
    from pyxis_hook.errors import ArtifactError
    from pyxis_hook.host import artifact

    path = artifact.artifact_path(config)
    try:
        artifact.load(config)
    except ArtifactError as e:
        fix = ("run `pyxis-hook refresh` as root (after each driver upgrade, e.g. from a boot unit); "
               "the next root start rebuilds it too")
        return [Finding("warning" if trust.may_write() else "info", "node-artifact",
                        f"node artifact not used: {e}",
                        "a start that cannot use it reads every driver library to discover the driver, several "
                        "times the cost of a start; ordinary users' starts cannot rebuild it", fix)]
    return [Finding("ok", "node-artifact", f"node artifact {path}: trusted and fresh")]


def check_start_image(path: str = "") -> list[Finding]:
    """Whether container starts run their modules from the start image (pyxis_hook/startimage.py) or import them."""
    from pyxis_hook import startimage, trust

    path = path or startimage.image_path()
    count, why = startimage.state(path)
    if not why:
        return [Finding("ok", "start-image", f"start image {path}: current, {count} modules")]
    if startimage.writable(path):
        return [Finding("info", "start-image-pending", f"start image {path}: not used now ({why})",
                        "a GPU start imports its modules one by one until the image is (re)written",
                        "nothing to do: the next GPU start as the package's owner writes it")]
    # a warning for the package's owner only, whose starts would write it (as for the node artifact)
    return [Finding("warning" if trust.may_write() else "info", "start-image-unwritable",
                    f"start image {path}: not used ({why}) and not written: only the package's owner writes it, "
                    "in a directory nobody else may write, and not under python -B",
                    "every GPU start then imports its modules through the import system",
                    "run one GPU container start as root after installing or upgrading (the image is written "
                    "beside the package's bytecode), or install the package in a directory root owns and "
                    "only root may write")]


def running_command() -> str | None:
    """The `pyxis-hook` script this process runs (its basename), or None (`python -m pyxis_hook`, tests)."""
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 if os.path.basename(argv0) == "pyxis-hook" and os.path.isfile(argv0) else None
