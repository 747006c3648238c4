"""spec/request.py: NVIDIA_VISIBLE_DEVICES & co. -> Request, with the Slurm allocation and cgroup bounds."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from fixtures.hosttree import fake_gpus, make_host_tree
from pyxis_hook.commands.plan import request_json
from pyxis_hook.spec.config import Config
from pyxis_hook.spec.schemafiles import load_schema
from pyxis_hook.errors import PyxisHookError, RequestError, RequirementError
from pyxis_hook.host.gpus import DeviceMajors, Gpu, HostGpus, MigDevice
from pyxis_hook.host.gpuscan import discover_gpus
from pyxis_hook.host.cgroup import allowed_minors, parse_devices_list
from pyxis_hook.spec.request import Request, resolve_request, void_request

CFG = Config()
SCHEMA_OF_REQUEST = load_schema("request.schema.json")


def uuid(minor: int) -> str:
    return f"GPU-{minor:08x}-aaaa-bbbb-cccc-{minor:012x}"


def mig_uuid(minor: int, gi: int, ci: int) -> str:
    return f"MIG-{minor:08x}-{gi:04x}-{ci:04x}-dddd-{minor:012x}"


def mkhost(n: int = 4, *, minors=None, mig=None, excluded=(), mig_uuids=True, driver="535.216.03",
           domain: int = 0) -> HostGpus:
    """n GPUs in PCI order; `minors[i]` is the minor of host index i; `mig` = {minor: [(gi, ci), ...]}."""
    minors = list(range(n)) if minors is None else list(minors)
    gpus = []
    index = 0
    for i, minor in enumerate(minors):
        ex = minor in excluded
        gpus.append(Gpu(index=None if ex else index, minor=minor, uuid=uuid(minor),
                        bus_id=f"{domain:04x}:{0x06 + i:02x}:00.0", model="NVIDIA A100-SXM4-80GB", excluded=ex,
                        proc_name=f"{domain:04x}:{0x06 + i:02x}:00.0"))
        index += 0 if ex else 1
    migs = []
    for minor, pairs in (mig or {}).items():
        for k, (gi, ci) in enumerate(sorted(pairs)):
            migs.append(MigDevice(uuid=mig_uuid(minor, gi, ci) if mig_uuids else None, parent_uuid=uuid(minor),
                                  gpu_minor=minor, gi=gi, ci=ci, access_minors=(100 + gi, 200 + ci),
                                  proc_paths=(), mig_index=k))
    return HostGpus(driver_version=driver, gpus=tuple(gpus), majors=DeviceMajors(195, 511, 510, 509),
                    mig_devices=tuple(migs), mig_config_minor=1 if mig else None,
                    mig_monitor_minor=2 if mig else None)


HOST = mkhost(4)
# minors differ from PCI order: host index 0 is /dev/nvidia2, etc.
SWAPPED = mkhost(4, minors=[2, 0, 3, 1])
MIGHOST = mkhost(2, mig={0: [(1, 0), (2, 0)], 1: [(3, 0)]})


def resolve(env, host=HOST, config=CFG, allowed=None, **kw) -> Request:
    req = resolve_request(env, {}, host, config, allowed, **kw)
    jsonschema.validate(request_json(req), SCHEMA_OF_REQUEST)
    json.dumps(request_json(req))
    return req


def indices(req: Request) -> list[int]:
    return [g.index for g in req.gpus]


# ----------------------------------------------------------------- void / none / all


@pytest.mark.parametrize("env", [
    {}, {"NVIDIA_VISIBLE_DEVICES": ""}, {"NVIDIA_VISIBLE_DEVICES": " , ,"}, {"NVIDIA_VISIBLE_DEVICES": "void"},
    {"NVIDIA_VISIBLE_DEVICES": "0,void"}, {"NVIDIA_VISIBLE_DEVICES": "all, void"},
    # nothing else is parsed for a void request, not even broken values
    {"NVIDIA_DRIVER_CAPABILITIES": "bogus", "NVIDIA_REQUIRE_CUDA": "cuda>=999", "NVIDIA_IMEX_CHANNELS": "x"},
    {"NVIDIA_VISIBLE_DEVICES": "void", "NVIDIA_MIG_CONFIG_DEVICES": "all", "SLURM_STEP_GPUS": "99"},
])
def test_void(env):
    req = resolve(env)
    assert req.void and req.mode == "void"
    assert req.gpus == () and req.capabilities == () and req.cuda_visible_devices is None
    assert req.reasons and "not a GPU container" in req.reasons[0]


def test_none_gets_driver_but_no_gpu():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "none"})
    assert not req.void and req.mode == "none" and req.gpus == ()
    assert req.capabilities == ("compute", "utility")


def test_first_special_token_wins():
    assert resolve({"NVIDIA_VISIBLE_DEVICES": "none,all"}).mode == "none"
    assert indices(resolve({"NVIDIA_VISIBLE_DEVICES": "1,all,none"})) == [0, 1, 2, 3]


def test_all_any_case_in_a_list():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0,ALL"})
    assert req.mode == "all" and indices(req) == [0, 1, 2, 3]


def test_all_selects_gpus_and_mig_devices():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all"}, MIGHOST)
    assert indices(req) == [0, 1]
    assert [(m.gpu_minor, m.gi, m.ci) for m in req.mig_devices] == [(0, 1, 0), (0, 2, 0), (1, 3, 0)]


def test_all_skips_excluded():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all"}, mkhost(3, excluded=(1,)))
    assert [g.minor for g in req.gpus] == [0, 2]


# ----------------------------------------------------------------- the token forms


@pytest.mark.parametrize("value, want_minors", [
    ("0", [2]), ("1,3", [0, 1]), (" 3 , 1 ", [0, 1]), ("0,0,0", [2]),
    (uuid(3), [3]), (uuid(3).lower(), [3]), (uuid(3).upper().replace("GPU-", "gpu-"), [3]),
    ("0000:06:00.0", [2]), ("00000000:07:00.0", [0]), ("0000:08:00.0,0", [3, 2]), ("0:09:00.0", [1]),
    (f"1,{uuid(0)},0000:07:00.0", [0]),
])
def test_gpu_tokens(value, want_minors):
    req = resolve({"NVIDIA_VISIBLE_DEVICES": value}, SWAPPED)
    assert req.mode == "list"
    assert sorted(g.minor for g in req.gpus) == sorted(want_minors)
    assert indices(req) == sorted(indices(req))  # PCI order, not request order


def test_index_is_pci_order_not_minor():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0"}, SWAPPED)
    assert req.gpus[0].minor == 2 and req.gpu_minors == (2,)


def test_pci_domain_wider_than_16_bits():
    host = mkhost(2, domain=0x10001)
    assert [g.minor for g in resolve({"NVIDIA_VISIBLE_DEVICES": "00010001:07:00.0"}, host).gpus] == [1]


@pytest.mark.parametrize("value, want", [
    (mig_uuid(0, 2, 0), [(0, 2, 0)]),
    (mig_uuid(0, 2, 0).lower(), [(0, 2, 0)]),
    ("0:0", [(0, 1, 0)]), ("0:1", [(0, 2, 0)]), ("1:0", [(1, 3, 0)]),
    (f"0:1,{mig_uuid(0, 2, 0)}", [(0, 2, 0)]),
])
def test_mig_tokens(value, want):
    req = resolve({"NVIDIA_VISIBLE_DEVICES": value}, MIGHOST)
    assert req.gpus == ()
    assert [(m.gpu_minor, m.gi, m.ci) for m in req.mig_devices] == want
    assert req.gpu_minors == (want[0][0],)  # the parent's /dev/nvidiaN is needed


@pytest.mark.parametrize("value, words", [
    ("4", "device error: 4: unknown device (this host has GPUs 0 (GPU-"),
    ("4", "not /dev/nvidiaN minors"),
    ("-1", "device error: -1: unknown device"),
    ("GPU-00000003", f"did you mean {uuid(3)}"),
    ("GPU-00000003-aaaa-bbbb-cccc-000000000009", "unknown device"),
    ("0000:0a:00.0", "device error: 0000:0a:00.0: unknown device"),
    ("06:00.0", "unknown device"),  # no domain: not a PCI id for the CLI grammar
    ("MIG-nope", "unknown device"),
    ("2:0", "unknown device"),
    ("first", "device error: first: unknown device"),
    ("None", "unknown device"),  # 'none' is exact and case-sensitive in the hook
    ("0,7", "device error: 7"),
])
def test_unknown_devices(value, words):
    with pytest.raises(RequestError) as e:
        resolve({"NVIDIA_VISIBLE_DEVICES": value})
    assert words in str(e.value) and "\n" not in str(e.value)


def test_unknown_device_lists_mig_devices():
    with pytest.raises(RequestError, match=r"MIG devices 0:0 \(MIG-"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0:5"}, MIGHOST)


def test_legacy_mig_form_rejected_with_hint():
    with pytest.raises(RequestError, match=f"not supported, use {mig_uuid(0, 2, 0)}"):
        resolve({"NVIDIA_VISIBLE_DEVICES": f"MIG-{uuid(0)}/2/0"}, MIGHOST)


def test_mig_uuid_unknown_without_nvml():
    host = mkhost(1, mig={0: [(1, 0)]}, mig_uuids=False)
    with pytest.raises(RequestError, match="unknown without NVML, use <gpu>:<mig>"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "MIG-1234"}, host)
    assert resolve({"NVIDIA_VISIBLE_DEVICES": "0:0"}, host).mig_devices[0].uuid is None


def test_excluded_gpu_named_explicitly():
    host = mkhost(3, excluded=(1,))
    with pytest.raises(RequestError, match="excluded on this host"):
        resolve({"NVIDIA_VISIBLE_DEVICES": uuid(1)}, host)
    # indices skip the excluded GPU, like NVML's enumeration
    assert [g.minor for g in resolve({"NVIDIA_VISIBLE_DEVICES": "1"}, host).gpus] == [2]


# ----------------------------------------------------------------- capabilities


@pytest.mark.parametrize("env, caps", [
    ({}, ("compute", "utility")),
    ({"NVIDIA_DRIVER_CAPABILITIES": ""}, ("compute", "utility")),
    ({"NVIDIA_DRIVER_CAPABILITIES": "utility"}, ("utility",)),
    ({"NVIDIA_DRIVER_CAPABILITIES": " video , compute,,video"}, ("compute", "video")),
    ({"NVIDIA_DRIVER_CAPABILITIES": "all"}, ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")),
    ({"NVIDIA_DRIVER_CAPABILITIES": "bogus,all"}, ("compat32", "compute", "display", "graphics", "ngx", "utility",
                                                   "video")),
    ({"CUDA_VERSION": "12.2.0"}, ("compat32", "compute", "display", "graphics", "ngx", "utility", "video")),
])
def test_capabilities(env, caps):
    assert resolve({"NVIDIA_VISIBLE_DEVICES": "0", **env}, cuda_version="12.4").capabilities == caps


@pytest.mark.parametrize("value", ["none", "Compute", "compute,gpu", "compute utility"])
def test_unknown_capability(value):
    with pytest.raises(RequestError) as e:
        resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": value})
    assert str(e.value) == (f"unsupported capabilities found in '{value}' "
                            f"(allowed 'compute,compat32,graphics,utility,video,display,ngx')")


def test_capabilities_follow_config():
    cfg = Config(default_capabilities=("utility",), supported_capabilities=("utility", "compute"))
    assert resolve({"NVIDIA_VISIBLE_DEVICES": "0"}, config=cfg).capabilities == ("utility",)
    assert resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "all"},
                   config=cfg).capabilities == ("compute", "utility")
    with pytest.raises(RequestError, match="allowed 'utility,compute'"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_DRIVER_CAPABILITIES": "video"}, config=cfg)


# ----------------------------------------------------------------- legacy images and requirements


def test_legacy_image_defaults_to_all():
    req = resolve({"CUDA_VERSION": "11.8.0"}, cuda_version="12.4")
    assert req.legacy and req.mode == "all" and indices(req) == [0, 1, 3, 2][:0] + [0, 1, 2, 3]
    assert [r.expression for r in req.requirements] == ["cuda>=11.8"]


def test_legacy_image_requirement_fails_on_old_driver():
    with pytest.raises(RequirementError, match=r"cuda>=12\.2, please update your driver"):
        resolve({"CUDA_VERSION": "12.2.0"}, cuda_version="11.8")


def test_not_legacy_when_require_cuda_set():
    assert resolve({"CUDA_VERSION": "12.2.0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, cuda_version="12.4").void


def test_requirements_checked_with_host_values():
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_REQUIRE_CUDA": "cuda>=12.2 brand=tesla,driver>=535,driver<536"}
    assert resolve(env, cuda_version="12.1").requirements[0].variable == "NVIDIA_REQUIRE_CUDA"
    with pytest.raises(RequirementError) as e:
        resolve(env, mkhost(2, driver="530.30.02"), cuda_version="12.1")
    msg = str(e.value)
    assert "cuda 12.1" in msg and "driver 530.30.02" in msg and "NVIDIA_DISABLE_REQUIRE=true" in msg


def test_requirements_also_for_none():
    with pytest.raises(RequirementError):
        resolve({"NVIDIA_VISIBLE_DEVICES": "none", "NVIDIA_REQUIRE_DRIVER": "driver>=999"})


def test_cuda_requirement_checked_against_the_given_version():
    with pytest.raises(RequirementError, match="cuda 11.0"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, cuda_version="11.0")
    assert resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, cuda_version="12.2").gpus


@pytest.mark.parametrize("env, config", [
    ({"NVIDIA_DISABLE_REQUIRE": "true"}, CFG),
    ({"NVIDIA_DISABLE_REQUIRE": "1"}, CFG),
    ({}, Config(disable_require=True)),
])
def test_disable_require(env, config):
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0", **env}, config=config,
                  cuda_version="12.4")
    assert req.requirements_disabled and req.requirements == ()


def test_disable_require_yes_is_not_true():
    with pytest.raises(RequirementError):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": "cuda>=99.0", "NVIDIA_DISABLE_REQUIRE": "yes"},
                cuda_version="12.4")


# ----------------------------------------------------------------- Slurm allocation


@pytest.mark.parametrize("env, want", [
    ({"SLURM_STEP_GPUS": "0,1"}, [0, 1]),
    ({"SLURM_STEP_GPUS": "2", "SLURM_JOB_GPUS": "0,1,2,3"}, [2]),  # step wins over job
    ({"SLURM_STEP_GPUS": "", "SLURM_JOB_GPUS": "1,3"}, [1, 3]),
    ({"SLURM_JOB_GPUS": uuid(3)}, [3]),
    ({}, [0, 1, 2, 3]),
])
def test_all_means_the_allocation(env, want):
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", **env})
    assert indices(req) == want
    if env.get("SLURM_STEP_GPUS") or env.get("SLURM_JOB_GPUS"):
        assert req.allocation == tuple(want) and req.allocation_source.startswith("SLURM_")
    else:
        assert req.allocation is None


def test_global_indices_map_by_pci_order():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "0,1"}, SWAPPED)
    assert [g.minor for g in req.gpus] == [2, 0]


def test_explicit_gpu_outside_allocation():
    with pytest.raises(RequestError) as e:
        resolve({"NVIDIA_VISIBLE_DEVICES": "4", "SLURM_STEP_GPUS": "0,1"}, mkhost(6))
    assert str(e.value) == "GPU 4 is not in this job's allocation (SLURM_STEP_GPUS=0,1)"


def test_mig_outside_allocation():
    with pytest.raises(RequestError, match=r"MIG device 1:0 is not in this job's allocation \(SLURM_JOB_GPUS=0\)"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "1:0", "SLURM_JOB_GPUS": "0"}, MIGHOST)


def test_explicit_gpu_inside_allocation():
    assert indices(resolve({"NVIDIA_VISIBLE_DEVICES": "1", "SLURM_STEP_GPUS": "0,1"})) == [1]


def test_policy_ignore():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "0"}, config=Config(slurm_policy="ignore"))
    assert indices(req) == [0, 1, 2, 3] and req.allocation is None
    assert any("slurm-policy is 'ignore'" in r for r in req.reasons)
    assert indices(resolve({"NVIDIA_VISIBLE_DEVICES": "3", "SLURM_STEP_GPUS": "0"},
                           config=Config(slurm_policy="ignore"))) == [3]


@pytest.mark.parametrize("value, words", [
    ("0,9", "SLURM_STEP_GPUS=0,9: GPU 9 does not exist on this host, which has 4 usable GPU(s)"),
    ("gpu0", "'gpu0' is not a GPU index or UUID"),
    ("GPU-nope", "GPU GPU-nope does not exist"),
])
def test_bad_slurm_variable(value, words):
    with pytest.raises(RequestError) as e:
        resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": value})
    assert words in str(e.value)


def test_slurm_not_read_for_void():
    assert resolve({"SLURM_STEP_GPUS": "junk"}).void


# ----------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def test_cuda_visible_devices_needed_value():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "2,3"})
    assert req.cuda_visible_devices == "0,1"
    assert any("CUDA_VISIBLE_DEVICES is unset" in r for r in req.reasons) and req.warnings == ()


def test_cuda_visible_devices_local_agrees():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert req.warnings == () and any("agrees" in r for r in req.reasons)


def test_cuda_visible_devices_global_indices_warned():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "2,3", "CUDA_VISIBLE_DEVICES": "2,3"})
    assert len(req.warnings) == 1
    w = req.warnings[0]
    assert "CUDA_VISIBLE_DEVICES=2,3 disagrees" in w and "use CUDA_VISIBLE_DEVICES=0,1" in w
    assert "ConstrainDevices=yes" in w
    assert f"warning: {w}" in req.reasons
    # never used to select
    assert indices(req) == [2, 3]


def test_cuda_visible_devices_subset_and_uuid():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "1"})
    assert req.warnings == () and any("subset" in r for r in req.reasons)
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": uuid(1)})
    assert req.warnings == ()
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": uuid(3)})
    assert req.warnings and uuid(3) in req.warnings[0]


def test_cuda_visible_devices_mig_uuids():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0:1", "CUDA_VISIBLE_DEVICES": mig_uuid(0, 2, 0)}, MIGHOST)
    assert req.cuda_visible_devices == mig_uuid(0, 2, 0) and req.warnings == ()


def test_cuda_visible_devices_nodevfiles():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "NoDevFiles"})
    assert "NoDevFiles" in req.warnings[0]


# ----------------------------------------------------------------- device cgroup


def test_cgroup_bounds_all():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all"}, SWAPPED, allowed=frozenset({0, 1}))
    assert sorted(g.minor for g in req.gpus) == [0, 1] and indices(req) == [1, 3]


def test_cgroup_refuses_explicit():
    with pytest.raises(RequestError, match=r"GPU 0 \(/dev/nvidia2\) is not allowed by this process's device cgroup "
                                           r"\(allowed GPU minors: 0,1\)"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0"}, SWAPPED, allowed=frozenset({0, 1}))


def test_cgroup_alias_name():
    req = resolve_request({"NVIDIA_VISIBLE_DEVICES": "all"}, {}, HOST, CFG, frozenset({3}))
    assert indices(req) == [3]


def test_cgroup_and_slurm_disjoint_gives_no_gpu_and_a_warning():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "0"}, allowed=frozenset({1}))
    assert req.gpus == () and "selected no GPU" in req.warnings[0]


# ----------------------------------------------------------------- MIG control and IMEX


def test_mig_config_needs_privilege():
    env = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "all"}
    with pytest.raises(RequestError, match="cannot set MIG_CONFIG_DEVICES in non privileged container"):
        resolve(env, MIGHOST)
    req = resolve(env, MIGHOST, privileged=True)
    assert req.mig_config and not req.mig_monitor


def test_mig_monitor():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_MIG_MONITOR_DEVICES": "all"}, MIGHOST, privileged=True)
    assert req.mig_monitor


@pytest.mark.parametrize("env, words", [
    ({"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_MIG_CONFIG_DEVICES": "0"}, "only 'all' devices"),
    ({"NVIDIA_VISIBLE_DEVICES": "0:0", "NVIDIA_MIG_MONITOR_DEVICES": "all"}, "specific MIG devices"),
])
def test_mig_control_errors(env, words):
    with pytest.raises(RequestError, match=words):
        resolve(env, MIGHOST, privileged=True)


@pytest.mark.parametrize("value, want", [
    (None, ()), ("", ()), ("all", ()), ("void", ()), ("none", ()), ("0", (0,)), ("3, 1,3", (1, 3)),
    ("1048575", (1048575,)),
])
def test_imex_channels(value, want):
    env = {"NVIDIA_VISIBLE_DEVICES": "0"}
    if value is not None:
        env["NVIDIA_IMEX_CHANNELS"] = value
    assert resolve(env).imex_channels == want


@pytest.mark.parametrize("value", ["1048576", "x", "-1", "0x1"])
def test_imex_bad(value):
    with pytest.raises(RequestError, match=f"unsupported IMEX channel value '{value}'"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": value})


# ----------------------------------------------------------------- real discovery, reasons, JSON


def test_with_discovered_host_tree(tmp_path):
    tree = make_host_tree(tmp_path, fake_gpus(3, minors=[1, 2, 0]), make_nodes=False)
    host = discover_gpus(tree.proc_root, tree.dev_root)
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0,0000:08:00.0", "SLURM_JOB_GPUS": "0,2"}, host)
    assert [g.minor for g in req.gpus] == [1, 0]
    with pytest.raises(RequestError, match="GPU 1 is not in this job's allocation"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "1", "SLURM_JOB_GPUS": "0,2"}, host)


def test_reasons_explain_each_decision():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "1", "NVIDIA_DRIVER_CAPABILITIES": "compute",
                   "NVIDIA_REQUIRE_CUDA": "cuda>=12.0"}, cuda_version="12.4")
    text = "\n".join(req.reasons)
    for words in ("Slurm allocation from SLURM_STEP_GPUS=1", "'all' = every GPU within the Slurm allocation",
                  "NVIDIA_DRIVER_CAPABILITIES=compute", "requirements hold: NVIDIA_REQUIRE_CUDA=cuda>=12.0",
                  "CUDA_VISIBLE_DEVICES is unset"):
        assert words in text


def test_cdi_annotations_noted():
    req = resolve_request({"NVIDIA_VISIBLE_DEVICES": "0"}, {"cdi.k8s.io/x": "nvidia.com/gpu=0"}, HOST, CFG)
    assert any("cdi.k8s.io/" in r for r in req.reasons)


# ----------------------------------------------------------------- properties

TOKENS = st.sampled_from(["0", "1", "2", "3", "4", "9", "all", "none", "void", "ALL", "0:0", "1:0", "0:1",
                          uuid(0), uuid(1), uuid(7), "GPU-0", "0000:06:00.0", "00000000:07:00.0", "0000:0f:00.0",
                          mig_uuid(0, 1, 0), mig_uuid(1, 3, 0), "MIG-x", " ", "", "x", "-1"])
VALUES = st.lists(TOKENS, max_size=5).map(",".join)
INDEX_LISTS = st.lists(st.sampled_from(["0", "1", "2", "3", "7", uuid(1), "x", ""]), max_size=3).map(",".join)
ENVS = st.fixed_dictionaries({}, optional={
    "NVIDIA_VISIBLE_DEVICES": VALUES,
    "SLURM_STEP_GPUS": INDEX_LISTS,
    "SLURM_JOB_GPUS": INDEX_LISTS,
    "CUDA_VISIBLE_DEVICES": INDEX_LISTS,
    "NVIDIA_DRIVER_CAPABILITIES": st.sampled_from(["", "all", "compute", "utility,video", "bogus", "none"]),
    "NVIDIA_REQUIRE_CUDA": st.sampled_from(["", "cuda>=11.0", "cuda>=13.0", "cuda>=13.0 driver>=500", "bad",
                                            "brand=tesla,driver>=470,driver<471"]),
    "NVIDIA_DISABLE_REQUIRE": st.sampled_from(["", "true", "yes", "1"]),
    "CUDA_VERSION": st.sampled_from(["", "12.2.0", "11", "bad"]),
    "NVIDIA_IMEX_CHANNELS": st.sampled_from(["", "all", "0,1", "2000000", "x"]),
    "NVIDIA_MIG_CONFIG_DEVICES": st.sampled_from(["", "all", "0"]),
})
ALLOWED = st.none() | st.frozensets(st.integers(0, 3))
VALID_TOKENS = st.sampled_from(["0", "1", "all", "ALL", "none", "0:0", "0:1", "1:0", uuid(0), uuid(1),
                                "0000:06:00.0", "00000000:07:00.0", mig_uuid(1, 3, 0), "4"])
MOSTLY_VALID_ENVS = st.fixed_dictionaries({
    "NVIDIA_VISIBLE_DEVICES": st.lists(VALID_TOKENS, min_size=1, max_size=4).map(",".join),
}, optional={
    "SLURM_STEP_GPUS": st.sampled_from(["", "0", "1", "0,1", uuid(1)]),
    "SLURM_JOB_GPUS": st.sampled_from(["", "0", "1", "0,1"]),
    "CUDA_VISIBLE_DEVICES": INDEX_LISTS,
})
CONFIGS = st.sampled_from([CFG, Config(slurm_policy="ignore"), Config(disable_require=True)])


def outcome(env, allowed, config, host=MIGHOST, privileged=False):
    try:
        return resolve_request(env, {}, host, config, allowed, cuda_version="12.4", privileged=privileged)
    except (RequestError, RequirementError) as e:
        assert "\n" not in str(e) and str(e)
        return type(e).__name__, str(e)


@settings(max_examples=400, deadline=None)
@given(ENVS, ALLOWED, CONFIGS, st.booleans())
def test_property_errors_are_one_line_and_typed(env, allowed, config, privileged):
    try:
        req = resolve_request(env, {}, MIGHOST, config, allowed, cuda_version="12.4", privileged=privileged)
    except PyxisHookError as e:
        assert isinstance(e, (RequestError, RequirementError)), e
        assert str(e) and "\n" not in str(e)
    else:
        jsonschema.validate(request_json(req), SCHEMA_OF_REQUEST)


def _check_within_bounds(env, allowed, config) -> str:
    """The containment checks on one request; returns which branch ran, so tests can show it runs."""
    req = outcome(env, allowed, config)
    if not isinstance(req, Request):
        return "error"
    if req.void:
        return "void"
    minors = set(req.gpu_minors)
    if allowed is not None:
        assert minors <= allowed
    if req.allocation is not None:
        alloc_minors = {MIGHOST.gpu_by_index(i).minor for i in req.allocation}
        assert minors <= alloc_minors
        src = req.allocation_source.split("=", 1)[0]
        assert config.slurm_policy == "allocation" and env.get(src)
    if req.mode == "list":
        # every selected device was named by some token
        named = set()
        for tok in [t.strip() for t in env["NVIDIA_VISIBLE_DEVICES"].split(",") if t.strip()]:
            one = outcome({"NVIDIA_VISIBLE_DEVICES": tok}, None, Config(slurm_policy="ignore"))
            if isinstance(one, Request):
                named |= set(one.gpu_minors)
        assert minors <= named
    if req.mode == "none":
        assert minors == set()
    return f"checked:{req.mode}" + (":allocation" if req.allocation is not None else "")


@settings(max_examples=400, deadline=None)
@given(ENVS | MOSTLY_VALID_ENVS, ALLOWED, CONFIGS)
def test_property_never_outside_request_allocation_or_cgroup(env, allowed, config):
    event(_check_within_bounds(env, allowed, config))


@pytest.mark.parametrize("env, allowed, expect", [
    ({"NVIDIA_VISIBLE_DEVICES": "0,1"}, None, "checked:list"),
    ({"NVIDIA_VISIBLE_DEVICES": "1"}, frozenset({1, 2}), "checked:list"),
    ({"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_STEP_GPUS": "1"}, None, "checked:all:allocation"),
    ({"NVIDIA_VISIBLE_DEVICES": "all"}, frozenset({0}), "checked:all"),
    ({"NVIDIA_VISIBLE_DEVICES": "none"}, None, "checked:none"),
])
def test_the_containment_checks_run_on_granted_requests(env, allowed, expect):
    """The property above returns early for void and refused requests; these requests reach its checks."""
    assert _check_within_bounds(env, allowed, CFG) == expect


@settings(max_examples=300, deadline=None)
@given(ENVS, ALLOWED, CONFIGS, st.randoms(use_true_random=False))
def test_property_independent_of_env_order(env, allowed, config, rnd):
    items = list(env.items())
    rnd.shuffle(items)
    assert outcome(dict(items), allowed, config) == outcome(env, allowed, config)


@settings(max_examples=300, deadline=None)
@given(ENVS, ALLOWED, CONFIGS, st.sampled_from([None, "", "void", " void ", "0,void", ",,"]))
def test_property_void_never_changes_the_container(env, allowed, config, visible):
    env = dict(env)
    env.pop("CUDA_VERSION", None)  # a legacy image turns unset into 'all'
    if visible is None:
        env.pop("NVIDIA_VISIBLE_DEVICES", None)
    else:
        env["NVIDIA_VISIBLE_DEVICES"] = visible
    req = resolve_request(env, {}, MIGHOST, config, allowed)
    assert void_request(env) == req
    assert req.void and req.gpus == () and req.mig_devices == () and req.capabilities == ()
    assert req.imex_channels == () and not req.mig_config and req.gpu_minors == ()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["NVIDIA_VISIBLE_DEVICES", "SLURM_STEP_GPUS", "A"]),
                          st.sampled_from(["0", "1", "all", "void", "2,3"])), max_size=6))
def test_property_last_duplicate_wins_through_oci(pairs):
    from pyxis_hook.spec.oci import env_map

    env = env_map([f"{k}={v}" for k, v in pairs])
    last = dict(pairs)
    assert outcome(env, None, CFG, HOST) == outcome(last, None, CFG, HOST)


def test_random_order_smoke():
    env = {"NVIDIA_VISIBLE_DEVICES": "3,1", "SLURM_JOB_GPUS": "1,3", "CUDA_VISIBLE_DEVICES": "0,1",
           "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
    base = outcome(env, None, CFG, HOST)
    for seed in range(5):
        items = list(env.items())
        random.Random(seed).shuffle(items)
        assert outcome(dict(items), None, CFG, HOST) == base


def test_schema_is_valid_draft7():
    jsonschema.Draft7Validator.check_schema(SCHEMA_OF_REQUEST)


def test_devices_list_feeds_resolve():
    rules = parse_devices_list("c 195:255 rw\nc 195:2 rw\nc 195:0 rw\n")
    allowed = allowed_minors(rules, 195, [g.minor for g in SWAPPED.gpus])
    assert [g.minor for g in resolve({"NVIDIA_VISIBLE_DEVICES": "all"}, SWAPPED, allowed=allowed).gpus] == [2, 0]


def test_host_without_gpus_warns_for_all():
    empty = HostGpus(driver_version=None, gpus=(), majors=DeviceMajors(None, None, None, None))
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "all"}, empty)
    assert req.gpus == () and "no usable GPU" in req.warnings[0]
    with pytest.raises(RequestError, match="this host has no usable GPU"):
        resolve({"NVIDIA_VISIBLE_DEVICES": "0"}, empty)


def test_cuda_visible_devices_empty_warned():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": ""})
    assert "set but empty" in req.warnings[0] and "CUDA_VISIBLE_DEVICES=0,1" in req.warnings[0]


def test_request_import_is_cheap():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-I", "-c", "import sys, pyxis_hook.spec.request, pyxis_hook.spec.oci; "
                          "print(' '.join(sorted(sys.modules)))"], capture_output=True, text=True, check=True)
    mods = out.stdout.split()
    assert "pyxis_hook.spec.request" in mods
    assert not [m for m in mods if m.split(".")[0] in ("elftools", "jsonschema", "ctypes", "subprocess")]


@settings(max_examples=300, deadline=None)
@given(ENVS)
def test_property_void_request_agrees_with_resolve(env):
    early = void_request(env)
    full = outcome(env, None, CFG)
    if early is not None:
        assert full == early
    else:
        assert not (isinstance(full, Request) and full.void)


BIG = "1" * 5000  # int() refuses more than 4,300 digits: must be a one-line request error, not a ValueError


@pytest.mark.parametrize("env", [
    {"NVIDIA_VISIBLE_DEVICES": BIG},
    {"NVIDIA_VISIBLE_DEVICES": f"0:{BIG}"},
    {"NVIDIA_VISIBLE_DEVICES": f"MIG-GPU-aa/{BIG}/0"},
    {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_IMEX_CHANNELS": BIG},
    {"NVIDIA_VISIBLE_DEVICES": "all", "SLURM_JOB_GPUS": BIG},
    {"NVIDIA_VISIBLE_DEVICES": "0", "NVIDIA_REQUIRE_CUDA": f"cuda>={BIG}"},
    {"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VERSION": BIG},
])
def test_huge_numbers_are_request_errors(env):
    with pytest.raises((RequestError, RequirementError)):
        resolve(env, cuda_version="12.2")


def test_huge_cuda_visible_devices_is_a_warning():
    req = resolve({"NVIDIA_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": BIG})
    assert any("will not exist in the container" in w for w in req.warnings)


def test_names_mig_uuid_reads_tokens_not_substrings():
    from pyxis_hook.spec.envreads import names_mig_uuid

    assert names_mig_uuid({"NVIDIA_VISIBLE_DEVICES": "0, mig-GPU-1/0/0"})
    assert names_mig_uuid({"NVIDIA_VISIBLE_DEVICES": "MIG-4f1b2a3c-0000-0000-0000-000000000001"})
    assert not names_mig_uuid({"NVIDIA_VISIBLE_DEVICES": "GPU-aaaa-MIG-like,0"})  # a GPU UUID, not a MIG one
    assert not names_mig_uuid({})
