"""pyxis_hook.loader.cpu: the CPU as glibc's ld.so sees it, for CPUs this machine is not.

Each CPU is described by the /proc/cpuinfo lines its kernel prints (vendor,
family, model, the flags that matter); the expected platform, legacy hwcap
bits and glibc-hwcaps levels are worked out by hand from glibc's rules
(sysdeps/x86/cpu-features.c, sysdeps/x86/get-isa-level.h, elf/dl-hwcaps.c).
tests/oracles/test_loadercpu_oracle.py checks the same functions against
the real loader on whatever CPU the tests run on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from fixtures.glibcroot import make_glibc_root
from fixtures.synth import build_exe, build_lib
from pyxis_hook.loader import cpu as loadercpu
from pyxis_hook.loader.cpu import Cpu, i386_loader, legacy_cache_ok, legacy_subdirs, parse_cpuinfo, x86_64_loader
from pyxis_hook.loader.loaderenv import EM_386, EM_X86_64, loader_env_for_root
from pyxis_hook.loader.resolve import format_ldd, resolve_tree

BASE = "fpu cx8 cmov mmx fxsr sse sse2 lm"
V2 = BASE + " pni ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm"
V3 = V2 + " xsave avx f16c fma avx2 bmi1 bmi2 abm movbe"
V4 = V3 + " avx512f avx512dq avx512cd avx512bw avx512vl"


def cpuinfo(vendor: str, family: int, model: int, flags: str) -> str:
    block = (f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: a CPU\nflags\t\t: {flags}\n\n")
    return block + block.replace("processor\t: 0", "processor\t: 1")


# name: (cpuinfo, expected x86-64 platform, legacy hwcap bits, glibc-hwcaps subdirs)
CPUS = {
    # Sapphire Rapids: AVX-512 without ER -> avx512_1; AVX2 & co -> haswell
    "intel-xeon-avx512": (cpuinfo("GenuineIntel", 6, 143, V4 + " avx512_bf16 amx_tile"),
                          "haswell", ("x86_64", "avx512_1"), ("x86-64-v4", "x86-64-v3", "x86-64-v2")),
    # Haswell-EP
    "intel-haswell": (cpuinfo("GenuineIntel", 6, 63, V3), "haswell", ("x86_64",), ("x86-64-v3", "x86-64-v2")),
    # Knights Landing: AVX512ER+PF -> xeon_phi, never avx512_1; no BW/DQ/VL -> no v4
    "intel-xeon-phi": (cpuinfo("GenuineIntel", 6, 87, V3 + " avx512f avx512cd avx512er avx512pf"),
                       "xeon_phi", ("x86_64",), ("x86-64-v3", "x86-64-v2")),
    # AVX512ER without PF: not xeon_phi, not avx512_1, but haswell
    "intel-er-without-pf": (cpuinfo("GenuineIntel", 6, 133, V4 + " avx512er"),
                            "haswell", ("x86_64",), ("x86-64-v4", "x86-64-v3", "x86-64-v2")),
    # AVX-512 in the CPU but not enabled by the kernel: the flags are gone from cpuinfo
    "intel-avx512-off": (cpuinfo("GenuineIntel", 6, 85, V3), "haswell", ("x86_64",), ("x86-64-v3", "x86-64-v2")),
    # a Xeon whose LZCNT ("abm") is missing: not haswell, still v2
    "intel-no-lzcnt": (cpuinfo("GenuineIntel", 6, 63, V3.replace(" abm", "")), "x86_64", ("x86_64",),
                       ("x86-64-v2",)),
    # Sandy Bridge: AVX but no AVX2
    "intel-sandy-bridge": (cpuinfo("GenuineIntel", 6, 45, V2 + " xsave avx"), "x86_64", ("x86_64",),
                           ("x86-64-v2",)),
    # an Intel CPU of another family (the rule is the vendor's, not family 6's)
    "intel-family-19": (cpuinfo("GenuineIntel", 19, 1, V4), "haswell", ("x86_64", "avx512_1"),
                        ("x86-64-v4", "x86-64-v3", "x86-64-v2")),
    # AMD Zen 4 with AVX-512: AMD keeps the kernel's platform and gets no avx512_1
    "amd-zen4": (cpuinfo("AuthenticAMD", 25, 17, V4), "x86_64", ("x86_64",),
                 ("x86-64-v4", "x86-64-v3", "x86-64-v2")),
    "amd-zen3": (cpuinfo("AuthenticAMD", 25, 1, V3), "x86_64", ("x86_64",), ("x86-64-v3", "x86-64-v2")),
    "hygon": (cpuinfo("HygonGenuine", 24, 1, V3), "x86_64", ("x86_64",), ("x86-64-v3", "x86-64-v2")),
    # Zhaoxin family 7 model 0x1b: glibc switches AVX/AVX2 off, so v2 only
    "zhaoxin-wudaokou": (cpuinfo("CentaurHauls", 7, 0x1B, V3), "x86_64", ("x86_64",), ("x86-64-v2",)),
    "zhaoxin-shanghai-0x3b": (cpuinfo("  Shanghai  ", 7, 0x3B, V3), "x86_64", ("x86_64",), ("x86-64-v2",)),
    "zhaoxin-other-model": (cpuinfo("CentaurHauls", 7, 0x5B, V3), "x86_64", ("x86_64",), ("x86-64-v3", "x86-64-v2")),
    # SSE3 ("pni") is part of v2
    "no-sse3": (cpuinfo("AuthenticAMD", 16, 2, V2.replace(" pni", "")), "x86_64", ("x86_64",), ()),
}


@pytest.mark.parametrize("name", sorted(CPUS))
def test_x86_64_loader_follows_glibc_for_each_cpu(name):
    text, platform, bits, hwcaps = CPUS[name]
    got = x86_64_loader(parse_cpuinfo(text))
    assert (got.platform, got.hwcap_names, got.hwcaps) == (platform, bits, hwcaps)


@pytest.mark.parametrize("name", sorted(CPUS))
def test_i386_loader_is_the_same_on_every_vendor(name):
    got = i386_loader(parse_cpuinfo(CPUS[name][0]))
    assert (got.platform, got.hwcap_names, got.hwcaps) == ("i686", ("sse2",), ())


def test_i386_platform_and_sse2_follow_cmov_cx8_sse2():
    assert i386_loader(Cpu(features=frozenset({"CX8"}))) == loadercpu.LoaderCpu("i586", (), ())
    assert i386_loader(Cpu()).platform == "i686"  # neither: the kernel's AT_PLATFORM stays


def test_parse_cpuinfo_reads_the_first_processor():
    cpu = parse_cpuinfo(cpuinfo("  Shanghai  ", 7, 59, "fpu abm pni"))
    assert cpu == Cpu("Shanghai", 7, 59, frozenset({"FPU", "LZCNT", "SSE3"}))
    assert parse_cpuinfo("") == Cpu()


def test_unreadable_cpuinfo_is_a_cpu_without_features(tmp_path):
    cpu = loadercpu.host_cpu(str(tmp_path / "missing"))
    assert cpu == Cpu()
    assert x86_64_loader(cpu) == loadercpu.LoaderCpu("x86_64", ("x86_64",), ())


def test_legacy_subdirs_for_an_intel_avx512_cpu():
    """glibc 2.36 on a Sapphire Rapids: subsets of (x86_64, avx512_1, haswell, tls), last element first."""
    seen = x86_64_loader(parse_cpuinfo(CPUS["intel-xeon-avx512"][0]))
    assert legacy_subdirs(seen.hwcap_names, seen.platform) == (
        "tls/haswell/avx512_1/x86_64", "tls/haswell/avx512_1", "tls/haswell/x86_64", "tls/haswell",
        "tls/avx512_1/x86_64", "tls/avx512_1", "tls/x86_64", "tls",
        "haswell/avx512_1/x86_64", "haswell/avx512_1", "haswell/x86_64", "haswell",
        "avx512_1/x86_64", "avx512_1", "x86_64")


def test_legacy_subdirs_for_amd_and_i386():
    """What glibc 2.36's LD_DEBUG=libs prints on an AMD EPYC (repeats listed once) and for its i386 loader."""
    assert legacy_subdirs(("x86_64",), "x86_64") == (
        "tls/x86_64/x86_64", "tls/x86_64", "tls", "x86_64/x86_64", "x86_64")
    assert legacy_subdirs(("sse2",), "i686") == (
        "tls/i686/sse2", "tls/i686", "tls/sse2", "tls", "i686/sse2", "i686", "sse2")
    assert legacy_subdirs((), None) == ("tls",)


@pytest.fixture(scope="module")
def plat_tree(tmp_path_factory) -> Path:
    """$PLATFORM in a RUNPATH and a legacy platform subdir, with a copy for each platform glibc may pick."""
    t = tmp_path_factory.mktemp("plat")
    for platform in ("x86_64", "haswell", "xeon_phi"):
        build_lib(t / "plat" / platform, "libp.so.1")
        build_lib(t / "legacy" / platform, "libq.so.1")
    build_lib(t / "legacy", "libq.so.1")
    build_exe(t / "bin", "exe", needed=("libp.so.1", "libq.so.1"), runpath=f"{t}/plat/$PLATFORM:{t}/legacy")
    return t


@pytest.mark.parametrize("name,platform", [("intel-xeon-avx512", "haswell"), ("intel-xeon-phi", "xeon_phi"),
                                           ("amd-zen4", "x86_64")])
def test_resolver_searches_the_platform_glibc_picks(plat_tree, name, platform):
    cpu = parse_cpuinfo(CPUS[name][0])
    env = loader_env_for_root("/", cpu=cpu, inhibit_cache=True)
    lines = format_ldd(resolve_tree(env, f"{plat_tree}/bin/exe")).splitlines()
    assert env.platform == platform
    assert f"\tlibp.so.1 => {plat_tree}/plat/{platform}/libp.so.1" in lines
    if env.glibc_version < (2, 37):  # the legacy platform subdir comes before the dir itself
        assert f"\tlibq.so.1 => {plat_tree}/legacy/{platform}/libq.so.1" in lines
    else:
        assert f"\tlibq.so.1 => {plat_tree}/legacy/libq.so.1" in lines


def test_loader_env_takes_hwcaps_from_the_cpu():
    intel = parse_cpuinfo(CPUS["intel-xeon-avx512"][0])
    env = loader_env_for_root("/", cpu=intel, inhibit_cache=True)
    assert env.hwcaps == ("x86-64-v4", "x86-64-v3", "x86-64-v2")
    if env.glibc_version < (2, 37):
        assert env.legacy_subdirs[0] == "tls/haswell/avx512_1/x86_64"
    env32 = loader_env_for_root("/", elfclass=32, machine=EM_386, cpu=intel, inhibit_cache=True)
    assert (env32.platform, env32.hwcaps) == ("i686", ())
    assert loader_env_for_root("/", machine=EM_X86_64, cpu=Cpu(), inhibit_cache=True).hwcaps == ()


def test_legacy_cache_ok_follows_search_cache():
    """The hwcap words ldconfig 2.36 writes for tls/, xeon_phi/, haswell/, i686/, avx512_1/, x86_64/ subdirs."""
    words = {"tls": 1 << 63, "xeon_phi": 1 << 51, "haswell": 1 << 50, "i686": 1 << 49, "avx512_1": 0x4,
             "x86_64": 0x2, "haswell/x86_64": (1 << 50) | 0x2}

    def taken(seen):
        ok = legacy_cache_ok(seen.hwcap_names, seen.platform)
        return {sub for sub, word in words.items() if ok(word)}

    assert taken(x86_64_loader(parse_cpuinfo(CPUS["intel-xeon-avx512"][0]))) == {
        "tls", "haswell", "avx512_1", "x86_64", "haswell/x86_64"}
    assert taken(x86_64_loader(parse_cpuinfo(CPUS["intel-xeon-phi"][0]))) == {"tls", "xeon_phi", "x86_64"}
    assert taken(x86_64_loader(parse_cpuinfo(CPUS["amd-zen4"][0]))) == {"tls", "x86_64"}
    assert taken(i386_loader(parse_cpuinfo(CPUS["amd-zen4"][0]))) == {"tls", "i686"}


@pytest.fixture(scope="module")
def legacy_root(tmp_path_factory) -> Path:
    """A glibc root whose ld.so.cache (ldconfig -r) has legacy hwcap entries for one library."""
    if shutil.which("ldconfig") is None and not os.path.exists("/sbin/ldconfig"):
        pytest.skip("needs ldconfig")
    r = tmp_path_factory.mktemp("legacy-root")
    make_glibc_root(r)
    (r / "etc/ld.so.conf").write_text("/opt/leg/lib\n")
    for sub in ("", "x86_64", "haswell", "xeon_phi", "avx512_1"):
        build_lib(r / "opt/leg/lib" / sub, "libleg.so.1")
    build_exe(r / "bin", "app", needed=("libleg.so.1",))
    subprocess.run([shutil.which("ldconfig") or "/sbin/ldconfig", "-r", str(r)], check=True, capture_output=True)
    return r


@pytest.mark.parametrize("name,sub", [("intel-xeon-avx512", "haswell"), ("intel-xeon-phi", "xeon_phi"),
                                      ("amd-zen4", "x86_64")])
def test_cache_lookup_takes_the_legacy_entry_the_cpu_allows(legacy_root, name, sub):
    env = loader_env_for_root(str(legacy_root), cpu=parse_cpuinfo(CPUS[name][0]))
    lines = format_ldd(resolve_tree(env, "/bin/app")).splitlines()
    if env.glibc_version >= (2, 37):
        sub = ""  # ldconfig writes no legacy entries, the loader takes none
    assert f"\tlibleg.so.1 => /opt/leg/lib/{sub + '/' if sub else ''}libleg.so.1" in lines
