"""`python -m pyxis_hook` is the same program as the `pyxis-hook` console script."""

import sys

from pyxis_hook.cli import main

sys.exit(main())
