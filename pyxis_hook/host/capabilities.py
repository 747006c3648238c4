"""What belongs to each driver capability: library prefixes, binaries, firmware, IPC, ICD files.

Pure data, kept apart from the discovery code so the lists can be read and
reviewed against their source in one place.  The library lists are
*prefixes* matched against ld.so.cache keys, exactly as libnvidia-container's
`src/nvc_info.c` uses them; the DT_NEEDED closure in
`host/inventory.py` adds what no list names (libnvidia-glsi, -tls, -glcore for
libGLX_nvidia on older lists).

`compat32` and `display` name no libraries of their own: compat32 selects the
32-bit variants of the other requested capabilities' libraries, display only
adds /dev/nvidia-modeset (a device, handled by gpus/plan).
"""

from __future__ import annotations

#: capability -> ld.so.cache key prefixes (LNC nvc_info.c; + libnvidia-tileiras upstream 00b4b47e)
LIBRARY_PREFIXES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("utility", (
        "libnvidia-ml.so",
        "libnvidia-cfg.so",
        "libnvidia-nscq.so",
    )),
    ("compute", (
        "libcuda.so",
        "libcudadebugger.so",
        "libnvidia-opencl.so",
        "libnvidia-gpucomp.so",
        "libnvidia-ptxjitcompiler.so",
        "libnvidia-fatbinaryloader.so",
        "libnvidia-allocator.so",
        "libnvidia-compiler.so",
        "libnvidia-pkcs11.so",
        "libnvidia-pkcs11-openssl3.so",
        "libnvidia-nvvm.so",
        "libnvidia-tileiras.so",
    )),
    ("video", (
        "libvdpau_nvidia.so",
        "libnvidia-encode.so",
        "libnvidia-opticalflow.so",
        "libnvcuvid.so",
    )),
    ("graphics", (
        "libnvidia-eglcore.so",
        "libnvidia-glcore.so",
        "libnvidia-tls.so",
        "libnvidia-glsi.so",
        "libnvidia-fbc.so",
        "libnvidia-ifr.so",
        "libnvidia-rtcore.so",
        "libnvoptix.so",
        # glvnd vendor libraries
        "libGLX_nvidia.so",
        "libEGL_nvidia.so",
        "libGLESv2_nvidia.so",
        "libGLESv1_CM_nvidia.so",
        "libnvidia-glvkspirv.so",
        "libnvidia-cbl.so",
    )),
    ("ngx", (
        "libnvidia-ngx.so",
    )),
)

#: capability -> binaries, first hit on `path`, the vendor dirs, then the libraries' <prefix>/bin (inventory._bin_dirs)
BINARIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("utility", ("nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nv-fabricmanager")),
    ("compute", ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")),
)

#: deliberately never injected (LNC nvc_info.c header comment), even if a prefix would match
NEVER_INJECTED: tuple[str, ...] = (
    "libnvidia-gtk2.so",
    "libnvidia-gtk3.so",
    "libnvidia-wfb.so",
    "nvidia_drv.so",
    "libglx.so",
    "nvidia-modprobe",
    "nvidia-settings",
    "nvidia-xconfig",
)

#: GSP firmware, for any capability; `{version}` is the full driver version.  LNC and NCT look in
#: /lib/firmware only; Debian 13's packages (merged-/usr) ship /usr/lib/firmware/nvidia/<version>,
#: which a host reaches through /lib -> usr/lib but a tree without that link (`dpkg -x`) does not
FIRMWARE_DIRS: tuple[str, ...] = ("/lib/firmware/nvidia/{version}", "/usr/lib/firmware/nvidia/{version}")
FIRMWARE_GLOB = "gsp*.bin"

#: (capability, path inside the driver root) of daemon sockets (LNC lookup_ipcs)
IPC_SOCKETS: tuple[tuple[str, str], ...] = (
    ("utility", "/var/run/nvidia-persistenced/socket"),
    ("utility", "/var/run/nvidia-fabricmanager/socket"),
)
#: the MPS pipe directory (Config.mps_pipe_dir) serves these capabilities
MPS_CAPABILITIES: tuple[str, ...] = ("compute", "video")

#: (capability, path or glob inside the driver root) of ICD/config files NCT adds for graphics;
#: listed always, injected only with `graphics-config-files = true`
ICD_FILES: tuple[tuple[str, str], ...] = (
    ("graphics", "/usr/share/glvnd/egl_vendor.d/10_nvidia.json"),
    ("graphics", "/etc/glvnd/egl_vendor.d/10_nvidia.json"),
    ("graphics", "/usr/share/egl/egl_external_platform.d/*nvidia*.json"),
    ("graphics", "/etc/vulkan/icd.d/nvidia_icd.json"),
    ("graphics", "/usr/share/vulkan/icd.d/nvidia_icd.json"),
    ("graphics", "/etc/vulkan/implicit_layer.d/nvidia_layers.json"),
    ("graphics", "/usr/share/vulkan/implicit_layer.d/nvidia_layers.json"),
    ("graphics", "/etc/OpenCL/vendors/nvidia.icd"),
    ("graphics", "/usr/share/nvidia/nvoptix.bin"),
)

#: extra links LNC makes next to the mounted file (nvc_mount.c symlink_libraries):
#: (SONAME of the library, link name to create, what it points to; "{file}" = the versioned file name)
EXTRA_LINKS: tuple[tuple[str, str, str], ...] = (
    ("libGLX_nvidia.so.0", "libGLX_indirect.so.0", "{file}"),
    ("libnvidia-opticalflow.so.1", "libnvidia-opticalflow.so", "libnvidia-opticalflow.so.1"),
)

#: libraries whose file must carry a GNU ABI note (OS Linux, ABI >= 2.3.99), else hard error
ABI_NOTE_REQUIRED: tuple[str, ...] = ("libnvidia-tls.so",)
ABI_NOTE_MIN = (2, 3, 99)


def never_injected(name: str) -> bool:
    return any(name.startswith(p) for p in NEVER_INJECTED)
