"""How the request reads a container's env beyond one variable: a family by prefix, MIG UUID tokens.

Not in `nogpu.py`: the no-GPU exit imports that module on every container
start, and none of this is needed there.
"""

from pyxis_hook.nogpu import VISIBLE, split_tokens


def is_mig_uuid(token: str) -> bool:
    """A MIG device's UUID (`MIG-...`, any case), as a token of NVIDIA_VISIBLE_DEVICES names one."""
    return token[:4].upper() == "MIG-"


def names_mig_uuid(env) -> bool:
    """True when NVIDIA_VISIBLE_DEVICES names a MIG device by UUID: only NVML knows those."""
    return any(is_mig_uuid(t) for t in split_tokens(env.get(VISIBLE, "")))


def prefixed(env, prefix: str) -> dict[str, str]:
    """The variables of `env` whose name starts with `prefix`.

    The one way the request reads a family of variables (NVIDIA_REQUIRE_*,
    LSF's CUDA_VISIBLE_DEVICES<N>).
    """
    return {k: v for k, v in env.items() if k.startswith(prefix)}
