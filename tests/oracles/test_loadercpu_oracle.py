"""pyxis_hook.loader.cpu against glibc's own loader, on this CPU and on this CPU with features switched off.

`GLIBC_TUNABLES=glibc.cpu.hwcaps=-FEATURE` makes ld.so treat FEATURE as not
usable, which gives the loader a CPU this machine is not; the model is given
the same CPU (this machine's features less FEATURE).  For each, ld.so's
`--list-diagnostics` (glibc >= 2.33) says which platform, legacy hwcap bits
and glibc-hwcaps subdirectories it chose, and `LD_DEBUG=libs` prints the
subdirectories it searches under a --library-path dir; both must be ours.
On an Intel CPU this checks the "haswell"/"xeon_phi"/"avx512_1" rule, on any
x86-64 CPU the x86-64-v2/v3/v4 levels.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from fixtures.synth import build_exe
from pyxis_hook.loader import cpu as loadercpu
from pyxis_hook.record import replace
from pyxis_hook.loader.loaderenv import EM_386, EM_X86_64, loader_env_for_root

LDSO64, LDSO32 = "/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux.so.2"
NOWHERE = "/nonexistent-pyxis-dir"

#: names of glibc's legacy hwcap bits (sysdeps/x86/dl-procinfo.c), bit 0 first
HWCAP_BITS = ("sse2", "x86_64", "avx512_1")

#: features glibc 2.33+ lets the hwcaps tunable switch off and that the model looks at; a loader that ignores
#: one shows no change in its active feature words, and that case is skipped
SWITCHABLE = ("AVX", "AVX2", "BMI1", "BMI2", "FMA", "LZCNT", "MOVBE", "POPCNT", "SSSE3", "SSE4_1", "SSE4_2",
              "CMOV", "CX8", "SSE2", "AVX512F", "AVX512CD", "AVX512BW", "AVX512DQ", "AVX512VL", "AVX512ER",
              "AVX512PF")

#: the i386 loader picks i686/i586 from the CPUID bits of CMOV/CX8, which the tunable leaves alone
NOT_ON_I386 = ("CMOV", "CX8")


def run_ldso(ldso: str, args: list[str], tunable: str | None) -> subprocess.CompletedProcess:
    env = {"LD_DEBUG": "libs"} if "--list" in args else {}
    if tunable:
        env["GLIBC_TUNABLES"] = f"glibc.cpu.hwcaps=-{tunable}"
    return subprocess.run([ldso, *args], env=env, capture_output=True, text=True, timeout=60, cwd="/")


def diagnostics(ldso: str, tunable: str | None) -> dict[str, str]:
    out = run_ldso(ldso, ["--list-diagnostics"], tunable).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def searched_subdirs(ldso: str, exe: str, tunable: str | None) -> tuple[str, ...]:
    """The subdirectories ld.so tries in a --library-path dir, in order, each once ('' = the dir itself)."""
    err = run_ldso(ldso, ["--library-path", NOWHERE, "--list", exe], tunable).stderr
    m = re.search(r"search path=(\S+)\s+\((?:--library-path|LD_LIBRARY_PATH)\)", err)
    assert m, err
    subs = [p[len(NOWHERE) + 1:] if p != NOWHERE else "" for p in m.group(1).split(":")]
    return tuple(dict.fromkeys(subs))


def glibc_view(diag: dict[str, str]) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    """(platform, legacy hwcap bit names, supported glibc-hwcaps subdirs) as the loader reports them."""
    masked = int(diag["dl_hwcap"], 16) & int(diag["dl_hwcap_important"], 16)
    bits = tuple(name for i, name in enumerate(HWCAP_BITS) if masked >> i & 1)
    names = [n for n in diag["dl_hwcaps_subdirs"].strip('"').split(":") if n]
    active = int(diag["dl_hwcaps_subdirs_active"], 16)
    return diag["dl_platform"].strip('"'), bits, tuple(n for i, n in enumerate(names) if active >> i & 1)


def active_words(diag: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in diag.items() if ".active[" in k}


@pytest.fixture(scope="module")
def exe32(tmp_path_factory) -> str:
    return str(build_exe(tmp_path_factory.mktemp("cpu-oracle"), "exe32", m32=True))


LOADERS = [(LDSO64, 64, EM_X86_64), (LDSO32, 32, EM_386)]


@pytest.mark.parametrize("tunable", (None,) + SWITCHABLE)
@pytest.mark.parametrize("ldso,elfclass,machine", LOADERS, ids=["x86-64", "i386"])
def test_model_matches_the_loader(request, ldso, elfclass, machine, tunable):
    if not os.path.exists(ldso):
        pytest.skip(f"needs glibc's loader {ldso}")
    base = diagnostics(ldso, None)
    if "dl_platform" not in base:
        pytest.skip("this loader has no --list-diagnostics (glibc < 2.33)")
    cpu = loadercpu.host_cpu()
    if tunable is not None:
        if tunable not in cpu.features:
            pytest.skip(f"this CPU has no {tunable}: nothing to switch off")
        if machine == EM_386 and tunable in NOT_ON_I386:
            pytest.skip(f"the i386 loader's platform follows CPUID's {tunable} bit, which the tunable keeps")
        cpu = replace(cpu, features=cpu.features - {tunable})
    diag = diagnostics(ldso, tunable)
    if tunable is not None and active_words(diag) == active_words(base):
        pytest.skip(f"this glibc's tunable does not switch {tunable} off")

    env = loader_env_for_root("/", elfclass=elfclass, machine=machine, interp=ldso, cpu=cpu, inhibit_cache=True)
    seen = loadercpu.x86_64_loader(cpu) if machine == EM_X86_64 else loadercpu.i386_loader(cpu)
    assert glibc_view(diag) == (seen.platform, seen.hwcap_names, seen.hwcaps)
    assert env.platform == seen.platform

    exe = "/bin/true" if elfclass == 64 else request.getfixturevalue("exe32")
    ours = tuple(f"glibc-hwcaps/{h}" for h in env.hwcaps) + env.legacy_subdirs + ("",)
    assert searched_subdirs(ldso, exe, tunable) == ours
