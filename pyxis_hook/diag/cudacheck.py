"""The image's CUDA against the host driver: its runtimes, its NVIDIA_REQUIRE_*, its forward-compat driver.

ldcheck's CUDA findings, kept apart from the loader's: they ask what the
image needs (`libcudart.so.X.Y` files, `NVIDIA_REQUIRE_CUDA`, a legacy
`CUDA_VERSION`) and whether the host driver or the image's forward-compat
driver provides it.  Every verdict is the hook's own decision
(`plan.cuda_compat`, `spec.require`), so ldcheck never disagrees with what
a start would do.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Mapping

from pyxis_hook.diag.findings import Finding
from pyxis_hook.errors import PathError, RequirementError
from pyxis_hook.plan.build import COMPAT_DIR, ContainerFacts, cuda_compat
from pyxis_hook.record import record, replace
from pyxis_hook.rootfs import try_resolve_in_root

#: where CUDA images keep the runtime (besides the search dirs); the forward-compat driver's
#: dir is plan.COMPAT_DIR, read by container.container_facts as the hook reads it
CUDA_DIRS = ("/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib",
             "/usr/local/cuda/targets/sbsa-linux/lib")

CUDART_PREFIX = "libcudart.so."



def driver_major_of(version: str | None) -> int | None:
    """535 of "535.104.05" (inventory's version order); None when unknown or not a driver version."""
    from pyxis_hook.host.inventory import driver_major

    return driver_major(version)


def lib_version(name: str) -> str | None:
    """The driver version in a versioned driver library file name (libcuda.so.550.54.15 -> 550.54.15)."""
    from pyxis_hook.host import inventory

    m = re.match(inventory.VERSIONED_RE, name)
    return m.group(2) if m else None


def compat_verdict(rootfs: str, real: str, facts: ContainerFacts | None, driver_version: str | None,
                   config=None) -> tuple[bool, str]:
    """Whether NVIDIA's forward-compat rule (`plan.cuda_compat`, capabilities and cuda-compat aside)
    lets the compat library at root-relative `real` serve this host driver, and the rule's note.

    The image's COMPAT_DIR is judged by its libcuda as the hook reads it (`facts`); a copy
    elsewhere (a versioned /usr/local/cuda-X.Y/compat on LD_LIBRARY_PATH) by its own file name
    and, for a libcuda, its own `.note.cuda.fwd_compatibility` (`compat.read_elf_facts`).
    """
    from pyxis_hook.spec.config import Config

    d = try_resolve_in_root(rootfs, os.path.dirname(real))
    if facts is not None and facts.compat_libcuda and d is not None and d == try_resolve_in_root(rootfs, COMPAT_DIR):
        judged = facts
    else:
        version = lib_version(os.path.basename(real))
        drivers = _note_of(rootfs, real) if os.path.basename(real).startswith("libcuda.so.") else None
        judged = ContainerFacts(rootfs, compat_libcuda=f"libcuda.so.{version}" if version else "",
                                compat_drivers=drivers)
        if not version:
            return False, f"{real} has no driver version in its name"
    use, note = cuda_compat(replace(config or Config(), cuda_compat="ldconfig"), ("compute",), judged, driver_version)
    return use, note.removeprefix("cuda-compat: ")


def _note_of(rootfs: str, path: str) -> tuple[int, ...] | None:
    """The driver branches of a library's forward-compat note (None: no note, or unreadable), read
    by the hook's own reader."""
    from pyxis_hook.plan import compat

    from pyxis_hook.rootfs import RootFS

    try:
        with RootFS(rootfs) as rfs:  # through fds inside the root: a swapped link never reaches the host
            fd = rfs.open_regular(path)
    except (OSError, PathError):
        return None
    try:
        return compat.read_elf_facts(fd, os.fstat(fd).st_size, os.uname().machine, True)[3]
    except compat.ElfFactsError:  # the reader's "cannot make sense of it": as without a note
        return None
    finally:
        os.close(fd)


# ------------------------------------------------------------------ CUDA compatibility


@record
class CudaFacts:
    """The CUDA runtimes the image ships (the forward-compat driver is `ContainerFacts.compat_*`,
    read by `container.container_facts` as the hook reads it)."""

    cudart: tuple[tuple[str, int], ...] = ()  # (root-relative path, version as 12040)


def cuda_facts(rootfs: str, search_dirs) -> CudaFacts:
    from pyxis_hook.host.cudaversion import parse_cuda_version

    found: dict[str, int] = {}
    for d in dict.fromkeys(tuple(search_dirs) + CUDA_DIRS):
        host = try_resolve_in_root(rootfs, d)
        if host is None or not os.path.isdir(host):
            continue
        for p in sorted(glob.glob(os.path.join(glob.escape(host), CUDART_PREFIX + "*"))):
            version = parse_cuda_version(os.path.basename(p)[len(CUDART_PREFIX):])
            if version is not None:
                found.setdefault(f"{d.rstrip('/')}/{os.path.basename(p)}", version)
    return CudaFacts(tuple(found.items()))


def cuda_findings(env: Mapping[str, str], cuda: CudaFacts, host_cuda: int | None, driver_version: str | None,
                  config, facts: ContainerFacts | None = None, capabilities=("compute",)) -> list[Finding]:
    """The image's CUDA needs against the host driver, and what its forward-compat driver does.

    Whether the compat driver bridges a gap is the hook's own decision
    (`plan.cuda_compat` on the hook's `ContainerFacts`): "bridges the gap"
    exactly when the hook puts COMPAT_DIR first, else the rule's note says why not.
    """
    from pyxis_hook.spec import require
    from pyxis_hook.host.cudaversion import format_cuda_version

    out: list[Finding] = []
    facts = facts or ContainerFacts(rootfs="")
    bridge, note = cuda_compat(config, capabilities, facts, driver_version)
    why_not = note.removeprefix("cuda-compat: ")
    lib = f"{COMPAT_DIR}/{facts.compat_libcuda}"
    host_text = format_cuda_version(host_cuda) if host_cuda else None
    if facts.compat_libcuda and not bridge:
        out.append(Finding("info", "compat-not-used", why_not,
                           "the hook puts the image's forward-compat driver first only by NVIDIA's rule (the "
                           "note's driver branches, else a newer major), for compute, with cuda-compat = "
                           "\"ldconfig\"; otherwise it leaves it out", "nothing to do (or drop "
                           f"{COMPAT_DIR} from the image)"))

    def gap(code: str, what: str, need: str) -> Finding:
        if bridge:
            return Finding("warning", "cuda-needs-compat",
                           f"{what}; the image's forward-compat {lib} "
                           f"(driver {driver_major_of(lib_version(facts.compat_libcuda))}) bridges the gap",
                           "forward compatibility works only on data-center GPUs with a supported driver branch; "
                           "elsewhere CUDA fails with error 804",
                           "to avoid depending on it, update the host driver")
        why = "a CUDA runtime newer than the driver fails: 'CUDA driver version is insufficient for CUDA runtime version'"
        if facts.compat_libcuda:
            why += f"; the image's forward-compat driver cannot bridge it: {why_not}"
        return Finding("error", code, what, why,
                       f"update the host driver to one that supports CUDA {need} "
                       f"or use an image built for CUDA {host_text} or older")

    try:
        reqs = require.parse_requirements(env, config.disable_require)
    except RequirementError as e:
        out.append(Finding("error", "bad-requirement", str(e),
                           "the hook refuses a container whose NVIDIA_REQUIRE_* cannot be parsed",
                           "fix the variable in the image, or set NVIDIA_DISABLE_REQUIRE=true"))
        reqs = ()
    if host_cuda is None:
        if reqs or cuda.cudart:
            out.append(Finding("info", "host-cuda-unknown", "the host driver's CUDA version is unknown",
                               "cuDriverGetVersion of the host libcuda could not be asked, so the image's "
                               "CUDA needs cannot be checked", "run `pyxis-hook info` on the host"))
        return out
    hf = require.HostFacts(cuda=host_text, driver=driver_version)
    for req in reqs:
        if not require.requirement_holds(req, hf, None):
            cuda_terms = [str(t) for g in req.groups for t in g if t.key == "cuda"]
            need = cuda_terms[0].lstrip("cuda<>=!") if cuda_terms else req.expression
            label = (f"CUDA_VERSION={env.get('CUDA_VERSION', '')!r} (legacy image without NVIDIA_REQUIRE_CUDA)"
                     if req.variable == "CUDA_VERSION" else f"{req.variable}={req.expression!r}")
            out.append(gap("cuda-version-mismatch",
                           f"{label} needs CUDA {need} but the host driver {driver_version} provides CUDA {host_text}",
                           need))
    for path, version in cuda.cudart:
        if version > host_cuda:
            out.append(gap("cudart-newer-than-driver",
                           f"{path} is CUDA {format_cuda_version(version)} but the host driver "
                           f"{driver_version} provides CUDA {host_text}", format_cuda_version(version)))
    return out
