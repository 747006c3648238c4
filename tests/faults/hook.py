"""`python -I -S tests/faults/hook.py STAGE`: the hook, as the runtime runs it, with one fault armed.

The fault is `PYXIS_FAULT` from the hook's environment (shim.py says
what it can be); then pyxis_hook/__main__.py of this checkout runs exactly
as under `python -I -S pyxis_hook/__main__.py STAGE`.
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.realpath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [HERE, REPO]

import shim  # noqa: E402 — after the path: this directory and the package under test

shim.arm(os.environ.get("PYXIS_FAULT", ""))
runpy.run_path(os.path.join(REPO, "pyxis_hook", "__main__.py"), run_name="__main__")
