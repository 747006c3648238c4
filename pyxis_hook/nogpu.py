"""Whether a container asks for a GPU at all: the one rule, importing nothing.

The hook's early exit (`start.first_look`) decides with it
before any other module is loaded (so such a start costs little more than
a bare interpreter: docs/decisions/2026-12-07-start-costs.md), and
`request.void_request` gives the full path the same answer with its reason, so the two can never
disagree.  NVIDIA's rules (nvidia-container-toolkit
`internal/config/image/cuda_image.go`): NVIDIA_VISIBLE_DEVICES unset
means no GPU unless the image is a legacy CUDA image (CUDA_VERSION without
NVIDIA_REQUIRE_CUDA); empty, or any token `void`, means no GPU.
"""

VISIBLE = "NVIDIA_VISIBLE_DEVICES"


def split_tokens(value: str) -> list[str]:
    """NCT's list split: on ',', whitespace trimmed, empty tokens dropped."""
    return [t.strip() for t in value.split(",") if t.strip()]


def is_legacy(env) -> bool:
    """A legacy CUDA image: CUDA_VERSION set and NVIDIA_REQUIRE_CUDA unset or empty (NCT `IsLegacy`)."""
    return bool(env.get("CUDA_VERSION", "")) and not env.get("NVIDIA_REQUIRE_CUDA", "")


def void_reason(env) -> "str | None":
    """Why the container asks for no GPU (one line), or None when it may ask for one."""
    raw = env.get(VISIBLE)
    if raw is None and is_legacy(env):
        return None
    tokens = split_tokens(raw or "")
    if not tokens:
        return f"{VISIBLE} is {'unset' if raw is None else 'empty'}: not a GPU container, nothing is injected"
    if "void" in tokens:
        return f"{VISIBLE}={raw}: 'void': not a GPU container, nothing is injected"
    return None

