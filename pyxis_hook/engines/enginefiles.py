"""What `pyxis-hook install ENGINE` writes, as data: one table per fact (docs/design.md, "Installing").

`ENGINE_ROLES`: the files each engine's install writes, by role; `ROLE_FILES`:
where each role's file lives and its mode; `commands/install.py` asks
`engines/filetexts.py` for each role's content.  Every path is the node's
(`--root DIR` puts DIR in front).
"""

from __future__ import annotations

from pyxis_hook.engines.launcher import LAUNCHER

ENGINES = ("podman", "cri-o", "enroot", "containerd", "apptainer")
CONF = "/etc/pyxis-hook/pyxis.conf"
#: the one hooks.d directory podman 4 and CRI-O read in their stock configuration (docs/podman.md)
HOOKS_D = "/usr/share/containers/oci/hooks.d"
ENROOT_HOOKS_D = "/etc/enroot/hooks.d"
CDI_SPEC = "/etc/cdi/pyxis-hook.json"
UNIT_DIR = "/etc/systemd/system"
CDI_SERVICE = "pyxis-hook-cdi.service"
CDI_PATH_UNIT = "pyxis-hook-cdi.path"
CONTAINERD_CONFIG = "/etc/containerd/config.toml"
#: install's own record of what it wrote and what was there before (for uninstall)
STATE_DIR = "/var/lib/pyxis-hook"

#: role -> (node path, mode; 0 for a symbolic link)
ROLE_FILES: dict[str, tuple[str, int]] = {
    "launcher": (LAUNCHER, 0o755),
    "conf": (CONF, 0o644),
    "hooks-json": (f"{HOOKS_D}/pyxis-hook.json", 0o644),
    "enroot-shim": (f"{ENROOT_HOOKS_D}/98-pyxis-hook.sh", 0o755),
    "enroot-nvidia": (f"{ENROOT_HOOKS_D}/98-nvidia.sh", 0o755),
    "cdi-spec": (CDI_SPEC, 0o644),
    "cdi-spec-nohooks": (CDI_SPEC, 0o644),
    "cdi-service": (f"{UNIT_DIR}/{CDI_SERVICE}", 0o644),
    "cdi-path": (f"{UNIT_DIR}/{CDI_PATH_UNIT}", 0o644),
    "cdi-service-wants": (f"{UNIT_DIR}/multi-user.target.wants/{CDI_SERVICE}", 0),
    "cdi-path-wants": (f"{UNIT_DIR}/paths.target.wants/{CDI_PATH_UNIT}", 0),
    "containerd-config": (CONTAINERD_CONFIG, 0o644),
}

_CDI = ("cdi-spec", "cdi-service", "cdi-path", "cdi-service-wants", "cdi-path-wants")
#: engine -> roles its install writes (besides the launcher and pyxis.conf, which every engine's does)
ENGINE_ROLES: dict[str, tuple[str, ...]] = {
    "podman": ("hooks-json",),
    "cri-o": ("hooks-json", *_CDI),
    "containerd": (*_CDI, "containerd-config"),
    "enroot": ("enroot-shim", "enroot-nvidia"),
    "apptainer": ("cdi-spec-nohooks", *_CDI[1:]),
}
COMMON_ROLES = ("launcher", "conf")
#: roles whose file is rewritten after install by something else (the CDI unit): removed at uninstall as is
REGENERATED = frozenset({"cdi-spec", "cdi-spec-nohooks"})
#: roles that edit a file the node already has (nothing is written when it is absent)
EDITS = frozenset({"enroot-nvidia"})


def roles(engine: str) -> tuple[str, ...]:
    """Every role `install engine` writes, in the order they are written (the launcher first)."""
    return COMMON_ROLES + ENGINE_ROLES[engine]
