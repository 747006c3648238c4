"""containerd 1.7's CRI plugin reads CDI specs only with `enable_cdi = true` (2.x: on by default).

containerd merges an `imports` file by replacing whole plugin tables, so a
drop-in naming the CRI plugin would drop the admin's other CRI settings: the
one line is edited into config.toml itself, marked, and nothing else changes.
A config of `version = 3` (containerd 2.x) is left alone.
"""

from __future__ import annotations

import re

CRI_TABLE = '[plugins."io.containerd.grpc.v1.cri"]'
MARK = "  # pyxis-hook install containerd"
_ENABLE = re.compile(r"^\s*enable_cdi\s*=\s*(\S+)")
_VERSION = re.compile(r"^\s*version\s*=\s*(\d+)", re.M)


def with_cdi(text: str | None) -> str | None:
    """config.toml `text` (None: absent) with CDI enabled; None when it needs no change."""
    if text is None:
        return f"version = 2\n\n{CRI_TABLE}\n  enable_cdi = true{MARK}\n"
    m = _VERSION.search(text)
    if m and int(m.group(1)) >= 3:
        return None
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if line.strip() == CRI_TABLE), None)
    if start is None:
        sep = "" if text.endswith("\n") or not text else "\n"
        return f"{text}{sep}\n{CRI_TABLE}\n  enable_cdi = true{MARK}\n"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    for i in range(start + 1, end):
        m = _ENABLE.match(lines[i])
        if m:
            if m.group(1) == "true":
                return None
            lines[i] = f"  enable_cdi = true{MARK}"
            return "\n".join(lines)
    lines.insert(start + 1, f"  enable_cdi = true{MARK}")
    return "\n".join(lines)
