"""spec/require.py: NVIDIA_REQUIRE_* grammar and evaluation, NVIDIA_DISABLE_REQUIRE, legacy CUDA_VERSION."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pyxis_hook.errors import PyxisHookError, RequirementError
from pyxis_hook.nogpu import is_legacy
from pyxis_hook.spec.require import (
    DeviceFacts,
    HostFacts,
    Term,
    check_requirements,
    compare_versions,
    legacy_cuda_version,
    parse_bool,
    parse_expression,
    parse_requirements,
)

# Real NVIDIA_REQUIRE_CUDA values of NVIDIA's CUDA images (gitlab.com/nvidia/container-images/cuda,
# dist/<version>/<distro>/base/Dockerfile), as copied into public Dockerfiles.
CUDA_10_2 = ("cuda>=10.2 brand=tesla,driver>=396,driver<397 brand=tesla,driver>=410,driver<411 "
             "brand=tesla,driver>=418,driver<419 brand=tesla,driver>=440,driver<441")
CUDA_11_2 = "cuda>=11.2 brand=tesla,driver>=418,driver<419 brand=tesla,driver>=440,driver<441 driver>=450,driver<451"
CUDA_11_5 = "cuda>=11.5 brand=tesla,driver>=418,driver<419 brand=tesla,driver>=440,driver<441 driver>=450"
CUDA_11_6 = ("cuda>=11.6 brand=tesla,driver>=418,driver<419 brand=tesla,driver>=440,driver<441 "
             "brand=tesla,driver>=450,driver<451 brand=tesla,driver>=460,driver<461 brand=tesla,driver>=470,driver<471 "
             "brand=unknown,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 "
             "brand=nvidiartx,driver>=470,driver<471 brand=quadrortx,driver>=470,driver<471")
_BRANDS = ("tesla", "unknown", "nvidia", "nvidiartx", "geforce", "geforcertx", "quadro", "quadrortx",
           "titan", "titanrtx")
CUDA_12_2 = "cuda>=12.2 " + " ".join(
    f"brand={b},driver>={d},driver<{d + 1}" for d in (470, 525) for b in _BRANDS)
CUDA_12_1 = "cuda>=12.1 brand=tesla,driver>=450,driver<451 " + " ".join(
    f"brand={b},driver>={d},driver<{d + 1}" for d in (470, 525) for b in _BRANDS)


def host(cuda=None, driver=None, *devices):
    return HostFacts(cuda=cuda, driver=driver, devices=tuple(devices))


def check(expr, h):
    check_requirements((parse_expression(expr, "NVIDIA_REQUIRE_CUDA"),), h)


@pytest.mark.parametrize("expr", [CUDA_10_2, CUDA_11_2, CUDA_11_5, CUDA_11_6, CUDA_12_1, CUDA_12_2])
def test_real_image_strings_parse(expr):
    req = parse_expression(expr, "NVIDIA_REQUIRE_CUDA")
    assert req.groups[0] == (Term("cuda", ">=", expr.split()[0][6:]),)
    assert len(req.groups) == len(expr.split())
    for group in req.groups[1:]:
        assert {t.key for t in group} <= {"brand", "driver"}


@pytest.mark.parametrize(
    "expr, h, ok",
    [
        # new enough CUDA driver API: the first OR-group is enough
        (CUDA_12_2, host("12.4", "550.54.14"), True),
        (CUDA_12_2, host("12.2", "535.104.05"), True),
        # CUDA 12.0 host, driver 525: forward compat groups (brand unknown here => passes)
        (CUDA_12_2, host("12.0", "525.60.13"), True),
        (CUDA_12_2, host("12.0", "525.60.13", DeviceFacts(brand="GeForce")), True),
        (CUDA_12_2, host("12.0", "525.60.13", DeviceFacts(brand="Quadro")), True),
        (CUDA_12_2, host("12.0", "525.60.13", DeviceFacts(brand="Vapps")), False),
        (CUDA_12_2, host("11.4", "470.57.02", DeviceFacts(brand="Tesla")), True),
        (CUDA_12_2, host("11.8", "520.61.05"), False),
        (CUDA_12_1, host("11.0", "450.80.02", DeviceFacts(brand="Tesla")), True),
        (CUDA_12_1, host("11.0", "450.80.02", DeviceFacts(brand="GeForce")), False),
        (CUDA_11_2, host("11.0", "450.80.02"), True),  # "driver>=450,driver<451" without brand
        (CUDA_11_2, host("11.0", "455.23.05"), False),
        (CUDA_11_5, host("11.0", "455.23.05"), True),  # open-ended driver>=450
        (CUDA_11_5, host("10.2", "440.33.01", DeviceFacts(brand="tesla")), True),
        (CUDA_11_5, host("10.2", "440.33.01", DeviceFacts(brand="GeForce")), False),
        (CUDA_10_2, host("10.1", "418.87.00", DeviceFacts(brand="TESLA")), True),
        (CUDA_10_2, host("10.1", "430.50"), False),
        # every device must satisfy: one GeForce among Teslas fails
        (CUDA_10_2, host("10.1", "418.87.00", DeviceFacts(brand="Tesla"), DeviceFacts(brand="GeForce")), False),
        # unknown host values pass
        ("cuda>=99.0", host(None, "550.54.14"), True),
        ("driver>=999", host("12.4", None), True),
        # arch
        ("arch>=8.0", host("12.4", "550.54.14", DeviceFacts(arch="9.0")), True),
        ("arch>=8.0", host("12.4", "550.54.14", DeviceFacts(arch="7.5")), False),
        ("arch=8.0", host("12.4", "550.54.14"), True),  # no device: arch passes
        # dotted numeric comparison, trailing zeros ignored
        ("cuda=11", host("11.0", "1"), True),
        ("cuda==11.0", host("11", "1"), True),
        ("cuda!=11.0", host("11", "1"), False),
        ("cuda>11.10", host("11.9", "1"), False),  # numeric, not lexical
        ("cuda<11.10", host("11.9", "1"), True),
        ("driver<=550.54.14", host("12", "550.54.14"), True),
        ("driver>550.54.2", host("12", "550.54.14"), True),
        ("driver>550.54.14", host("12", "550.54.14"), False),
        ("CUDA>=12.0", host("12.4", "1"), True),  # names are case-insensitive
        ("brand!=geforce", host("12", "1", DeviceFacts(brand="GeForce")), False),
        # spaces: repeated and leading are empty groups; commas: empty terms skipped
        ("  cuda>=13.0   driver>=500,,  ", host("12.4", "550.54.14"), True),
    ],
)
def test_evaluation(expr, h, ok):
    if ok:
        check(expr, h)
    else:
        with pytest.raises(RequirementError):
            check(expr, h)


def test_failure_message_matches_nct_and_says_how_to_override():
    with pytest.raises(RequirementError) as e:
        check(CUDA_12_2, host("11.8", "520.61.05"))
    msg = str(e.value)
    assert msg.startswith("requirement error: unsatisfied condition: cuda>=12.2, please update your driver to "
                          "a newer version, or use an earlier cuda container")
    assert "NVIDIA_REQUIRE_CUDA" in msg and "cuda 11.8" in msg and "driver 520.61.05" in msg
    assert "NVIDIA_DISABLE_REQUIRE=true" in msg and "\n" not in msg


def test_failure_message_non_cuda_condition():
    with pytest.raises(RequirementError) as e:
        check_requirements((parse_expression("driver>=600", "NVIDIA_REQUIRE_DRIVER"),), host("12.4", "550.54.14"))
    msg = str(e.value)
    assert msg.startswith("requirement error: unsatisfied condition: driver>=600 (NVIDIA_REQUIRE_DRIVER;")
    assert "please update" not in msg


@pytest.mark.parametrize(
    "expr, words",
    [
        ("cuda", "no operator"),
        ("cuda>=", "empty value"),
        ("cuda=>12", "unknown operator '=>'"),
        ("cuda<>12", "unknown operator"),
        ("cuda~12", "no operator"),
        ("vram>=16", "unknown name 'vram'"),
        (">=12", "unknown name ''"),
        ("brand>=tesla", "brand only supports"),
        ("cuda>=12.x", "not a dotted number"),
        ("driver>=-1", "not a dotted number"),
        ("cuda>=12.2 brand=tesla,driver", "term 'driver'"),
    ],
)
def test_invalid_expressions(expr, words):
    with pytest.raises(RequirementError) as e:
        parse_expression(expr, "NVIDIA_REQUIRE_X")
    msg = str(e.value)
    assert msg.startswith("requirement error: invalid expression: NVIDIA_REQUIRE_X=")
    assert words in msg and "\n" not in msg


def test_parse_requirements_collects_all_but_jetpack():
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=12.0", "NVIDIA_REQUIRE_DRIVER": "driver>=500",
           "NVIDIA_REQUIRE_JETPACK": "csv-mounts=all", "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS": "",
           "NVIDIA_REQUIRE_EMPTY": "", "OTHER": "cuda>=99"}
    reqs = parse_requirements(env)
    assert [r.variable for r in reqs] == ["NVIDIA_REQUIRE_CUDA", "NVIDIA_REQUIRE_DRIVER"]


def test_separate_variables_are_anded():
    reqs = parse_requirements({"NVIDIA_REQUIRE_A": "cuda>=12.0", "NVIDIA_REQUIRE_B": "driver>=600"})
    with pytest.raises(RequirementError, match="driver>=600"):
        check_requirements(reqs, host("12.4", "550.54.14"))


@pytest.mark.parametrize("value, disabled", [
    ("1", True), ("t", True), ("T", True), ("TRUE", True), ("true", True), ("True", True),
    ("yes", False), ("tRuE", False), ("on", False), ("0", False), ("false", False), ("", False), (" true", False),
])
def test_disable_require_parsebool(value, disabled):
    assert parse_bool(value) is disabled
    env = {"NVIDIA_REQUIRE_CUDA": "cuda>=99 ((broken", "NVIDIA_DISABLE_REQUIRE": value}
    if disabled:
        assert parse_requirements(env) == ()
    else:
        with pytest.raises(RequirementError):
            parse_requirements(env)


def test_config_disable_require():
    assert parse_requirements({"NVIDIA_REQUIRE_CUDA": "cuda>=99"}, config_disable=True) == ()


@pytest.mark.parametrize("cuda_version, expected", [
    ("12.2.2", "12.2"), ("11.0", "11.0"), ("10", "10.0"), ("v11.4.1", "11.4"), ("12.3.0-rc1", "12.3"),
])
def test_legacy_cuda_version(cuda_version, expected):
    env = {"CUDA_VERSION": cuda_version}
    assert is_legacy(env)
    assert legacy_cuda_version(env) == expected
    reqs = parse_requirements(env)
    assert reqs[-1].variable == "CUDA_VERSION" and reqs[-1].expression == f"cuda>={expected}"


def test_legacy_requirement_fails_with_nct_hint():
    with pytest.raises(RequirementError, match=r"cuda>=12\.2, please update your driver.*\(CUDA_VERSION;"):
        check_requirements(parse_requirements({"CUDA_VERSION": "12.2.0"}), host("11.8", "520.61.05"))


@pytest.mark.parametrize("cuda_version", ["12.x", "012.1", "abc", "1.2.3.4"])
def test_legacy_unparsable_cuda_version_fails(cuda_version):
    with pytest.raises(RequirementError, match="CUDA_VERSION="):
        parse_requirements({"CUDA_VERSION": cuda_version})


def test_not_legacy_when_require_cuda_set():
    env = {"CUDA_VERSION": "12.2.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.2"}
    assert not is_legacy(env) and legacy_cuda_version(env) is None
    assert [r.variable for r in parse_requirements(env)] == ["NVIDIA_REQUIRE_CUDA"]


versions = st.lists(st.integers(0, 600), min_size=1, max_size=4).map(lambda p: ".".join(map(str, p)))


@given(versions, versions)
def test_compare_versions_antisymmetric_and_zero_padding(a, b):
    assert compare_versions(a, b) == -compare_versions(b, a)
    assert compare_versions(a + ".0", a) == 0


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from(list("cudarivebnt<>=!,. 0123456789xX")), max_size=40))
def test_any_expression_gives_requirement_or_one_error(expr):
    try:
        req = parse_expression(expr, "NVIDIA_REQUIRE_X")
        check_requirements((req,), host("12.4", "550.54.14", DeviceFacts(arch="9.0", brand="Tesla")))
    except PyxisHookError as e:
        assert isinstance(e, RequirementError) and "\n" not in str(e)
