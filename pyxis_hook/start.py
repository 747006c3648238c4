"""The entry of every container start, up to the no-GPU exit: the part a container without a GPU pays for.

`dispatch(argv)` runs the command lines a runtime or enroot's shim uses
(`prestart`, `createRuntime`, `enroot`, no options) without the command-line
parser, and returns None for any other.  A `prestart` whose state and
config.json say the container asks for no GPU (`first_look`) exits here,
having imported nothing but `nogpu` and `fastjson`; every other start goes
through `run_started` into `pyxis_hook.pipeline`, whose module lists the
stages of a start.  Nothing here imports a package module at its top.
"""

# no `from __future__ import annotations`: one module less on the no-GPU path (a hint with `|` is
# a string, which 3.9 and 3.10 would otherwise evaluate and fail on)

import sys

#: a state or config.json larger than this skips the early exit (the full path then reports it)
FIRST_LOOK_LIMIT = 1 << 20


def dispatch(argv: list[str]) -> "int | None":
    """Run `argv` when it is a container start the runtime or enroot's shim makes; its exit status, else None."""
    from pyxis_hook import startimage

    kind = startimage.fast_kind(argv)
    if kind == "prestart":
        try:
            data = sys.stdin.buffer.read()
        except OSError:
            data = b""  # the full path reports the missing state
        void, docs = first_look(data)
        if void:
            return 0
        return run_started("prestart", lambda pipeline, config, stored:
                           pipeline.prestart(config, data, docs=docs, stored=stored))
    if kind == "enroot":  # warnings go to stderr, as from the CLI: enroot shows its hooks' output
        return run_started("enroot", lambda pipeline, config, stored: pipeline.enroot(config, environ(), stored),
                           "warning")
    return None


def first_look(data: bytes) -> "tuple[bool, tuple | None]":
    """(the container certainly asks for no GPU, what was parsed), read with `fastjson` and `posix` only.

    The decision is `nogpu.void_reason` on the bundle's last-wins env.
    Anything unexpected (bad JSON, a symlinked, non-regular or huge
    config.json, an env entry without '=') is (False, None): the full path
    decides and reports.  What was parsed, (state document, config.json's
    path, its document), goes on to `pipeline.prestart`, which parses
    neither again; config.json is opened as `oci.read_config_bytes` opens it.
    """
    try:
        from pyxis_hook import nogpu
        from pyxis_hook import fastjson

        if len(data) > FIRST_LOOK_LIMIT:
            return False, None
        state = fastjson.loads(data)
        bundle = state.get("bundle", state.get("bundlePath")) if isinstance(state, dict) else None
        if not isinstance(bundle, str) or not bundle.startswith("/"):
            return False, None
        import posix  # os's builtin core

        path = bundle.rstrip("/") + "/config.json"
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK)
        try:
            if posix.fstat(fd).st_mode & 0o170000 != 0o100000:  # a FIFO or device: the full path says so
                return False, None
            raw = posix.read(fd, FIRST_LOOK_LIMIT + 1)
        finally:
            posix.close(fd)
        if len(raw) > FIRST_LOOK_LIMIT:
            return False, None
        config = fastjson.loads(raw)
        env: dict[str, str] = {}
        for entry in config.get("process", {}).get("env", []):
            name, sep, value = entry.partition("=")
            if not sep:
                return False, None
            env[name] = value
    except Exception:  # noqa: BLE001 — anything odd (incl. RecursionError on deep JSON): the full path decides
        return False, None
    return nogpu.void_reason(env) is not None, (state, path, config)


def run_started(entry: str, work, stderr_level: str = "error") -> int:
    """One container start of kind `entry`: start image, config, log, `work(pipeline, config, stored)`, one error line.

    `stored`: the node artifact as read for pyxis.conf's verdict (`spec.config.read_config`), for the
    pipeline's `artifact.obtain`: one read of the file a start.

    The garbage collector stays off for the run (a start allocates mostly
    acyclic data; a node artifact build turns it back on).  A failed start
    also leaves its record in the system log (`log.start_record`; a
    successful one is recorded by the pipeline, which knows what it gave).
    After a successful start the start image is written when it lacks a module.
    """
    import gc  # built in

    gc.disable()
    from pyxis_hook import startimage

    startimage.load()
    from pyxis_hook import errors, log

    try:
        from pyxis_hook import pipeline
        from pyxis_hook.spec.config import read_config

        config, stored = read_config(None)
        log.configure(config.log_file, config.log_level, stderr_level, syslog=config.syslog,
                      facility=config.syslog_facility)
        for line in startimage.statuses():
            log.debug(line)
        rc = work(pipeline, config, stored)
    except Exception as e:  # noqa: BLE001 — one line for the runtime, the traceback in the log
        rc = errors.report(e, entry)
        log.start_record(errors.one_line(e), {"container": pipeline_container(entry)})
        return rc
    line = startimage.save()
    if line:
        log.debug(line)
    return rc


def pipeline_container(entry: str) -> str:
    """The container a failed start was for, as far as the pipeline got ("" before it knew)."""
    pipeline = sys.modules.get("pyxis_hook.pipeline")
    return getattr(pipeline, "current", {}).get("container", "") or entry


def environ() -> dict[str, str]:
    """The process environment as `os.environ` decodes it, without importing `os`."""
    import posix

    encoding, errors = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()
    return {k.decode(encoding, errors): v.decode(encoding, errors) for k, v in posix.environ.items()}


def end(rc: int):
    """End the process now with `rc`, without the interpreter's teardown (stdout and stderr flushed first).

    The log file is written unbuffered and the apply child has exited, so
    only Python's own stream buffers hold anything.
    """
    import posix

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say to it
            pass
    posix._exit(rc & 0xFF)
