"""How the request reads a container's env beyond one variable: a family by prefix, MIG UUID tokens.

Not in `asks.py`: the no-GPU exit imports that module on every container
start, and none of this is needed there.
"""

from pyxis_hook.asks import VISIBLE, split_tokens


def is_mig_uuid(token: str) -> bool:
    """A MIG device's UUID (`MIG-...`, any case), as a token of NVIDIA_VISIBLE_DEVICES names one."""
    return token[:4].upper() == "MIG-"


def names_mig_uuid(env) -> bool:
    """True when NVIDIA_VISIBLE_DEVICES names a MIG device by UUID: only NVML knows those."""
    return any(is_mig_uuid(t) for t in split_tokens(env.get(VISIBLE, "")))


def reads_gpu_file(env) -> bool:
    """True when the allocation may come from Torque's GPU file (PBS_GPUFILE without CUDA_VISIBLE_DEVICES).

    Its lines are not in the env, so a decision kept over what the request
    read of the env cannot tell another file's: such a start is never cached.
    """
    return bool(env.get("PBS_GPUFILE")) and env.get("CUDA_VISIBLE_DEVICES") is None


def prefixed(env, prefix: str) -> dict[str, str]:
    """The variables of `env` whose name starts with `prefix`.

    The one way the request reads a family of variables (NVIDIA_REQUIRE_*,
    LSF's CUDA_VISIBLE_DEVICES<N>): an env that records what a decision
    read (`plan.decisionkeep.ObservedEnv`) then records the family, not every
    variable of the container.
    """
    own = getattr(env, "prefixed", None)
    if own is not None:
        return own(prefix)
    return {k: v for k, v in env.items() if k.startswith(prefix)}
