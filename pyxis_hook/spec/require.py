"""NVIDIA_REQUIRE_* conditions: parse them like libnvidia-container, check them against the host.

CUDA images carry `NVIDIA_REQUIRE_CUDA="cuda>=12.2 brand=tesla,driver>=470,driver<471 …"`
so that a container refuses to start on a driver too old for its CUDA
runtime.  Users meet the failure message more often than any other, so it
keeps NCT's searchable text ("requirement error: unsatisfied condition: …")
and adds what the host actually has and how to override the check.

Grammar (LNC `src/cli/dsl.c`): within one value, spaces
separate OR-groups and commas separate AND-terms; a term is `name op value`
with name in cuda/driver/arch/brand (any case) and op one of
`= == != < <= > >=`.  Separate variables are ANDed.
"""

from __future__ import annotations


from pyxis_hook.spec.envreads import prefixed
from pyxis_hook.errors import RequirementError
# the driver versions' order, which NVIDIA_REQUIRE_* compares by too
from pyxis_hook.host.inventory import version_key
from pyxis_hook.record import record

#: typing.TYPE_CHECKING without importing typing, which the start path avoids (docs/decisions/2026-12-07-start-costs.md)
TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: typing is never imported at run time
    from typing import Mapping

KEYS = ("cuda", "driver", "arch", "brand")
OPERATORS = ("=", "==", "!=", "<", "<=", ">", ">=")
PREFIX = "NVIDIA_REQUIRE_"
DISABLE = "NVIDIA_DISABLE_REQUIRE"
OVERRIDE_HINT = f"set {DISABLE}=true in the container to skip this check"
_OP_CHARS = frozenset("<>=!")
_DIGITS = frozenset("0123456789")
# semver as Go's golang.org/x/mod/semver accepts it (NCT parseMajorMinorVersion)
_SEMVER = (r"^v?(0|[1-9][0-9]{0,8})(?:\.(0|[1-9][0-9]{0,8})(?:\.(0|[1-9][0-9]{0,8}))?)?"
           r"(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?$")


@record
class Term:
    """One `name op value` condition; `key` is lower case, `op` normalised (`==` -> `=`)."""

    key: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}{self.op}{self.value}"


@record
class Requirement:
    """One NVIDIA_REQUIRE_* variable (or the legacy CUDA_VERSION rule)."""

    #: the variable it came from (`CUDA_VERSION` for the legacy rule)
    variable: str
    expression: str
    #: OR of AND-groups
    groups: tuple[tuple[Term, ...], ...]


@record
class DeviceFacts:
    """Per-device values; None = unknown (procfs has neither), which passes like LNC's NULL."""

    arch: str | None = None
    brand: str | None = None


@record
class HostFacts:
    """What the requirements are checked against."""

    #: CUDA driver API version as `major.minor`, e.g. "12.2"; None = unknown
    cuda: str | None
    #: kernel driver version, e.g. "550.54.14"; None = unknown
    driver: str | None
    #: one entry per selected GPU/MIG device; empty = no device selected
    devices: tuple[DeviceFacts, ...] = ()


def parse_bool(value: str) -> bool:
    """Go's strconv.ParseBool, with errors read as false (NCT `HasDisableRequire`)."""
    return value in ("1", "t", "T", "TRUE", "true", "True")


def requirements_disabled(env: Mapping[str, str], config_disable: bool = False) -> bool:
    return config_disable or parse_bool(env.get(DISABLE, ""))


def legacy_cuda_version(env: Mapping[str, str]) -> str | None:
    """`major.minor` of CUDA_VERSION when the image is *legacy*, else None.

    Legacy = CUDA_VERSION non-empty and NVIDIA_REQUIRE_CUDA unset or empty
    (NCT `IsLegacy`).  An unparsable CUDA_VERSION then fails, as in NCT.
    """
    cuda_version = env.get("CUDA_VERSION", "")
    if not cuda_version or env.get("NVIDIA_REQUIRE_CUDA", ""):
        return None
    import re  # only for a legacy image (CUDA_VERSION without NVIDIA_REQUIRE_CUDA)

    m = re.match(_SEMVER, cuda_version)
    if not m:
        raise RequirementError(f"CUDA_VERSION={cuda_version!r}: invalid version string (expected e.g. 12.2.0)")
    return f"{m.group(1)}.{m.group(2) or 0}"


def _invalid(variable: str, expression: str, term: str, why: str) -> RequirementError:
    return RequirementError(
        f"requirement error: invalid expression: {variable}={expression!r}: term {term!r}: {why}"
    )


def is_dotted_number(value: str) -> bool:
    """`12`, `12.2`, `535.104.05`: ASCII digit runs of 1-9 (int() of a huge run would raise) joined by dots."""
    return all(0 < len(p) <= 9 and _DIGITS.issuperset(p) for p in value.split("."))


def _operator_span(text: str) -> tuple[int, int] | None:
    """Where the first run of operator characters (<, >, =, !) is in `text`."""
    start = next((i for i, c in enumerate(text) if c in _OP_CHARS), None)
    if start is None:
        return None
    end = start
    while end < len(text) and text[end] in _OP_CHARS:
        end += 1
    return start, end


def parse_term(text: str, variable: str = "NVIDIA_REQUIRE_*", expression: str = "") -> Term:
    # plain string code, not `re`, which the start path avoids (docs/decisions/2026-12-07-start-costs.md):
    # a CUDA image's NVIDIA_REQUIRE_CUDA is parsed on every start of it;
    # tests/unit/spec/test_parsers_vs_regex.py checks it against the regex
    span = _operator_span(text)
    if span is None:
        raise _invalid(variable, expression or text, text, "no operator (use one of = != < <= > >=)")
    key, op, value = text[: span[0]].lower(), text[span[0]:span[1]], text[span[1]:]
    if key not in KEYS:
        raise _invalid(variable, expression or text, text, f"unknown name {text[: span[0]]!r} "
                       f"(known: {', '.join(KEYS)})")
    if op not in OPERATORS:
        raise _invalid(variable, expression or text, text, f"unknown operator {op!r}")
    if not value:
        raise _invalid(variable, expression or text, text, "empty value")
    op = "=" if op == "==" else op
    if key == "brand":
        if op not in ("=", "!="):
            raise _invalid(variable, expression or text, text, "brand only supports = and !=")
    elif not is_dotted_number(value):
        raise _invalid(variable, expression or text, text, f"{value!r} is not a dotted number")
    return Term(key, op, value)


def parse_expression(expression: str, variable: str = "NVIDIA_REQUIRE_*") -> Requirement:
    """Split one value into OR-groups (spaces) of AND-terms (commas); empties are skipped."""
    groups = []
    for group in expression.split(" "):
        terms = tuple(parse_term(t, variable, expression) for t in group.split(",") if t)
        if terms:
            groups.append(terms)
    return Requirement(variable, expression, tuple(groups))


def parse_requirements(env: Mapping[str, str], config_disable: bool = False) -> tuple[Requirement, ...]:
    """All requirements of a container env, sorted by variable name; () when disabled.

    Every `NVIDIA_REQUIRE_*` except `NVIDIA_REQUIRE_JETPACK*` counts; a legacy
    image adds `cuda>=<CUDA_VERSION major.minor>`.  An empty value is no
    requirement (design: LNC would evaluate nothing).  When disabled nothing is
    parsed, so a broken expression cannot fail a container that opted out.
    """
    if requirements_disabled(env, config_disable):
        return ()
    result = []
    for name, value in sorted(prefixed(env, PREFIX).items()):
        if not name.startswith("NVIDIA_REQUIRE_JETPACK"):
            req = parse_expression(value, name)
            if req.groups:
                result.append(req)
    legacy = legacy_cuda_version(env)
    if legacy is not None:
        result.append(parse_expression(f"cuda>={legacy}", "CUDA_VERSION"))
    return tuple(result)


def compare_versions(a: str, b: str) -> int:
    ka, kb = version_key(a), version_key(b)
    width = max(len(ka), len(kb))
    ka += (0,) * (width - len(ka))
    kb += (0,) * (width - len(kb))
    return (ka > kb) - (ka < kb)


def _holds(op: str, cmp: int) -> bool:
    return {"=": cmp == 0, "!=": cmp != 0, "<": cmp < 0, "<=": cmp <= 0, ">": cmp > 0, ">=": cmp >= 0}[op]


def term_holds(term: Term, host: HostFacts, device: DeviceFacts | None) -> bool:
    """True when the term holds; a host value we do not know passes (LNC's NULL rule)."""
    if term.key in ("cuda", "driver"):
        actual = host.cuda if term.key == "cuda" else host.driver
    elif device is None:
        return True
    else:
        actual = device.arch if term.key == "arch" else device.brand
    if actual is None:
        return True
    if term.key == "brand":
        same = actual.lower() == term.value.lower()
        return same if term.op == "=" else not same
    if not is_dotted_number(actual):
        return True  # an unparsable host value is as good as unknown
    return _holds(term.op, compare_versions(actual, term.value))


def requirement_holds(req: Requirement, host: HostFacts, device: DeviceFacts | None) -> bool:
    return any(all(term_holds(t, host, device) for t in group) for group in req.groups)


def describe_host(host: HostFacts) -> str:
    cuda = host.cuda or "unknown"
    driver = host.driver or "unknown"
    return f"host has cuda {cuda}, driver {driver}"


def failure_message(req: Requirement, host: HostFacts) -> str:
    """NCT's wording, then the host's values and the override (one line)."""
    first = next((t for t in req.expression.split(" ") if t), req.expression)
    msg = f"requirement error: unsatisfied condition: {first}"
    if first.startswith("cuda>="):
        msg += ", please update your driver to a newer version, or use an earlier cuda container"
    return f"{msg} ({req.variable}; {describe_host(host)}; {OVERRIDE_HINT})"


def check_requirements(reqs: tuple[Requirement, ...], host_facts: HostFacts) -> None:
    """Raise RequirementError for the first requirement some selected device does not meet.

    Evaluated once per selected device, or once with none (then `arch` and
    `brand` pass), as LNC does.
    """
    devices: tuple[DeviceFacts | None, ...] = host_facts.devices or (None,)
    for req in reqs:
        for device in devices:
            if not requirement_holds(req, host_facts, device):
                raise RequirementError(failure_message(req, host_facts))
