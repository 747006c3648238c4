#!/bin/sh
# enroot hook: GPUs for enroot/Pyxis containers without nvidia-container-cli.
# Install as /etc/enroot/hooks.d/98-pyxis-hook.sh in place of 98-nvidia.sh
# (`pyxis-hook enroot --install /etc/enroot/hooks.d` writes this file with the
# absolute interpreter of your install, which starts faster and cannot pick up
# another Python).  enroot runs it with ENROOT_PID, ENROOT_ROOTFS and
# ENROOT_ENVIRON set; pyxis-hook reads the NVIDIA_* variables like 98-nvidia.sh.
exec pyxis-hook enroot
