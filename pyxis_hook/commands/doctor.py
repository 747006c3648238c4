"""`pyxis-hook doctor [--json]`: check this host for the usual causes of GPU container failures.

Each check prints ✓, ! (warning) or ✗ with what was found, why it matters and
the fix (pyxis_hook/diag/doctor.py).  Exits 1 when any check fails.
"""

from __future__ import annotations

import json
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output (schemas/doctor.schema.json)")


def run(args, config) -> int:
    from pyxis_hook.errors import FINDINGS, OK

    from pyxis_hook.diag import doctor
    from pyxis_hook.diag.findings import format_findings, has_errors

    findings = doctor.run_checks(config)
    if args.json:
        sys.stdout.write(json.dumps(doctor.report_dict(config, findings), indent=2) + "\n")
    else:
        sys.stdout.write(f"pyxis-hook doctor (configuration: {config.source})\n" + format_findings(findings))
    return FINDINGS if has_errors(findings) else OK
