"""The parser of each file the NVIDIA kernel module publishes, for discovery (`host/gpuscan.py`).

Each parser takes the file's text and never raises for a malformed one:
what it cannot read is left out, and discovery warns about the file.
"""

from __future__ import annotations

from pyxis_hook.host.gpus import DeviceMajors


def parse_driver_version(text: str) -> str | None:
    """Driver version from /proc/driver/nvidia/version, proprietary or open module, any arch.

    The NVRM line says `... Kernel Module  535.104.05  <date>` (proprietary)
    or `... Open Kernel Module for x86_64  535.104.05  Release Build ...`:
    the version is the first word after `Kernel Module` (and `for <arch>`).
    """
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            _, found, rest = line.partition("Kernel Module")
            words = rest.split() if found and rest[:1].isspace() else []
            if len(words) >= 3 and words[0] == "for" and _version_word(words[2]):
                return _version_word(words[2])
            return _version_word(words[0]) if words else None
    return None


def _version_word(word: str) -> str | None:
    """`word` when it is a version (`535.104.05`, `550.54`): decimal runs joined by single dots."""
    parts = word.split(".")
    return word if len(parts) >= 2 and all(p.isdecimal() for p in parts) else None


def parse_information(text: str) -> dict[str, str]:
    """Key/value pairs of a gpus/<bus>/information file (split at the first ':', values trimmed)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def parse_proc_devices(text: str) -> dict[str, int]:
    """name -> major for the `Character devices:` section of /proc/devices."""
    out: dict[str, int] = {}
    in_char = False
    for line in text.splitlines():
        s = line.strip()
        if s.endswith(":"):
            in_char = s == "Character devices:"
            continue
        if not in_char or not s:
            continue
        major, _, name = s.partition(" ")
        if major.isdigit() and name.strip():
            out.setdefault(name.strip(), int(major))
    return out


def majors_from_devices(names: dict[str, int]) -> DeviceMajors:
    """The majors we care about; `nvidia-frontend` and `nvidia` stand in for each other (NCT devices.go)."""
    nvidia = names.get("nvidia-frontend", names.get("nvidia"))
    return DeviceMajors(
        nvidia=nvidia,
        uvm=names.get("nvidia-uvm"),
        caps=names.get("nvidia-caps"),
        imex=names.get("nvidia-caps-imex-channels"),
        nvswitch=names.get("nvidia-nvswitch"),
        names=tuple(sorted((n, m) for n, m in names.items() if n.startswith("nvidia"))),
    )


def parse_mig_minors(text: str) -> tuple[tuple[str, int], ...]:
    """Lines `config 1`, `monitor 2`, `gpu0/gi0/access 3`, `gpu0/gi0/ci0/access 4` of nvidia-caps/mig-minors."""
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out.append((parts[0], int(parts[1])))
    return tuple(out)


def parse_access_minor(text: str) -> int | None:
    """`DeviceFileMinor: N` of a capability access file."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "DeviceFileMinor" and value.strip().isdigit():
            return int(value.strip())
    return None


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("yes", "1", "true")


def numbered(name: str, prefix: str) -> int | None:
    """N of `<prefix>N` (gi3, ci0, channel12); None for any other name."""
    digits = name[len(prefix):]
    return int(digits) if name.startswith(prefix) and digits.isdecimal() else None
