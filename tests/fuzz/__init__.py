"""Fuzz targets for every parser of untrusted input, and a runner (`python -m tests.fuzz`).

The hook runs as root and reads what images, bundles, runtimes and job
environments hand it: each target feeds one parser generated and mutated input
and lets through only the errors that parser is documented to raise (the
project's own types, one line each).  Anything else escaping is a crash: the
runner records its signature (exception type and the innermost frame of ours)
and goes on with the next target.
"""
