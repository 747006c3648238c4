"""The start image: the modules a GPU start imports, kept in one file and loaded without the import system.

Why: a GPU start imports ~55 modules from source files.  For each one,
Python's import system runs ~300,000 instructions of its own Python code
(finder, spec, loader, cache path, pyc validation) and five or six syscalls
before the module's code runs: ~14 M of a start's ~88 M instructions,
measured with callgrind.  The image holds their code objects, in the order
their imports completed, and a start that finds it current executes them
directly: one file read, one `marshal.loads`, one stat per module.

What it holds: every module a successful start imported from a file after
the point where it knew it had GPU work, each with the stat signature (mtime
in ns, size) of its file: the code of Python sources (the package's own and
the standard library's; without docstrings, `_code`), and the path of
extension modules (`_ctypes`, `_struct`, ...: loaded from it directly,
without searching `sys.path`'s directories for them).  The interpreter's frozen and built-in modules import
as usual.  A start of another request shape that imports a module the image
lacks imports it as usual and then rewrites the image with it (the set only
grows, so rewrites end).  A start that rebuilt the host snapshot (pyelftools
imported) writes nothing: that is not the steady state, and the image would
then execute pyelftools on every start.

When it is used: only when every entry's source still has its signature,
the file is the one this interpreter wrote (its bytecode magic) and it is
trusted as the host snapshot is (a regular file owned by root or by us, not
writable by group or others, in such a directory).  Otherwise it is ignored
whole and the start imports as usual.  It lives beside the bytecode Python
itself writes and trusts (`__pycache__` of the package), so it asks for no
more trust than the .pyc files do; it is not written where Python would not
write bytecode (a read-only install, `-B`).

Import order: Python moves a module to the end of `sys.modules` when its
code finishes (`importlib._bootstrap._load_unlocked`), so that dict's order
is the order imports completed: a module's top-level imports precede it.
Executing in that order, each module's imports find their modules already
loaded.  Should one not be (a changed import graph), it imports as usual and
the image skips it when its turn comes.  A package whose `__init__` imports
its own submodules completes after them: those wait for it (they are
skipped, and its body imports them as usual).

Tiers: a kind of start may have modules only some of its starts run (the
planner's, when the decision cache has no decision: `plan.decisions`).
They are a tier of their own, `start-image-<tier>...`, which the start
loads when it gets there (`load_tier`); `save_all` gives each image the
modules imported while it was the newest loaded.  A start that never
loads the tier never executes its modules.

The boot tier (`start-image-boot...`, `start-image-enroot-boot...`:
`load_boot`): what a start dispatched before the command-line parser
(`fast_kind`: the runtime's `prestart`, the enroot shim's call) imports
before it knows whether the container asks for a GPU at all (the dispatch,
the no-GPU check, `_json`), loaded by `__main__` right after this module.
It spares every such start, the no-GPU one too, the import system's search
for each of them; a GPU start writes it as it writes the others (`save_all`:
the modules imported after it and before the kind's image).  Each kind has
its own, so neither runs what only the other imports; a run the parser
dispatches (every other command, the CDI steps) loads none.

Loading imports nothing: `sys`, `posix` and `marshal` are built in, and the
import system's own classes come from `sys.modules`.
"""

import marshal
import posix
import sys

#: the image's own layout: bumped when the entries change shape
FORMAT = b"pyxis-hook start image 1\n"

_SOURCE_LOADER = "SourceFileLoader"
_EXTENSION_LOADER = "ExtensionFileLoader"
#: a module whose presence says the start was not the steady state (the snapshot was rebuilt)
_REBUILD_MARKER = "elftools"


#: the kinds of container start that run from an image of their own: the runtime's hook, the
#: enroot shim's call, a CDI spec's createContainer steps
ENTRIES = ("prestart", "enroot", "cdi-hook")
#: the tier a start dispatched before the parser loads first (`load_boot`), before its no-GPU check
BOOT = "boot"
#: the command lines dispatched before the parser (`commands.prestart.dispatch_fast`): the kind of start each is
FAST_COMMANDS = {"prestart": "prestart", "createRuntime": "prestart", "enroot": "enroot"}


def fast_kind(argv: list[str]) -> str | None:
    """The kind of start `argv` (the command's arguments) is when it runs without the parser, else None."""
    return FAST_COMMANDS.get(argv[0]) if len(argv) == 1 else None


def image_path(entry: str = "prestart", tier: str = "") -> str:
    """Where this interpreter's image for `entry` lives: the package's `__pycache__`, named by the interpreter.

    Each entry (`prestart`, `enroot`, `cdi-hook`) has its own image: a start of one kind
    never runs the modules only another kind imports (`prestart`'s keeps
    the name it has always had).

    The cache tag keeps the bytecode apart; the digest of the version string
    and the installation's prefixes keeps apart two builds of one Python
    version that share the package (a distribution's python3.11 and a
    pyenv one): the image names their standard library's files and loads
    their extension modules by path, which must be the running one's.
    """
    package_dir = __file__.rpartition("/")[0]
    who = repr((sys.version, sys.base_prefix, sys.base_exec_prefix)).encode()
    digest = int.from_bytes(who, "big") % 4294967291  # 2**32 - 5: stable across runs, no hashlib
    kind = "" if entry == "prestart" else f"-{entry}"
    path = f"{package_dir}/__pycache__/start-image{kind}.{sys.implementation.cache_tag}-{digest:08x}.bin"
    return _tier_path(path, tier) if tier else path


def _tier_path(path: str, tier: str) -> str:
    """The image of `tier` beside the image at `path`: `-<tier>` after its kind, before the first dot."""
    directory, _, name = path.rpartition("/")
    kind, dot, rest = name.partition(".")
    return f"{directory}/{kind}-{tier}{dot}{rest}"


def _header() -> bytes:
    magic = sys.modules["_frozen_importlib_external"].MAGIC_NUMBER  # the marshal format's version
    return magic + FORMAT


def _untrusted(st) -> str:
    """Why a file or dir with stat `st` may not hold code root runs ("" when it may)."""
    if st.st_uid not in (0, posix.geteuid()):
        return f"owned by uid {st.st_uid}"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {st.st_mode & 0o7777:04o})"
    return ""


def _read(path: str) -> tuple[list | None, str]:
    """The image's entries, or None and why not."""
    try:
        dir_st = posix.stat(path.rpartition("/")[0])
    except OSError as e:
        return None, f"no image ({e.strerror})"
    why = _untrusted(dir_st)
    if why:
        return None, f"directory {why}"
    try:
        fd = posix.open(path, posix.O_RDONLY | posix.O_NOFOLLOW | posix.O_CLOEXEC | posix.O_NONBLOCK)
    except OSError as e:
        return None, f"no image ({e.strerror})"
    try:
        st = posix.fstat(fd)
        why = "not a regular file" if st.st_mode & 0o170000 != 0o100000 else _untrusted(st)
        if why:
            return None, why
        chunks = []
        while chunk := posix.read(fd, 1 << 20):
            chunks.append(chunk)
    finally:
        posix.close(fd)
    data = b"".join(chunks)
    header = _header()
    if not data.startswith(header):
        return None, "written by another Python or format"
    try:
        entries = marshal.loads(memoryview(data)[len(header):])
    except (EOFError, ValueError, TypeError) as e:
        return None, f"corrupt ({e})"
    if not isinstance(entries, list):
        return None, "corrupt (not a list)"
    return entries, ""


def _usable(path: str) -> tuple[list, str]:
    """The image's entries when a start would run them now, else ([], why not)."""
    entries, why = _read(path)
    if entries is not None:
        why = _current(entries)
    return ([], why) if why else (entries or [], "")


def state(path: str = "") -> tuple[int, str]:
    """(modules held, "") when the image at `path` would be used now, else (0, why not): for `doctor`."""
    entries, why = _usable(path or image_path())
    return len(entries), why


def writable(path: str = "") -> bool:
    """Whether a start would write the image (`save`'s own test).

    Not where Python writes no bytecode (-B), the directory refuses us, or a
    start could not use what it wrote: a directory another user owns or
    others may write (a root hook run from a user's editable install) would
    otherwise be written on every start and read on none.
    """
    directory = (path or image_path()).rpartition("/")[0]
    if sys.dont_write_bytecode or not posix.access(directory, posix.W_OK):
        return False
    try:
        return not _untrusted(posix.stat(directory))
    except OSError:
        return False


def held(path: str = "") -> tuple[str, ...]:
    """The modules the image at `path` (this interpreter's by default) holds; () when it is unreadable."""
    entries, _why = _read(path or image_path())
    try:
        return tuple(entry[0] for entry in entries or ())
    except (TypeError, IndexError):
        return ()


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


#: the images this process's start loaded, in order (`load_tier` adds to it; `save_all` writes them)
_started: list = []


class Loaded:
    """What `load` did: the outcome line for the debug log, and what a later `save` compares against.

    A plain class: `record` would be one more module to import before the image is read.
    """

    __slots__ = ("path", "status", "names", "before", "sources", "boot")

    def __init__(self, path: str, status: str, names: frozenset[str], before: frozenset[str],
                 sources: dict | None = None) -> None:
        self.boot = False  # the boot image (`load_boot`): not an entry's, so no tier is taken beside it
        self.path = path
        self.status = status
        self.names = names  # the modules the image holds (empty: not used)
        self.before = before  # what was imported before: not the image's to hold
        self.sources = sources or {}  # origin -> (mtime_ns, size), each stat'ed by this load (`source_signature`)


def load(path: str = "") -> Loaded:
    """Execute the current image's modules into `sys.modules`; never raises for a bad image.

    A module whose code raises stops the image there (it is removed again,
    as the import system would): the start's own import of it then raises
    the same error where it belongs.  SystemExit and KeyboardInterrupt go on
    up at once, as from an import.
    """
    before = frozenset(sys.modules)
    path = path or image_path()
    try:
        loaded = _load(path, before)
    except Exception as e:  # noqa: BLE001 — a malformed entry: what ran stays, the rest imports as usual
        loaded = Loaded(path, f"start image {path}: not used further: {type(e).__name__}: {e}", frozenset(), before)
    _started.append(loaded)
    return loaded


def load_boot(entry: str, path: str = "") -> Loaded:
    """Load `entry`'s boot tier (this interpreter's, or `path`): what its start imports before its image.

    `__main__` calls it once, right after importing this module, for a
    command line `fast_kind` names; the entry's image (`load`) then holds
    what the start imports after these, and its tiers lie beside that one
    (`load_tier`).
    """
    loaded = load(path or image_path(entry, BOOT))
    loaded.boot = True
    return loaded


def load_tier(tier: str) -> Loaded | None:
    """Load the next tier of this start's image: the modules only some starts need.

    None outside a start, and when this start loaded that tier already.

    A start served by the decision cache (`plan.decisions`) never runs the
    planning modules, so they are a tier of their own (`tier="plan"`),
    loaded when a start finds it must plan: an image holding them would
    make every start execute them.  Each tier holds what its start imported
    after the tier was loaded (`save_all`); a module both tiers were asked
    for runs once, from the first.
    """
    entry = next((loaded for loaded in _started if not loaded.boot), None)
    if entry is None:
        return None
    path = _tier_path(entry.path, tier)
    if any(loaded.path == path for loaded in _started):
        return None
    return load(path)


def loaded_images() -> tuple[Loaded, ...]:
    """The images this process loaded, in order (the boot image first when `__main__` loaded it): for the debug log."""
    return tuple(_started)


def save_all() -> list[str]:
    """`save` each image this start loaded, each with the modules imported while it was the newest; log lines."""
    out = []
    for i, loaded in enumerate(_started):
        until = _started[i + 1].before if i + 1 < len(_started) else None
        try:
            out.append(save(loaded, until))
        except Exception as e:  # noqa: BLE001 — the container is set up; a faster next start is optional
            out.append(f"start image {loaded.path}: not written: {type(e).__name__}: {e}")
    return [line for line in out if line]


def _load(path: str, before: frozenset[str]) -> Loaded:
    mods = sys.modules
    entries, why = _usable(path)
    if why:
        return Loaded(path, f"start image {path}: not used: {why}", frozenset(), before)
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
        # without the attribute makes that ask raise and clear an AttributeError (~3,000 instructions)
        spec._initializing = False
        mods[name] = mods.pop(name)  # to the end, as the import system does: completion order
        if parent:
            setattr(mods[parent], leaf, module)
        done += 1
    names = frozenset(e[0] for e in entries)
    sources = {origin: (mtime, size) for _name, origin, _is_package, mtime, size, _code in entries}
    return Loaded(path, f"start image {path}: {done} modules loaded", names, before, sources)


def source_signature(origin: str) -> tuple[int, int] | None:
    """(mtime in ns, size) of a module's file: as this start's images found it, else stat'ed now; None if gone.

    For what must know that the code it ran is the code there now (the
    decision cache) without stat'ing again what the image load just did.
    """
    for loaded in _started:
        found = loaded.sources.get(origin)
        if found is not None:
            return found
    try:
        st = posix.stat(origin)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def code_signature(origins) -> tuple[tuple[str, int, int], ...]:
    """(file, mtime in ns, size) of each of `origins` (module files) there is: the code that made what is kept.

    A version string alone would not do: an edited or patched install keeps
    it, and nothing kept (a decision, the GPU memo) may outlive the code
    that made it.  `same_code` checks it later.
    """
    return tuple(sorted((origin, *sig) for origin in set(origins) if (sig := source_signature(origin)) is not None))


def same_code(signature) -> bool:
    """Whether each file of a `code_signature` is as it was then."""
    return all(source_signature(origin) == (mtime, size) for origin, mtime, size in signature)


def _from_file(module) -> bool:
    """Whether the module was loaded from a file: Python source or an extension module (not frozen or built in)."""
    spec = getattr(module, "__spec__", None)
    return spec is not None and type(spec.loader).__name__ in (_SOURCE_LOADER, _EXTENSION_LOADER)


def _code(loader, name: str, origin: str):
    """The module's code as the image holds it: without docstrings where that is all `-OO` changes.

    Docstrings are a fifth of the package's bytecode and nothing on a start
    reads `__doc__`; every string the image holds is one more object to
    unmarshal and one more page to fault in on every start.  `optimize=2`
    also drops `assert` statements and code under `if __debug__:`, so a
    source naming either word anywhere (a comment too: the test is on the
    bytes) keeps the bytecode the import system would have run.
    """
    source = loader.get_data(origin)
    if b"assert" in source or b"__debug__" in source:
        return loader.get_code(name)
    return compile(source, origin, "exec", dont_inherit=True, optimize=2)


def save(loaded: Loaded, until: frozenset[str] | None = None) -> str:
    """Write the image from this start's imports when it lacks any; a line for the debug log.

    Called after a successful start.  Writes nothing when the image already
    holds every module the start imported from source, when the start was
    not the steady state, or where Python would not write bytecode.
    """
    mods = sys.modules
    if _REBUILD_MARKER in mods:
        return "start image: not written: this start rebuilt the host snapshot"
    # every start asks: set arithmetic in C, and only a module the image lacks is looked at
    mine = mods.keys() - loaded.before if until is None else until - loaded.before  # `until`: the next tier's
    if not any(_from_file(mods[name]) for name in mine - loaded.names if name in mods):
        return ""
    picked = [(name, m) for name, m in list(mods.items()) if name in mine and _from_file(m)]
    path = loaded.path
    if not writable(path):
        return f"start image {path}: not written: {path.rpartition('/')[0]} is not writable, or not trusted"
    entries = []
    for name, module in picked:
        spec = module.__spec__
        try:
            st = posix.stat(spec.origin)
            if type(spec.loader).__name__ == _SOURCE_LOADER:
                code = _code(spec.loader, name, spec.origin)
            else:
                code = None  # an extension module: loaded by its path, as the import system would
            if posix.stat(spec.origin).st_mtime_ns != st.st_mtime_ns:
                return f"start image {path}: not written: {spec.origin} changed meanwhile"
        except (OSError, ImportError, SyntaxError, ValueError) as e:
            return f"start image {path}: not written: {name}: {e}"
        entries.append((name, spec.origin, spec.submodule_search_locations is not None,
                        st.st_mtime_ns, st.st_size, code))
    data = _header() + marshal.dumps(entries)
    tmp = f"{path}.{posix.getpid()}.tmp"
    try:
        fd = posix.open(tmp, posix.O_WRONLY | posix.O_CREAT | posix.O_EXCL | posix.O_NOFOLLOW | posix.O_CLOEXEC,
                        0o644)
        try:
            posix.fchmod(fd, 0o644)  # whatever the umask
            view = memoryview(data)
            while view:
                view = view[posix.write(fd, view):]
        finally:
            posix.close(fd)
        posix.rename(tmp, path)
    except OSError as e:
        try:
            posix.unlink(tmp)
        except OSError:
            pass
        return f"start image {path}: not written: {e.strerror}"
    return f"start image {path}: written, {len(entries)} modules"
