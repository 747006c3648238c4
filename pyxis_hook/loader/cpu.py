"""What glibc's ld.so makes of the x86 CPU it runs on: $PLATFORM, legacy hwcap subdirs, glibc-hwcaps levels.

The loader does not take AT_PLATFORM from the kernel as is, and its library
search path depends on the CPU, so resolving a library "as ld.so would" needs
the CPU as glibc sees it.  The rules, from glibc's sources:

* `sysdeps/x86/cpu-features.c` (`init_cpu_features`): the vendor string of
  CPUID leaf 0 decides the kind ("GenuineIntel" is Intel, whatever the
  family).  On x86-64 `dl_hwcap` is the "x86_64" bit; on Intel only, with
  AVX512CD usable, AVX512ER+AVX512PF make the platform "xeon_phi", and
  without AVX512ER, AVX512BW+DQ+VL add the "avx512_1" bit; otherwise AVX2,
  FMA, BMI1, BMI2, LZCNT, MOVBE and POPCNT make it "haswell".  Every other
  vendor keeps the kernel's AT_PLATFORM ("x86_64").  The i386 loader sets
  the "sse2" bit when SSE2 is usable, and the platform "i686" with CMOV,
  "i586" with CX8.  Older Zhaoxin models have AVX and AVX2 switched off.
* `sysdeps/x86/dl-hwcap.h`, `dl-procinfo.c`: the bit names ("sse2",
  "x86_64", "avx512_1") and the mask of bits that make subdirectories
  (HWCAP_IMPORTANT: x86_64 and avx512_1 on x86-64, sse2 on i386).
* `elf/dl-hwcaps.c` (`_dl_important_hwcaps`, before glibc 2.37): the legacy
  subdirectories are every subset of (masked hwcap names, platform, "tls"),
  see `legacy_subdirs`.
* `sysdeps/x86/get-isa-level.h` with `sysdeps/x86_64/dl-hwcaps-subdirs.c`:
  the glibc-hwcaps subdirectories x86-64-v2/v3/v4 (glibc >= 2.33).

Features are named as glibc names them (`CPU_FEATURE_USABLE_P`).  On the
host they come from /proc/cpuinfo's flags, which the kernel clears for a
feature the OS does not enable (AVX-512 without its XSAVE state, say), the
same condition that makes glibc call a feature not usable.  Everything but
`host_cpu` is a pure function, so any CPU can be described and checked.
"""

from __future__ import annotations

from pyxis_hook.record import record

#: glibc feature name -> the /proc/cpuinfo flag the kernel prints for it (LZCNT is "abm", SSE3 "pni")
CPUINFO_FLAGS = {
    "CMOV": "cmov", "CX8": "cx8", "FPU": "fpu", "FXSR": "fxsr", "MMX": "mmx", "SSE": "sse", "SSE2": "sse2",
    "CMPXCHG16B": "cx16", "LAHF64_SAHF64": "lahf_lm", "POPCNT": "popcnt", "SSE3": "pni", "SSSE3": "ssse3",
    "SSE4_1": "sse4_1", "SSE4_2": "sse4_2",
    "AVX": "avx", "AVX2": "avx2", "BMI1": "bmi1", "BMI2": "bmi2", "F16C": "f16c", "FMA": "fma", "LZCNT": "abm",
    "MOVBE": "movbe",
    "AVX512F": "avx512f", "AVX512BW": "avx512bw", "AVX512CD": "avx512cd", "AVX512DQ": "avx512dq",
    "AVX512VL": "avx512vl", "AVX512ER": "avx512er", "AVX512PF": "avx512pf",
}

#: features each x86-64 ISA level needs on top of the one below (get-isa-level.h); the first is the baseline
ISA_LEVELS = (
    ("baseline", ("CMOV", "CX8", "FPU", "FXSR", "MMX", "SSE", "SSE2")),
    ("x86-64-v2", ("CMPXCHG16B", "LAHF64_SAHF64", "POPCNT", "SSE3", "SSSE3", "SSE4_1", "SSE4_2")),
    ("x86-64-v3", ("AVX", "AVX2", "BMI1", "BMI2", "F16C", "FMA", "LZCNT", "MOVBE")),
    ("x86-64-v4", ("AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL")),
)

#: what makes an Intel CPU's platform "haswell" (cpu-features.c)
HASWELL = ("AVX2", "FMA", "BMI1", "BMI2", "LZCNT", "MOVBE", "POPCNT")

#: the vendor strings glibc treats as Zhaoxin, and the (family, model) pairs it switches AVX/AVX2 off for
ZHAOXIN_VENDORS = ("CentaurHauls", "Shanghai")
ZHAOXIN_NO_AVX = ((6, 0x0F), (6, 0x19), (7, 0x1B), (7, 0x3B))

#: AT_PLATFORM the kernel passes to 64-bit and to 32-bit x86 processes
KERNEL_PLATFORM_64, KERNEL_PLATFORM_32 = "x86_64", "i686"

#: bits of a legacy ld.so.cache entry's hwcap word (dl-procinfo.c, dl-hwcap.h): hwcap names from bit 0,
#: platforms from bit 48 (_DL_FIRST_PLATFORM), "tls" bit 63; ldconfig < 2.37 sets them for such subdirs
HWCAP_BITS = {"sse2": 0, "x86_64": 1, "avx512_1": 2}
PLATFORM_BITS = {"i586": 48, "i686": 49, "haswell": 50, "xeon_phi": 51}
PLATFORM_MASK = 0xF << 48
TLS_BIT = 1 << 63


@record
class Cpu:
    """One x86 CPU: the CPUID vendor string (blanks stripped), family, model, and its usable features."""

    vendor: str = ""
    family: int = 0
    model: int = 0
    features: frozenset = frozenset()


@record
class LoaderCpu:
    """What one loader derives from a Cpu.

    `platform` is $PLATFORM (glibc's `dl_platform`); `hwcap_names` the legacy
    hwcap bits that make subdirectories, in bit order; `hwcaps` the
    glibc-hwcaps subdirectories the CPU supports, most preferred first.
    """

    platform: str
    hwcap_names: tuple[str, ...]
    hwcaps: tuple[str, ...]


def parse_cpuinfo(text: str) -> Cpu:
    """The first processor of a /proc/cpuinfo text (every core of a node reports the same features)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return Cpu(vendor=fields.get("vendor_id", ""), family=_int(fields.get("cpu family")),
               model=_int(fields.get("model")),
               features=frozenset(name for name, flag in CPUINFO_FLAGS.items() if flag in flags))


def _int(text: str | None) -> int:
    return int(text) if text and text.isdigit() else 0


_HOST: dict[str, Cpu] = {}


def host_cpu(path: str = "/proc/cpuinfo") -> Cpu:
    """This machine's CPU, read once; an unreadable cpuinfo is a CPU without features (the kernel's platform)."""
    cpu = _HOST.get(path)
    if cpu is None:
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 16)  # the first processor's block is all that is read
        except OSError:
            data = b""
        cpu = _HOST[path] = parse_cpuinfo(data.decode("ascii", "replace"))
    return cpu


def usable(cpu: Cpu) -> frozenset:
    """The features glibc calls usable: the CPU's, less AVX/AVX2 on the Zhaoxin models glibc turns them off for."""
    if cpu.vendor in ZHAOXIN_VENDORS and (cpu.family, cpu.model) in ZHAOXIN_NO_AVX:
        return cpu.features - {"AVX", "AVX2"}
    return cpu.features


def isa_levels(features: frozenset) -> tuple[str, ...]:
    """glibc-hwcaps subdirectories these features support, most preferred first (cumulative, as glibc's)."""
    supported: list[str] = []
    for name, needs in ISA_LEVELS:
        if not all(f in features for f in needs):
            break
        supported.append(name)
    return tuple(reversed(supported[1:]))


def x86_64_loader(cpu: Cpu) -> LoaderCpu:
    """The x86-64 (and x32) loader's view: Intel's platform override and avx512_1 bit, the ISA levels."""
    features = usable(cpu)
    names = ["x86_64"]
    platform = None
    if cpu.vendor == "GenuineIntel":
        if "AVX512CD" in features:
            if "AVX512ER" in features:
                if "AVX512PF" in features:
                    platform = "xeon_phi"
            elif all(f in features for f in ("AVX512BW", "AVX512DQ", "AVX512VL")):
                names.append("avx512_1")
        if platform is None and all(f in features for f in HASWELL):
            platform = "haswell"
    return LoaderCpu(platform=platform or KERNEL_PLATFORM_64, hwcap_names=tuple(names),
                     hwcaps=isa_levels(features))


def i386_loader(cpu: Cpu) -> LoaderCpu:
    """The i386 loader's view: the sse2 bit, i686/i586 from CMOV/CX8, no glibc-hwcaps subdirectories."""
    features = usable(cpu)
    platform = "i686" if "CMOV" in features else "i586" if "CX8" in features else KERNEL_PLATFORM_32
    return LoaderCpu(platform=platform, hwcap_names=("sse2",) if "SSE2" in features else (), hwcaps=())


def legacy_subdirs(hwcap_names: tuple[str, ...], platform: str | None) -> tuple[str, ...]:
    """The legacy hwcap subdirectories a glibc < 2.37 loader tries in each search dir, before the dir itself.

    `_dl_important_hwcaps` takes the list (hwcap names in bit order,
    platform, "tls") and makes every non-empty subset of it, each written
    last element first, the subsets that have element i before those that
    lack it, for the highest i first.  Repeats (the "x86_64" bit with the
    "x86_64" platform) are tried twice by glibc with the same outcome; they
    are listed once here.
    """
    parts = list(hwcap_names) + ([platform] if platform else []) + ["tls"]
    n = len(parts)
    out: list[str] = []
    for i in range(2 ** n - 1):
        chosen = (2 ** n - 1) & ~i
        sub = "/".join(parts[j] for j in reversed(range(n)) if chosen >> j & 1)
        if sub not in out:
            out.append(sub)
    return tuple(out)


def legacy_cache_ok(hwcap_names: tuple[str, ...], platform: str | None):
    """Which legacy ld.so.cache entries a glibc < 2.37 loader takes: a predicate on the entry's hwcap word.

    `search_cache` (elf/dl-cache.c) skips an entry with a hwcap bit outside
    the loader's masked hwcap bits, its platform bits and "tls", and one
    whose platform bits are not exactly the loader's platform (a platform
    glibc has no bit for, like "x86_64", matches no entry with one).
    """
    allowed = PLATFORM_MASK | TLS_BIT
    for name in hwcap_names:
        allowed |= 1 << HWCAP_BITS[name]
    wanted = 1 << PLATFORM_BITS[platform] if platform in PLATFORM_BITS else -1

    def ok(hwcap: int) -> bool:
        platform_bits = hwcap & PLATFORM_MASK
        return not hwcap & ~allowed and (not platform_bits or platform_bits == wanted)

    return ok
