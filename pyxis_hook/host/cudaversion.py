"""CUDA driver API version of the host's libcuda.so.1 (`cuDriverGetVersion`), asked in a child.

`NVIDIA_REQUIRE_CUDA` and legacy `CUDA_VERSION` images are checked against
this number (12020 = CUDA 12.2).  `cuDriverGetVersion` answers without a GPU
or kernel module (tests/unit/host/test_cudaversion.py asks Debian's real driver), but loading libcuda pulls a large
closed library, its constructors and threads into whatever process loads it
— and a hook process that later calls setns(CLONE_NEWNS) must stay
single-threaded.  So the call runs in a short-lived child: `python -I -S`
with an empty environment (no PYTHONPATH, no LD_PRELOAD from the caller), a
10 s timeout, its answer printed on stdout.  Any failure is "unknown"
(None) with a reason, never an exception: the inventory records it and
requirement checks report it.
"""

from __future__ import annotations

import sys

from pyxis_hook import pathnames

TIMEOUT_S = 10

# argv[1] = library path; prints "<CUresult> <version>".
# os.environ.clear(): Python's C-locale coercion puts LC_CTYPE back into an empty environment.
_CHILD = (
    "import ctypes, os, sys\n"
    "os.environ.clear()\n"
    "lib = ctypes.CDLL(sys.argv[1])\n"
    "v = ctypes.c_int(0)\n"
    "rc = lib.cuDriverGetVersion(ctypes.byref(v))\n"
    "print(rc, v.value)\n"
)


def probe_cuda_driver_version(libcuda_host_path: str, timeout: float = TIMEOUT_S) -> tuple[int | None, str | None]:
    """(version, None) on success, else (None, reason naming the library)."""
    path = libcuda_host_path
    if not pathnames.isfile(path):
        return None, f"{path}: no such file"
    import subprocess  # only when probing (discovery), not on the hook path

    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD, path],
            env={}, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
            close_fds=True, cwd="/",
        )
    except subprocess.TimeoutExpired:
        return None, f"{path}: cuDriverGetVersion did not answer within {timeout:g} s"
    except OSError as e:
        return None, f"{path}: cannot start {sys.executable}: {e.strerror or e}"
    if proc.returncode != 0:
        if proc.returncode < 0:
            return None, f"{path}: probe killed by signal {-proc.returncode}"
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return None, f"{path}: probe failed: {last}"
    parts = proc.stdout.split()
    if len(parts) != 2 or not all(p.lstrip("-").isdigit() for p in parts):
        return None, f"{path}: probe printed {proc.stdout.strip()!r}"
    rc, version = int(parts[0]), int(parts[1])
    if rc != 0:
        return None, f"{path}: cuDriverGetVersion returned CUresult {rc}"
    if version <= 0:
        return None, f"{path}: cuDriverGetVersion gave version {version}"
    return version, None


def cuda_driver_version(libcuda_host_path: str) -> int | None:
    """The CUDA driver version (e.g. 12020) of the host libcuda, or None when it cannot be asked."""
    version, reason = probe_cuda_driver_version(libcuda_host_path)
    if reason:
        from pyxis_hook import log

        log.debug(f"CUDA driver version unknown: {reason}")
    return version


def format_cuda_version(version: int) -> str:
    """12020 -> "12.2", 11080 -> "11.8" (CUDA's encoding: 1000*major + 10*minor)."""
    return f"{version // 1000}.{(version % 1000) // 10}"


def parse_cuda_version(text: str) -> int | None:
    """"12.2" / "12.2.1" -> 12020 (patch levels are not encoded); None when not `major.minor`."""
    parts = text.strip().split(".")
    if len(parts) < 2 or not all(p.isdigit() for p in parts[:3]) or len(parts) > 3:
        return None
    return int(parts[0]) * 1000 + int(parts[1]) * 10
