"""The start image: the modules a container start imports, cached in one file and run without the import system.

One file per interpreter build and installation, beside the package's
bytecode (`image_path`), in sections (`SECTIONS`): `boot`, what a start
imports before it knows whether the container asks for a GPU (the
dispatch, the no-GPU check), then one per kind of start for what it
imports after that: `start` (the runtime's and enroot's GPU starts: the
planner, apply, the loader model) and `cdi-hook` (a CDI spec's steps), so
no kind runs the modules only another imports.  Each entry is a module's code (without
docstrings where that changes nothing else) or an extension module's path,
with its file's mtime and size, in the order the imports completed (the
order `sys.modules` keeps), so each module's imports are loaded before it.

Contract:
- `load_boot()` (by `__main__`, for the command lines `fast_kind` names)
  runs the boot section; `load(section=...)` runs a kind's section (and the
  boot one when it has not run).  A section is used only when the file and its
  directory pass the trust rule (`pyxis_hook.trust`), it carries this
  interpreter's bytecode magic, and every entry of the section still has
  its file's signature; otherwise the section is ignored whole and its
  modules import as usual.  Loading never raises for a bad image.
- `save()`, after a successful start, writes the union of what the boot
  section and this kind's section held and what this start imported, when
  that adds a module (the other kinds' sections as they were); only as the
  package's owner (`trust.may_write`), never where Python writes no
  bytecode, never after a start that rebuilt the node artifact or checked
  pyxis.conf with jsonschema (pyelftools or jsonschema would join every start).

Loading imports nothing: `sys`, `posix` and `marshal` are built in, and the
import system's own classes come from `sys.modules`.  Why it exists and what
it saves: docs/design.md, "The start image".
"""

import marshal
import posix
import sys

from pyxis_hook import trust

#: the image's own layout: bumped when the entries or sections change shape
FORMAT = b"pyxis-hook start image 3\n"
#: the sections, in file order: what a start runs before its no-GPU check, then each kind's own (a GPU
#: start of the runtime's or enroot's, a CDI spec's hook step)
SECTIONS = ("boot", "start", "cdi-hook")
BOOT = SECTIONS[0]

_SOURCE_LOADER = "SourceFileLoader"
_EXTENSION_LOADER = "ExtensionFileLoader"
#: modules whose presence says the start was not the steady state: the node artifact was rebuilt,
#: pyxis.conf was checked against its schema (the node artifact recorded no verdict on it yet)
_REBUILD_MARKERS = {"elftools": "rebuilt the node artifact", "jsonschema": "checked pyxis.conf against its schema"}
#: the most a section may hold
_SECTION_LIMIT = 32 << 20
#: the command lines dispatched before the parser (`pyxis_hook.start.dispatch`): the kind of start each is
FAST_COMMANDS = {"prestart": "prestart", "createRuntime": "prestart", "enroot": "enroot"}


def fast_kind(argv: list[str]) -> "str | None":
    """The kind of start `argv` (the command's arguments) is when it runs without the parser, else None."""
    return FAST_COMMANDS.get(argv[0]) if len(argv) == 1 else None


def image_path() -> str:
    """This interpreter's image: the package's `__pycache__`, named by cache tag and a digest of the build.

    The digest of the version string and the installation's prefixes keeps
    apart two builds of one Python version that share the package: the
    image names their standard library's files and loads their extension
    modules by path.
    """
    package_dir = __file__.rpartition("/")[0]
    who = repr((sys.version, sys.base_prefix, sys.base_exec_prefix)).encode()
    digest = int.from_bytes(who, "big") % 4294967291  # 2**32 - 5: stable across runs, no hashlib
    return f"{package_dir}/__pycache__/start-image.{sys.implementation.cache_tag}-{digest:08x}.bin"


def _header() -> bytes:
    return sys.modules["_frozen_importlib_external"].MAGIC_NUMBER + FORMAT  # marshal's format is the interpreter's


def _read_blobs(path: str, wanted: tuple[str, ...] = SECTIONS) -> tuple[dict, str]:
    """The marshalled bytes of the `wanted` sections of the image at `path`, by name, or ({}, why not)."""
    fd, why = trust.open_trusted(path)
    if why:
        return {}, why
    try:
        header = _header()
        head = posix.pread(fd, len(header) + 8 * len(SECTIONS), 0)
        if not head.startswith(header) or len(head) != len(header) + 8 * len(SECTIONS):
            return {}, "written by another Python or format"
        sizes = [int.from_bytes(head[k:k + 8], "little") for k in range(len(header), len(head), 8)]
        if max(sizes) > _SECTION_LIMIT:
            return {}, "corrupt (section size)"
        out, offset = {}, len(head)
        for name, size in zip(SECTIONS, sizes):
            if name in wanted:
                data = posix.pread(fd, size, offset)
                if len(data) != size:
                    return {}, "corrupt (truncated)"
                out[name] = data
            offset += size
    except OSError as e:
        return {}, f"unreadable ({e.strerror})"
    finally:
        posix.close(fd)
    return out, ""


def _read_sections(path: str, wanted: tuple[str, ...] = SECTIONS) -> tuple[dict, str]:
    """The entries of the `wanted` sections of the image at `path`, by name, or ({}, why not)."""
    blobs, why = _read_blobs(path, wanted)
    out = {}
    try:
        for name, data in blobs.items():
            entries = marshal.loads(data)
            if not isinstance(entries, list):
                return {}, "corrupt (not a list)"
            out[name] = entries
    except (EOFError, ValueError, TypeError) as e:
        return {}, f"corrupt ({e})"
    return out, why


def _current(entries: list) -> str:
    """Why the entries do not match their sources now ("" when every one does)."""
    for entry in entries:
        try:
            _name, origin, _is_package, mtime_ns, size, _code = entry
            st = posix.stat(origin)
        except (ValueError, TypeError):
            return "corrupt (bad entry)"
        except OSError as e:
            return f"stale ({origin}: {e.strerror})"
        if st.st_mtime_ns != mtime_ns or st.st_size != size:
            return f"stale ({origin} changed)"
    return ""


def state(path: str = "", section: str = "") -> tuple[int, str]:
    """(modules held, "") when the image at `path` (one `section` of it, or all) would be used now, else (0, why not)."""
    sections, why = _read_sections(path or image_path(), (section,) if section else SECTIONS)
    for entries in sections.values():
        why = why or _current(entries)
    return (0, why) if why else (sum(len(e) for e in sections.values()), "")


def held(path: str = "", section: str = "") -> tuple[str, ...]:
    """The modules the image holds (of one `section`, or all); () when it is unreadable."""
    sections, _why = _read_sections(path or image_path(), (section,) if section else SECTIONS)
    try:
        return tuple(entry[0] for name in SECTIONS for entry in sections.get(name, ()))
    except (TypeError, IndexError):
        return ()


def writable(path: str = "") -> bool:
    """Whether a start would write the image: as the package's owner, where Python writes bytecode, in a trusted dir."""
    directory = (path or image_path()).rpartition("/")[0]
    if sys.dont_write_bytecode or not trust.may_write() or not posix.access(directory, posix.W_OK):
        return False
    try:
        return not trust.why_untrusted(posix.stat(directory))
    except OSError:
        return False


class _Run:
    """What this process did with its image: the sections run, the modules before each, the log lines."""

    __slots__ = ("path", "kind", "before", "held", "status")

    def __init__(self, path: str) -> None:
        self.path = path
        self.kind = ""  # the section past the boot one this process ran ("start", "cdi-hook")
        self.before: dict = {}  # per section run: sys.modules' names when it was loaded
        self.held: dict = {}  # per section run: the entries it ran (the image's, for the union)
        self.status: list = []


_run: list = []


def _this_run(path: str = "") -> _Run:
    if not _run:
        _run.append(_Run(path or image_path()))
    return _run[0]


def _load_section(name: str, path: str = "") -> None:
    run = _this_run(path)
    if name in run.before:
        return
    run.before[name] = frozenset(sys.modules)
    run.held[name] = []
    try:
        sections, why = _read_sections(run.path, (name,))
        entries = sections.get(name, [])
        why = why or _current(entries)
        if why:
            run.status.append(f"start image {run.path}: {name} section not used: {why}")
            return
        run.held[name] = entries
        done = _execute(entries)
        run.status.append(f"start image {run.path}: {name} section: {done} modules loaded")
    except Exception as e:  # noqa: BLE001 — a malformed entry: what ran stays, the rest imports as usual
        run.status.append(f"start image {run.path}: {name} section not used further: {type(e).__name__}: {e}")


def load_boot(path: str = "") -> None:
    """Run the image's boot section (`__main__`, right after importing this module, for a `fast_kind` command line)."""
    _load_section(BOOT, path)


def load(path: str = "", section: str = "start") -> None:
    """Run `section` of the image (a kind of start's: `start`, `cdi-hook`), the boot section first when not run yet."""
    _load_section(BOOT, path)
    run = _this_run(path)
    if not run.kind:
        run.kind = section
        _load_section(section, path)


def statuses() -> tuple[str, ...]:
    """What the loads of this process did, one line each, for the debug log."""
    return tuple(_run[0].status) if _run else ()


def _execute(entries: list) -> int:
    """Run `entries` into `sys.modules` in order, as `importlib._bootstrap._load_unlocked` would; how many ran."""
    mods = sys.modules
    bootstrap = mods["_frozen_importlib"]
    machinery = mods["_frozen_importlib_external"]
    source_loader = getattr(machinery, _SOURCE_LOADER)
    extension_loader = getattr(machinery, _EXTENSION_LOADER)
    new_module = type(sys)
    done = 0
    for name, origin, is_package, _mtime, _size, code in entries:
        if name in mods:
            continue
        parent, _, leaf = name.rpartition(".")
        if parent and parent not in mods:
            # Its package's code has not run: a package whose __init__ imports its own submodules
            # (`json` imports `json.decoder`) completes after them.  Its turn comes later, and its
            # own imports bring these in as usual; the rest of the image goes on.
            continue
        loader = source_loader(name, origin) if code is not None else extension_loader(name, origin)
        spec = bootstrap.ModuleSpec(name, loader, origin=origin, is_package=is_package)
        spec.has_location = True
        try:
            # what importlib._bootstrap._load_unlocked does, minus the finding
            module = new_module(name) if code is not None else loader.create_module(spec)
            module.__spec__ = spec
            module.__loader__ = loader
            module.__file__ = origin
            if is_package:
                module.__path__ = spec.submodule_search_locations = [origin.rpartition("/")[0]]
                module.__package__ = name
            else:
                module.__package__ = parent
            mods[name] = module
            if code is not None:
                exec(code, module.__dict__)
            else:
                loader.exec_module(module)
        except Exception:
            mods.pop(name, None)
            break
        except BaseException:  # SystemExit, KeyboardInterrupt: not the image's to swallow (and run again)
            mods.pop(name, None)
            raise
        # as `_load_unlocked` leaves it: every later import of the module asks the spec, and a spec
        # without the attribute makes that ask raise and clear an AttributeError
        # (docs/decisions/2026-12-07-start-costs.md)
        spec._initializing = False
        mods[name] = mods.pop(name)  # to the end, as the import system does: completion order
        if parent:
            setattr(mods[parent], leaf, module)
        done += 1
    return done


def _from_file(module) -> bool:
    """Whether the module was loaded from a file: Python source or an extension module (not frozen or built in)."""
    spec = getattr(module, "__spec__", None)
    return spec is not None and type(spec.loader).__name__ in (_SOURCE_LOADER, _EXTENSION_LOADER)


def _code(loader, name: str, origin: str):
    """The module's code as the image holds it: compiled with `optimize=2` (no docstrings) unless
    the source names `assert` or `__debug__` anywhere, whose code -OO would change."""
    source = loader.get_data(origin)
    if b"assert" in source or b"__debug__" in source:
        return loader.get_code(name)
    return compile(source, origin, "exec", dont_inherit=True, optimize=2)


def _entry(name: str, module):
    """The image entry of a loaded module, or a string saying why it cannot have one."""
    spec = module.__spec__
    try:
        st = posix.stat(spec.origin)
        code = _code(spec.loader, name, spec.origin) if type(spec.loader).__name__ == _SOURCE_LOADER else None
        if posix.stat(spec.origin).st_mtime_ns != st.st_mtime_ns:
            return f"{spec.origin} changed meanwhile"
    except (OSError, ImportError, SyntaxError, ValueError) as e:
        return f"{name}: {e}"
    return (name, spec.origin, spec.submodule_search_locations is not None, st.st_mtime_ns, st.st_size, code)


def save() -> str:
    """After a successful start: write the image when this start imported a module it lacks; a log line ("" when none).

    Never raises.  The boot section gets what was imported from a file
    between `load_boot` and `load`, this kind's section what was imported
    after `load`, each in completion order and followed by what it held
    that this start did not import (what other starts of the kind added);
    the other kinds' sections are kept as they are.
    """
    if not _run or not _run[0].kind:
        return ""
    run = _run[0]
    mods = sys.modules
    for marker, what in _REBUILD_MARKERS.items():
        if marker in mods:
            return f"start image: not written: this start {what}"
    kind = run.kind
    names = {BOOT: run.before[kind] - run.before[BOOT], kind: mods.keys() - run.before[kind]}
    held_boot = {e[0] for e in run.held[BOOT]}
    held = held_boot | {e[0] for e in run.held[kind]}
    # a module imported before the no-GPU check belongs to the boot section, even when a start (which
    # imported it later) put it in its own; set arithmetic in C first
    if not any(_from_file(mods[n]) for n in (names[BOOT] - held_boot) | (names[kind] - held) if n in mods):
        return ""
    path = run.path
    if not writable(path):
        return f"start image {path}: not written: {path.rpartition('/')[0]} is not writable by this process, or not trusted"
    try:
        others, _why = _read_blobs(path, tuple(n for n in SECTIONS if n not in names))
        blobs, placed, count = [], set(), 0
        for name in SECTIONS:
            if name not in names:
                blobs.append(others.get(name, marshal.dumps([])))
                continue
            entries = []
            for mod_name, module in [(n, m) for n, m in list(mods.items()) if n in names[name] and _from_file(m)]:
                entry = _entry(mod_name, module)
                if isinstance(entry, str):
                    return f"start image {path}: not written: {entry}"
                entries.append(entry)
            placed |= {e[0] for e in entries}
            entries += [e for e in run.held[name] if e[0] not in placed]
            placed |= {e[0] for e in entries}
            count += len(entries)
            blobs.append(marshal.dumps(entries))
        data = _header() + b"".join(len(b).to_bytes(8, "little") for b in blobs) + b"".join(blobs)
        trust.write_whole(path, data)
    except Exception as e:  # noqa: BLE001 — the container is set up; a faster next start is optional
        return f"start image {path}: not written: {type(e).__name__}: {e}"
    return f"start image {path}: written, {count} modules"
