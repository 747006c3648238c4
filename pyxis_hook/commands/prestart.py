"""`pyxis-hook prestart` (alias `createRuntime`): the OCI hook itself.

Reads the state JSON on stdin, decides from the bundle's config.json, and
applies the plan in the container's mount namespace.  A container that
asked for no GPU returns after reading two small JSON documents; nothing
heavy is imported on that path.  Any failure is one line on stderr (the
runtime shows it and container creation fails) with details in the log.

It also holds the frame every per-container entry shares (`run_started`,
`load_image`, `save_image`, `end_fast`: the enroot shim's call and a CDI
spec's hook steps use it too): this module is what a start imports before
its start image, so the frame costs no import of its own.
"""

# no `from __future__ import annotations`: one module less on the no-GPU path (the hints here run on 3.11)

import sys


def add_arguments(parser) -> None:
    parser.add_argument("--bundle", metavar="DIR", help="bundle directory (default: from the state JSON)")


def execute(config, stdin_bytes: bytes, bundle_dir: str | None = None, docs: tuple | None = None) -> int:
    """The hook's work; raises PyxisHookError for anything the user must fix.

    `docs`: the state and config.json as the early exit parsed them
    (`first_look`), used instead of parsing them again when config.json is
    the file this start would read.  Once the container asks for a GPU, the
    bundle's writers are checked (`bundleperm`, the `writable-bundle` key)
    and its rootfs is pinned in the container's mount namespace (`rootpin`):
    the image is read and changed through that fd only, whatever `root.path`
    names by then.
    """
    from pyxis_hook import log

    state, bundle = documents(stdin_bytes, bundle_dir, docs)
    from pyxis_hook.plan.prepare import prepare

    pinned = []

    def pin() -> str:
        from pyxis_hook.apply import rootpin

        pinned.append(rootpin.pin_bundle(bundle, state.pid, config.writable_bundle, f"container {state.id}"))
        return pinned[0].view

    try:
        prepared = prepare(config, bundle, state=state, check=True, pin=pin, cache=True)
        if prepared.request is not None and prepared.request.void:
            log.debug(f"container {state.id}: {prepared.request.reasons[0]}")
            return 0
        from pyxis_hook.apply.child import apply_plan

        plan = prepared.plan
        log.info(f"container {state.id}: {len(plan.devices)} devices, {len(plan.mounts)} mounts, "
                 f"ldcache {plan.ldcache.mode}")
        apply_plan(plan, state.pid, config, root=pinned[0])
        return 0
    finally:
        for root in pinned:
            root.close()


def documents(stdin_bytes: bytes, bundle_dir: str | None = None, docs: tuple | None = None):
    """(oci.State, oci.Bundle) of this start: from `docs` (`first_look`'s) when they are the files it would read."""
    from pyxis_hook.spec import oci

    if docs is None or bundle_dir is not None:
        state = oci.parse_state(stdin_bytes)
        return state, oci.load_bundle(bundle_dir or state.bundle)
    state_doc, config_path, config_doc = docs
    state = oci.state_from_doc(state_doc)
    if oci.config_path_of(state.bundle) != config_path:  # '..', '.' or '//' in the bundle path: read what it normalises to
        return state, oci.load_bundle(state.bundle)
    return state, oci.bundle_from_doc(config_doc, config_path[:-len("/config.json")] or "/", config_path)


def run(args, config) -> int:
    return execute(config, sys.stdin.buffer.read(), args.bundle)


#: a state or config.json larger than this skips the early exit (the full path then reports it)
_FAST_LIMIT = 1 << 20


def first_look(data: bytes) -> tuple[bool, tuple | None]:
    """(the container certainly asks for no GPU, what was parsed): exit before importing anything else.

    A container that asks for no GPU must cost at most 1.3x a bare
    interpreter start, so this reads the state and config.json with `fastjson`
    and `posix` only (`spec/oci.py`, `spec/config.py`, `spec/request.py`, `log.py` cost ~15 ms
    of imports).  The decision is `asks.void_reason`, the one `request.void_request`
    makes, on the bundle's last-wins env; it needs no configuration.  Anything
    unexpected (bad JSON, a symlinked, non-regular or huge config.json, an env entry
    without '=') is (False, None): the full path then decides and reports.

    What was parsed, (state document, config.json's path, its document),
    goes to the full path (`execute`), which then parses neither again:
    config.json was opened as `oci.read_config_bytes` opens it (the last
    component not followed, a regular file, at most `_FAST_LIMIT` bytes, far
    below `oci.MAX_CONFIG_BYTES`).
    """
    try:
        from pyxis_hook import asks
        from pyxis_hook import fastjson

        if len(data) > _FAST_LIMIT:
            return False, None
        state = fastjson.loads(data)
        bundle = state.get("bundle", state.get("bundlePath")) if isinstance(state, dict) else None
        if not isinstance(bundle, str) or not bundle.startswith("/"):
            return False, None
        import posix  # os's builtin core: `os` itself is ~1 ms here, a tenth of this path

        path = bundle.rstrip("/") + "/config.json"
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK)
        try:
            if posix.fstat(fd).st_mode & 0o170000 != 0o100000:  # a FIFO or device: the full path says so
                return False, None
            raw = posix.read(fd, _FAST_LIMIT + 1)
        finally:
            posix.close(fd)
        if len(raw) > _FAST_LIMIT:
            return False, None
        config = fastjson.loads(raw)
        env_list = config.get("process", {}).get("env", [])
        env: dict[str, str] = {}
        for entry in env_list:
            name, sep, value = entry.partition("=")
            if not sep:
                return False, None
            env[name] = value
    except Exception:  # noqa: BLE001 — anything odd (incl. RecursionError on deep JSON): the full path decides
        return False, None
    return asks.void_reason(env) is not None, (state, path, config)


def dispatch_fast(argv: list[str]) -> int | None:
    """The runtime's call, `prestart`/`createRuntime` without options: run it without argparse.

    The one place that runs the fast path (`__main__.py` and `cli.main` both
    ask it); which command lines take it is `startimage.fast_kind`'s table,
    which `__main__` also reads to load the start's boot tier first.  None
    for every other command line.
    """
    from pyxis_hook import startimage

    kind = startimage.fast_kind(argv)
    if kind == "prestart":
        return main_fast()
    if kind == "enroot":  # the enroot shim's call (commands/enroot.py)
        from pyxis_hook.commands.enroot import main_fast as enroot_fast

        return enroot_fast()
    return None


def end_fast(rc: int):
    """End the runtime's call now, without the interpreter's teardown.

    Freeing ~80 modules' objects one by one is ~10% of a GPU start and
    frees nothing the kernel does not free at exit.  The log file is written
    unbuffered (log.py) and the apply child has exited, so only Python's own
    stdout/stderr buffers hold anything: they are flushed first.
    """
    import posix

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing left to say to it
            pass
    posix._exit(rc & 0xFF)


def main_fast() -> int:
    """Entry without argparse (the runtime calls `pyxis-hook prestart` with no options)."""
    try:
        data = sys.stdin.buffer.read()
    except OSError:
        data = b""  # the full path reports the missing state
    void, docs = first_look(data)
    if void:
        return 0
    return run_started("prestart", lambda config: execute(config, data, docs=docs))


def run_started(entry: str, work, stderr_level: str = "error") -> int:
    """One container start for `entry` (`prestart`, `enroot`): its own start image, config, log, one error line.

    `work(config)` does the start and returns the exit status.
    """
    load_image(entry)
    from pyxis_hook import errors, log

    try:
        from pyxis_hook.spec.config import load_config

        config = load_config(None)
        log.configure(config.log_file, config.log_level, stderr_level)
        log_images()
        rc = work(config)
    except Exception as e:  # noqa: BLE001 — one line for the runtime, the traceback in the log
        return errors.report(e, entry)
    save_image()
    return rc


def log_images() -> None:
    """Say in the debug log what each start image this run loaded did (the boot image's, the entry's)."""
    from pyxis_hook import log, startimage

    for loaded in startimage.loaded_images():
        log.debug(loaded.status)


def load_image(entry: str):
    """Begin a start: the garbage collector off, then `entry`'s start image run (`startimage.load`).

    One image holds what a start of that kind runs (`prestart`, `enroot`,
    `cdi-hook`), so no kind executes the modules only another imports.

    The cyclic garbage collector stays off for the run: a start lives ~30 ms
    and allocates mostly acyclic data (code objects, records, strings), so a
    collection only walks what the imports just made (~5% of a GPU start's
    instructions).  A snapshot rebuild, which parses ELF files with
    pyelftools for seconds, turns it back on (`host.snapshot.load_or_build`).
    """
    import gc  # built into the interpreter: no file read

    gc.disable()
    from pyxis_hook import startimage

    return startimage.load(startimage.image_path(entry))


def save_image() -> None:
    """After a successful start: write or grow each image it loaded (`startimage.save_all`), say so in the debug log; never raises."""
    from pyxis_hook import log, startimage

    for line in startimage.save_all():
        log.debug(line)
