"""`pyxis-hook prestart` (alias `createRuntime`): the OCI hook itself.

A runtime runs it without options, which `pyxis_hook.start.dispatch` takes
before the parser; this module serves the parsed form (`--bundle DIR`, a
hook registered with options, `python -m pyxis_hook prestart`).  The stages
are `pipeline.prestart`'s.
"""

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", metavar="DIR", help="bundle directory (default: from the state JSON)")


def run(args, config) -> int:
    from pyxis_hook import pipeline

    return pipeline.prestart(config, sys.stdin.buffer.read(), args.bundle)
