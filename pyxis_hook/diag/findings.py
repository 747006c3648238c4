"""One diagnosis: what is wrong (or right), why it matters, and the one thing to do.

`ldcheck` and `doctor` both answer "why does my container not see the GPU?"
with a list of `Finding`s.  Every finding carries a stable `code` (tests and
docs/troubleshooting.md key on it, so users can search for it) and three
one-line texts, because a support thread needs the cause and the fix, not a
stack trace.  The severities order as ok < info < warning < error; a command
exits non-zero when any finding is an error.
"""

from __future__ import annotations

from pyxis_hook.record import asdict, record

SEVERITIES = ("ok", "info", "warning", "error")

#: what a terminal line starts with, per severity (doctor's ✓ / warning / ✗)
SYMBOLS = {"ok": "✓", "info": "i", "warning": "!", "error": "✗"}


@record
class Finding:
    """One result line.  `what` names the file/node/setting concerned; `why` and `fix` may be ""
    for an ok finding.  All three are single lines (newlines are folded on construction)."""

    severity: str
    code: str
    what: str
    why: str = ""
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"finding {self.code}: unknown severity {self.severity!r}")
        for name in ("what", "why", "fix"):
            value = getattr(self, name)
            if "\n" in value:
                object.__setattr__(self, name, " ".join(value.split("\n")))

    def to_dict(self) -> dict:
        return asdict(self)


def worst(findings) -> str:
    """The highest severity among `findings` ("ok" for none)."""
    return max((f.severity for f in findings), key=SEVERITIES.index, default="ok")


def has_errors(findings) -> bool:
    return any(f.severity == "error" for f in findings)


def format_finding(f: Finding) -> str:
    """Three short lines a newcomer can act on: symbol + what, then why and fix indented."""
    lines = [f"{SYMBOLS[f.severity]} [{f.code}] {f.what}"]
    if f.why:
        lines.append(f"    why: {f.why}")
    if f.fix:
        lines.append(f"    fix: {f.fix}")
    return "\n".join(lines)


def format_findings(findings) -> str:
    return "".join(format_finding(f) + "\n" for f in findings)
