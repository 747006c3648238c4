"""MIG device UUIDs asked of the driver's NVML, the one fact procfs does not publish.

`host/gpuscan.py` reads everything else from the files the kernel module
writes; a MIG device's UUID exists only inside the driver and NVML is the
only way to ask for it.  It lives apart because it is the one place that
loads a driver library into our process (through ctypes): the hook path
never needs it unless a request names a MIG UUID (`plan.prepare.with_mig_uuids`),
and everything works with MIG UUIDs unknown.  The library is always a path
from the driver's inventory, never a bare name that this process's loader
would look up (root's LD_LIBRARY_PATH or the host's cache could name
another driver's libnvidia-ml).
"""

from __future__ import annotations

from pyxis_hook.host.gpus import HostGpus, MigDevice
from pyxis_hook.record import replace

#: nvml.h: NVML_SUCCESS; every other return code is a failure we report as a number.
NVML_SUCCESS = 0
#: nvml.h: NVML_DEVICE_UUID_V2_BUFFER_SIZE (80), rounded up.
_UUID_BUFFER = 96


def fill_mig_uuids(host: HostGpus, library: str) -> HostGpus:
    """`host` with its MIG devices' UUIDs asked from NVML at `library`; a warning when NVML cannot say."""
    if not host.mig_devices or all(m.uuid for m in host.mig_devices):
        return host
    uuids, reason = nvml_mig_uuids(library)
    warnings = (f"{library}: MIG device UUIDs unknown: {reason}",) if reason else ()
    migs = tuple(_with_uuid(d, uuids.get((d.parent_uuid, d.gi, d.ci))) for d in host.mig_devices)
    return replace(host, mig_devices=migs, warnings=host.warnings + warnings)


def _with_uuid(d: MigDevice, uuid: str | None) -> MigDevice:
    return replace(d, uuid=uuid) if uuid else d


def nvml_mig_uuids(library: str) -> tuple[dict[tuple[str, int, int], str], str | None]:
    """{(parent GPU UUID, gi, ci): MIG UUID} via NVML, and a reason when NVML could not answer.

    ctypes is imported here, only when asked: the start path avoids it
    (docs/decisions/2026-12-07-start-costs.md).
    """
    import ctypes

    try:
        lib = ctypes.CDLL(library)
    except OSError as e:
        return {}, f"cannot load: {e}"
    try:
        rc = lib.nvmlInit_v2()
        if rc != NVML_SUCCESS:
            return {}, f"nvmlInit_v2 returned {rc}"
    except AttributeError as e:
        return {}, f"not an NVML library: {e}"
    out: dict[tuple[str, int, int], str] = {}
    try:
        count = ctypes.c_uint(0)
        rc = lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        if rc != NVML_SUCCESS:
            return {}, f"nvmlDeviceGetCount_v2 returned {rc}"
        buf = ctypes.create_string_buffer(_UUID_BUFFER)
        for i in range(count.value):
            dev = ctypes.c_void_p()
            if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(dev)) != NVML_SUCCESS:
                continue
            if lib.nvmlDeviceGetUUID(dev, buf, _UUID_BUFFER) != NVML_SUCCESS:
                continue
            parent = buf.value.decode()
            maxn = ctypes.c_uint(0)
            if lib.nvmlDeviceGetMaxMigDeviceCount(dev, ctypes.byref(maxn)) != NVML_SUCCESS:
                continue
            for j in range(maxn.value):
                mig = ctypes.c_void_p()
                if lib.nvmlDeviceGetMigDeviceHandleByIndex(dev, j, ctypes.byref(mig)) != NVML_SUCCESS:
                    continue
                gi, ci = ctypes.c_uint(0), ctypes.c_uint(0)
                if (lib.nvmlDeviceGetGpuInstanceId(mig, ctypes.byref(gi)) != NVML_SUCCESS
                        or lib.nvmlDeviceGetComputeInstanceId(mig, ctypes.byref(ci)) != NVML_SUCCESS
                        or lib.nvmlDeviceGetUUID(mig, buf, _UUID_BUFFER) != NVML_SUCCESS):
                    continue
                out[(parent, gi.value, ci.value)] = buf.value.decode()
    except AttributeError as e:
        return out, f"NVML lacks a MIG function: {e}"
    finally:
        try:
            lib.nvmlShutdown()
        except AttributeError:
            pass
    return out, None
