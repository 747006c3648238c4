"""pyxis-hook: an OCI prestart hook that gives containers the host's NVIDIA GPUs."""

__version__ = "0.1.0"
