"""One target per parser of untrusted input: (strategy, function, errors it may raise).

Inputs are hypothesis strategies: random bytes and text, and mutations of
valid documents (a serialized ld.so.cache, a real ELF file of this machine, an
OCI state), so that the parsers are driven past their first check.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Callable, NamedTuple

from hypothesis import strategies as st

from pyxis_hook import nogpu
from pyxis_hook.spec import config, oci, require
from pyxis_hook.host import cgroup, gpufiles, gpus
from pyxis_hook.engines import cdihook, enroot
from pyxis_hook.loader import cachelookup, cacheprint, cachewrite, elf, elfhead, ldcache
from pyxis_hook.errors import PyxisHookError


class Target(NamedTuple):
    strategy: st.SearchStrategy
    run: Callable[[object], object]
    allowed: tuple[type[BaseException], ...]


# ------------------------------------------------------------------ mutations

def _mutations(seed: bytes, max_flips: int = 8) -> st.SearchStrategy[bytes]:
    """`seed` with a few bytes overwritten, then cut at some length (or not)."""
    n = len(seed)
    flips = st.lists(st.tuples(st.integers(0, max(n - 1, 0)), st.integers(0, 255)), max_size=max_flips)

    def mutate(args):
        cut, fl = args
        b = bytearray(seed)
        for pos, val in fl:
            b[pos] = val
        return bytes(b[:cut])
    return st.tuples(st.integers(0, n), flips).map(mutate)


def _cache_seeds() -> list[bytes]:
    e = ldcache.CacheEntry
    x64 = ldcache.FLAG_X8664_LIB64_LIBC6
    entries = (e("libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1", x64, 0, 0),
               e("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", x64, 0, 0),
               e("libz.so.1", "/usr/lib32/libz.so.1", 3, 0, 0))
    gen = "ldconfig (Debian GLIBC 2.36-9+deb12u10) stable release version 2.36"
    return [cachewrite.serialize_cache(entries, gen, fmt) for fmt in ("new", "compat", "old")]


def _elf_seed() -> bytes:
    """The first 16 KiB of a small ELF program of this machine (its header, program headers, dynamic section)."""
    for path in ("/bin/true", "/usr/bin/true", sys.executable):
        try:
            with open(path, "rb") as f:
                data = f.read(1 << 14)
            if data[:4] == b"\x7fELF":
                return data
        except OSError:
            continue
    return b"\x7fELF\x02\x01\x01" + bytes(57)


def _cache(data: bytes) -> None:
    c = ldcache.parse_cache(data, "fuzz")
    cacheprint.format_ldconfig_p(c, "fuzz")
    cachelookup.lookup(c, "libz.so.1")


def _elf_header(data: bytes) -> None:
    elfhead.parse_header(data[:64], "fuzz")


def _with_file(data: bytes, fn):
    with tempfile.NamedTemporaryFile(prefix="pyxis-fuzz-") as f:
        f.write(data)
        f.flush()
        return fn(f.name, f.fileno(), len(data))


def _elf_full(data: bytes) -> None:
    """The pyelftools reader discovery uses (dynamic section, notes)."""
    _with_file(data, lambda path, fd, size: elf.read_elf(path))


def _elf_facts(data: bytes) -> None:
    """The stdlib reader the merge uses on an image's files (SONAME, DT_NEEDED, the compat note)."""
    from pyxis_hook.plan.compat import read_elf_facts

    _with_file(data, lambda path, fd, size: read_elf_facts(fd, size, "x86_64", want_note=True))


_STATE = (b'{"ociVersion": "1.0.2", "id": "c1", "status": "creating", "pid": 4242, '
          b'"bundle": "/run/c1", "annotations": {"a": "b"}}')
_CONFIG = (b'{"ociVersion": "1.0.2", "root": {"path": "rootfs"}, "process": {"env": '
           b'["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=0,1"]}, "annotations": {"x": "y"}, '
           b'"linux": {"devices": [{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0}]}}')
_CONF = b'driver-root = "/"\nldcache = "merge"\nlog-level = "info"\nslurm-policy = "allocation"\n'


def _json_like() -> st.SearchStrategy:
    leaves = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
    return st.recursive(leaves, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                        max_leaves=20)


def _json_bytes(base: bytes) -> st.SearchStrategy[bytes]:
    import json

    doc = json.loads(base)
    keys = list(doc)

    def swap(args):
        key, value = args
        d = dict(doc)
        d[key] = value
        return json.dumps(d).encode()
    return st.one_of(_mutations(base), st.binary(max_size=200),
                     st.tuples(st.sampled_from(keys), _json_like()).map(swap))


_VARS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "NVIDIA_REQUIRE_CUDA",
         "NVIDIA_REQUIRE_DRIVER", "NVIDIA_DISABLE_REQUIRE", "CUDA_VERSION", "NVIDIA_MIG_CONFIG_DEVICES",
         "NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_IMEX_CHANNELS", "SLURM_STEP_GPUS", "SLURM_JOB_GPUS",
         "SLURM_JOB_ID", "GPU_DEVICE_ORDINAL", "_CONDOR_AssignedGPUs", "LSB_JOBID", "PBS_JOBID", "FLUX_JOB_ID")
_SOUP = st.lists(st.sampled_from(["0", "1", "3", "all", "none", "void", "ALL", "-1", "GPU-", "MIG-", ":", ",",
                                  "0000:06:00.0", "GPU-00000000-aaaa-bbbb-cccc-000000000000", "cuda>=", "11.0",
                                  "driver<", "brand=tesla", " ", "compute", "utility", "10000", "CUDA1", "\x00",
                                  "é", "9" * 30]), max_size=8).map("".join)
_ENVS = st.dictionaries(st.sampled_from(_VARS), _SOUP | st.text(max_size=30), max_size=6)


def _host():
    g = [gpus.Gpu(index=i, minor=i, uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-{i:012x}", bus_id=f"0000:{6 + i:02x}:00.0",
                  model="NVIDIA A100", excluded=False, proc_name=f"0000:{6 + i:02x}:00.0") for i in range(4)]
    return gpus.HostGpus(driver_version="535.216.03", gpus=tuple(g), majors=gpus.DeviceMajors(195, 511, 510, 509))


_HOST = _host()


def _request(env: dict) -> None:
    from pyxis_hook.spec.request import resolve_request

    nogpu.void_reason(env)
    require.parse_requirements(env)
    resolve_request(env, {}, _HOST, config.Config(), None, cuda_version="12.2")


def _text_lines(vocab: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(vocab) | st.text(max_size=40), max_size=8).map("\n".join)


_CGROUP = ["0::/user.slice/job_1/step_0", "5:devices:/slurm/uid_0/job_1/step_0", "1:name=systemd:/", "x", ":",
           "12:cpu,cpuacct:/a\\040b"]
_MOUNTINFO = ["36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
              "25 1 0:22 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices", "1 2 3", "a b c d e f - g"]
_DEVICES = ["c 195:* rwm", "a *:* rwm", "c 195:0 r", "b 8:0 m", "c 195:x rw", "c"]
_PROC_DEVICES = ["Character devices:", "195 nvidia-frontend", "511 nvidia-uvm", "Block devices:", "x y"]


def _proc_text(text: str) -> None:
    cgroup.parse_proc_cgroup(text)
    cgroup.parse_mountinfo(text)
    cgroup.parse_devices_list(text)
    gpufiles.parse_driver_version(text)
    gpufiles.parse_information(text)
    gpufiles.parse_proc_devices(text)
    gpufiles.parse_mig_minors(text)
    gpufiles.parse_access_minor(text)
    gpus.parse_bus_id(text)


def _ld_so_conf(text: bytes) -> None:
    from pyxis_hook.loader.ldconf import read_ld_so_conf

    with tempfile.TemporaryDirectory(prefix="pyxis-fuzz-") as root:
        os.makedirs(os.path.join(root, "etc/ld.so.conf.d"))
        with open(os.path.join(root, "etc/ld.so.conf"), "wb") as f:
            f.write(text)
        with open(os.path.join(root, "etc/ld.so.conf.d/a.conf"), "wb") as f:
            f.write(b"/usr/local/lib\n")
        read_ld_so_conf(root)


_LDCONF = ["include /etc/ld.so.conf.d/*.conf", "/usr/lib/x86_64-linux-gnu", "include ../../etc/*", "hwcap 1 x",
           "/opt/a:/opt/b", "include", "  # c", "include /etc/ld.so.conf", "/lib64\t/usr/lib64,/x"]


def _cdi_args(text: str) -> None:
    for parse in (cdihook.parse_link, cdihook.parse_lib):
        try:
            parse(text)
        except PyxisHookError as e:
            assert "\n" not in str(e)
            raise


def _environ(text: str) -> None:
    enroot.parse_environ(text)


def _one_line(fn):
    """`fn`, and every error of ours it raises is one line."""
    def run(x):
        try:
            return fn(x)
        except PyxisHookError as e:
            if "\n" in str(e) or not str(e):
                raise AssertionError(f"error is not one line: {str(e)!r}") from e
            raise
    return run


TARGETS: dict[str, Target] = {
    "ldcache": Target(st.one_of(*[_mutations(s, 12) for s in _cache_seeds()], st.binary(max_size=400)),
                      _one_line(_cache), (PyxisHookError,)),
    "elf-header": Target(_mutations(_elf_seed()[:64], 16) | st.binary(max_size=80), _one_line(_elf_header),
                         (PyxisHookError,)),
    "elf-dynamic": Target(_mutations(_elf_seed(), 24), _one_line(_elf_full), (PyxisHookError,)),
    "elf-facts": Target(_mutations(_elf_seed(), 24), _one_line(_elf_facts), (PyxisHookError,)),
    "oci-state": Target(_json_bytes(_STATE), _one_line(lambda d: oci.parse_state(d)), (PyxisHookError,)),
    "oci-config": Target(_json_bytes(_CONFIG), _one_line(lambda d: oci.parse_config(d, "/run/b")), (PyxisHookError,)),
    "pyxis-conf": Target(_mutations(_CONF, 12) | st.binary(max_size=200), _one_line(lambda d: config.parse_config(d, "fuzz.conf")),
                         (PyxisHookError,)),
    "environment": Target(_ENVS, _one_line(_request), (PyxisHookError,)),
    "proc-text": Target(_text_lines(_CGROUP + _MOUNTINFO + _DEVICES + _PROC_DEVICES), _one_line(_proc_text),
                        (PyxisHookError,)),
    "ld-so-conf": Target(_text_lines(_LDCONF).map(lambda s: s.encode("utf-8", "surrogatepass")) | st.binary(max_size=200),
                         _one_line(_ld_so_conf), (PyxisHookError,)),
    "cdi-hook-args": Target(st.text(max_size=60) | _SOUP, _cdi_args, (PyxisHookError,)),
    "enroot-environ": Target(_text_lines(["A=b", "NVIDIA_VISIBLE_DEVICES=all", "=x", "x", "A=b=c"]), _one_line(_environ),
                             (PyxisHookError,)),
}
