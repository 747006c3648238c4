"""`pyxis-hook prestart` (alias `createRuntime`): the OCI hook itself.

Reads the state JSON on stdin, decides from the bundle's config.json, and
applies the plan in the container's mount namespace.  A container that
asked for no GPU returns after reading two small JSON documents; nothing
heavy is imported on that path.  Any failure is one line on stderr (the
runtime shows it and container creation fails) with details in the log.
"""

from __future__ import annotations

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", metavar="DIR", help="bundle directory (default: from the state JSON)")


def execute(config, stdin_bytes: bytes, bundle_dir: str | None = None) -> int:
    """The hook's work; raises PyxisHookError for anything the user must fix."""
    from pyxis_hook import log, oci
    from pyxis_hook.request import void_request

    state = oci.parse_state(stdin_bytes)
    bundle = oci.load_bundle(bundle_dir or state.bundle)
    void = void_request(bundle.env_map())
    if void is not None:
        log.debug(f"container {state.id}: {void.reasons[0]}")
        return 0
    from pyxis_hook.apply import apply_plan
    from pyxis_hook.errors import DriverError
    from pyxis_hook.hook import prepare

    prepared = prepare(config, bundle, state=state, pid=state.pid)
    plan = prepared.plan
    if plan.problems:
        raise DriverError(plan.problems[0])
    log.info(f"container {state.id}: {len(plan.devices)} devices, {len(plan.mounts)} mounts, "
             f"ldcache {plan.ldcache.mode}")
    apply_plan(plan, state.pid, config)
    return 0


def run(args, config) -> int:
    return execute(config, sys.stdin.buffer.read(), args.bundle)


def main_fast() -> int:
    """Entry without argparse (the runtime calls `pyxis-hook prestart` with no options)."""
    from pyxis_hook import log
    from pyxis_hook.errors import PyxisHookError

    try:
        data = sys.stdin.buffer.read()
        from pyxis_hook.config import load_config

        config = load_config(None)
        log.configure(config.log_file, config.log_level, "error")
        return execute(config, data)
    except PyxisHookError as e:
        log.error(str(e))
        sys.stderr.write(f"pyxis-hook: error: {e}\n")
        return e.exit_code
    except Exception as e:  # a bug: one line for the runtime, the traceback in the log
        log.exception("internal error in prestart")
        sys.stderr.write(f"pyxis-hook: error: internal error: {type(e).__name__}: {e}\n")
        return 1
