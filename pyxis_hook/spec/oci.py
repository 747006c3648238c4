"""The OCI state on stdin and the bundle's config.json, read once and validated.

A prestart hook learns everything about the container from two documents:
the runtime's *state* (runtime-spec `runtime.md` "State") and the bundle's
`config.json`.  Both come from a runtime we do not control (runc, crun,
Podman, Slurm's oci.conf…), so every field we use is type-checked here and a
bad one is reported as one `OciError` line naming the field, instead of a
KeyError deep inside planning.  Unknown fields are ignored, as the schema
allows.

Only the standard library (posix, stat; paths through pathnames, JSON through fastjson) is imported, and only the fields
something downstream reads are parsed into records: this module is on the
per-container hot path, where every class built at import and every
field parsed per start counts.  What is read: `root.path`, `process.env`,
`process.capabilities.bounding` (the privileged test), `annotations` and
`linux.devices` (the CDI proc-driver step).  `mounts`, `hooks`,
`process.args`, `process.user`, `root.readonly` and `linux.cgroupsPath` are
the runtime's business and not looked at.
"""

from __future__ import annotations

import errno
import posix
import stat

from pyxis_hook import fastjson, pathnames
from pyxis_hook.errors import OciError
from pyxis_hook.record import record

TYPE_CHECKING = False
if TYPE_CHECKING:  # annotations only (`from __future__ import annotations`; docs/decisions/2026-12-07-start-costs.md)
    from collections.abc import Iterable, Mapping

#: config.json larger than this is refused (a real one is a few KiB; the cap
#: only stops a hostile or broken bundle from making us read gigabytes)
MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: same for the state on stdin (callers read at most this many bytes + 1)
MAX_STATE_BYTES = 1024 * 1024


class StateError(OciError):
    """The state JSON lacks `bundle`/`pid` or is not JSON: the caller misused the hook.

    That is exit status 2 (usage), unlike a
    broken bundle, which fails the container with 1.
    """

    exit_code = 2


@record
class State:
    """The runtime's state document (the hook's stdin)."""

    oci_version: str
    id: str
    status: str
    #: container init pid as the runtime sees it; None when not required and absent
    pid: int | None
    #: absolute bundle directory (`bundle`, or legacy `bundlePath`)
    bundle: str
    #: (key, value) pairs in document order
    annotations: tuple[tuple[str, str], ...] = ()


def _load_json(data: bytes, what: str, error: type[OciError]) -> object:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{what}: not UTF-8 text") from None
    try:
        return fastjson.loads(text)
    except ValueError as e:  # json.JSONDecodeError from fastjson's slow path, or int()'s digit limit
        where = f" at line {e.lineno} column {e.colno}" if hasattr(e, "lineno") else ""  # type: ignore[attr-defined]
        raise error(f"{what}: not valid JSON: {getattr(e, 'msg', e)}{where}") from None
    except RecursionError:
        raise error(f"{what}: not valid JSON: nested too deeply") from None


def _string_map(value: object, where: str, error: type[OciError]) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise error(f"{where}: expected an object of strings, got {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise error(f"{where}[{key!r}]: expected a string, got {type(item).__name__}")
    return tuple(value.items())


def parse_state(data: bytes, *, require_pid: bool = True, allow_zero_pid: bool = False) -> State:
    """Parse and validate the state JSON a runtime writes to a hook's stdin.

    `bundle` (or the pre-17.06 runc name `bundlePath`, still accepted by NCT)
    must be an absolute path; `pid` must be a positive integer when
    `require_pid` (prestart needs it to find the mount namespace; `plan` runs
    without a container and passes False).  `allow_zero_pid`: crun hands
    createContainer hooks pid 0 (`container.c` `container_init_setup`); the
    CDI hook finds the container's process itself (`rootpin.hook_processes`).
    """
    what = "OCI state on stdin"
    if len(data) > MAX_STATE_BYTES:
        raise StateError(f"{what}: larger than {MAX_STATE_BYTES} bytes")
    if not data.strip():
        raise StateError(f"{what}: empty (run `pyxis-hook prestart` as a runtime hook, or use `pyxis-hook plan`)")
    return state_from_doc(_load_json(data, what, StateError), require_pid=require_pid, allow_zero_pid=allow_zero_pid)


def state_from_doc(doc: object, *, require_pid: bool = True, allow_zero_pid: bool = False) -> State:
    """`parse_state` of the document the state's bytes parse to (the hook's early exit has parsed them)."""
    what = "OCI state on stdin"
    if not isinstance(doc, dict):
        raise StateError(f"{what}: expected a JSON object, got {type(doc).__name__}")

    def text(key: str) -> str:
        value = doc.get(key, "")
        if not isinstance(value, str):
            raise StateError(f"{what}: field '{key}' must be a string, got {type(value).__name__}")
        return value

    bundle_key = "bundle" if "bundle" in doc else "bundlePath"
    bundle = doc.get(bundle_key)
    if bundle is None:
        raise StateError(f"{what}: field 'bundle' is missing")
    if not isinstance(bundle, str) or not bundle.startswith("/") or "\0" in bundle:
        raise StateError(f"{what}: field '{bundle_key}' must be an absolute path, got {bundle!r}")
    pid = doc.get("pid")
    least = 0 if allow_zero_pid else 1
    if pid is not None and (isinstance(pid, bool) or not isinstance(pid, int) or pid < least):
        kind = "a non-negative" if allow_zero_pid else "a positive"
        raise StateError(f"{what}: field 'pid' must be {kind} integer, got {pid!r}")
    if pid is None and require_pid:
        raise StateError(f"{what}: field 'pid' is missing (the container has no init process yet?)")
    return State(
        oci_version=text("ociVersion"),
        id=text("id"),
        status=text("status"),
        pid=pid,
        bundle=pathnames.normpath(bundle),
        annotations=_string_map(doc.get("annotations"), f"{what}: field 'annotations'", StateError),
    )


@record
class LinuxDevice:
    """One entry of config.json `linux.devices`: what the CDI proc-driver step matches GPU nodes on."""

    path: str
    type: str
    major: int | None
    minor: int | None


@record
class Bundle:
    """The parts of a bundle's config.json that GPU injection depends on."""

    #: absolute, normalised bundle directory
    path: str
    config_path: str
    #: absolute host path of the root filesystem (relative `root.path` joined to `path`)
    rootfs: str
    #: `process.env` as (name, value) pairs in order, duplicates kept; see `env_map`
    env: tuple[tuple[str, str], ...] = ()
    #: (key, value) pairs in document order
    annotations: tuple[tuple[str, str], ...] = ()
    linux_devices: tuple[LinuxDevice, ...] = ()
    #: `process.capabilities.bounding`
    bounding_capabilities: tuple[str, ...] = ()

    def env_map(self) -> dict[str, str]:
        """The container environment as a dict; the last duplicate wins."""
        return env_map(self.env)

    def annotation_map(self) -> dict[str, str]:
        return dict(self.annotations)

    @property
    def privileged(self) -> bool:
        """NCT's test: CAP_SYS_ADMIN in the bounding set (`internal/config/image/privileged.go`)."""
        return "CAP_SYS_ADMIN" in self.bounding_capabilities


def split_env_entry(entry: str, where: str = "process.env") -> tuple[str, str]:
    """Split `NAME=value` at the first '='; an entry without '=' is an error, as in NCT."""
    if not isinstance(entry, str):
        raise OciError(f"{where}: expected a string, got {type(entry).__name__}")
    name, sep, value = entry.partition("=")
    if not sep:
        raise OciError(f"{where}: invalid environment variable {entry!r} (no '=')")
    return name, value


def env_map(env: Iterable[str | tuple[str, str]]) -> dict[str, str]:
    """Build the environment map in order so that the LAST duplicate wins.

    That is what NCT does (`internal/config/image/builder.go` `WithEnv`) and
    what lets Docker's appended `NVIDIA_VISIBLE_DEVICES` override the image's.
    Accepts raw `NAME=value` strings or already split pairs.
    """
    result: dict[str, str] = {}
    for i, entry in enumerate(env):
        if isinstance(entry, tuple):
            name, value = entry
        else:
            name, value = split_env_entry(entry, f"process.env[{i}]")
        result.pop(name, None)  # keep dict order = order of the winning entries
        result[name] = value
    return result


def read_config_bytes(config_path: str) -> bytes:
    """Read config.json without following a symlink on its last component.

    A bundle directory is owned by whoever created the container; a symlink
    named config.json could point the hook (running as root) at any file.
    """
    flags = posix.O_RDONLY | posix.O_CLOEXEC | posix.O_NOFOLLOW | getattr(posix, "O_NONBLOCK", 0)
    try:
        fd = posix.open(config_path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:  # the last component is a symlink
            raise OciError(f"{config_path}: is a symbolic link; refusing to follow it") from None
        raise OciError(f"{config_path}: cannot open: {e.strerror}") from None
    try:
        st = posix.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OciError(f"{config_path}: not a regular file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise OciError(f"{config_path}: larger than {MAX_CONFIG_BYTES} bytes")
        chunks = []
        total = 0
        while True:
            chunk = posix.read(fd, 1 << 16)
            if not chunk:
                break
            total += len(chunk)
            if total > MAX_CONFIG_BYTES:
                raise OciError(f"{config_path}: larger than {MAX_CONFIG_BYTES} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError as e:
        raise OciError(f"{config_path}: cannot read: {e.strerror}") from None
    finally:
        posix.close(fd)


class _Fields:
    """Typed access to one JSON object, with errors naming file and field path."""

    def __init__(self, doc: object, where: str, config_path: str):
        if not isinstance(doc, dict):
            raise OciError(f"{config_path}: '{where}' must be an object, got {type(doc).__name__}")
        self.doc = doc
        self.where = where
        self.config_path = config_path

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def _bad(self, key: str, expected: str, value: object) -> OciError:
        return OciError(f"{self.config_path}: '{self._name(key)}' must be {expected}, got {value!r}")

    def obj(self, key: str, required: bool = False) -> "_Fields | None":
        value = self.doc.get(key)
        if value is None:
            if required:
                raise OciError(f"{self.config_path}: '{self._name(key)}' is missing")
            return None
        return _Fields(value, self._name(key), self.config_path)

    def string(self, key: str, default: str | None = None) -> str:
        value = self.doc.get(key)
        if value is None:
            if default is None:
                raise OciError(f"{self.config_path}: '{self._name(key)}' is missing")
            return default
        if not isinstance(value, str):
            raise self._bad(key, "a string", value)
        return value

    def integer(self, key: str, default: int | None = None) -> int | None:
        value = self.doc.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._bad(key, "an integer", value)
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.doc.get(key)
        if value is None:
            return ()
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings", value)
        return tuple(value)

    def objects(self, key: str) -> list["_Fields"]:
        value = self.doc.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self._bad(key, "a list", value)
        return [_Fields(v, f"{self._name(key)}[{i}]", self.config_path) for i, v in enumerate(value)]


def parse_config(data: bytes, bundle_dir: str, config_path: str | None = None) -> Bundle:
    """Validate config.json bytes of the bundle at `bundle_dir` into a `Bundle`.

    Like NCT, a spec without `ociVersion`, `process` or `root` is refused.
    """
    bundle_dir = pathnames.normpath(pathnames.abspath(bundle_dir))
    config_path = config_path or pathnames.join(bundle_dir, "config.json")
    return bundle_from_doc(_load_json(data, config_path, OciError), bundle_dir, config_path)


def bundle_from_doc(value: object, bundle_dir: str, config_path: str) -> Bundle:
    """`parse_config` of the document config.json's bytes parse to; `bundle_dir` absolute and normalised."""
    doc = _Fields(value, "", config_path)
    doc.string("ociVersion")
    root = doc.obj("root", required=True)
    process = doc.obj("process", required=True)
    if root is None or process is None:  # required=True has raised already; this narrows the types
        raise OciError(f"{config_path}: 'root' and 'process' are required")

    root_path = root.string("path")
    if not root_path:
        raise OciError(f"{config_path}: 'root.path' is empty")
    if "\0" in root_path:
        raise OciError(f"{config_path}: 'root.path' contains a NUL byte")
    rootfs = pathnames.normpath(pathnames.join(bundle_dir, root_path))

    env_entries = process.strings("env")
    env = tuple(split_env_entry(e, f"{config_path}: process.env[{i}]") for i, e in enumerate(env_entries))
    caps = process.obj("capabilities")
    bounding = caps.strings("bounding") if caps else ()

    linux = doc.obj("linux")
    devices: tuple[LinuxDevice, ...] = ()
    if linux is not None:
        devices = tuple(
            LinuxDevice(path=d.string("path"), type=d.string("type", ""), major=d.integer("major"),
                        minor=d.integer("minor"))
            for d in linux.objects("devices")
        )

    return Bundle(
        path=bundle_dir,
        config_path=config_path,
        rootfs=rootfs,
        env=env,
        annotations=_string_map(doc.doc.get("annotations"), f"{config_path}: 'annotations'", OciError),
        linux_devices=devices,
        bounding_capabilities=bounding,
    )


def config_path_of(bundle_dir: str) -> str:
    """The config.json `load_bundle(bundle_dir)` reads."""
    return pathnames.join(pathnames.normpath(pathnames.abspath(bundle_dir)), "config.json")


def load_bundle(bundle_dir: str) -> Bundle:
    """Open `<bundle_dir>/config.json` safely and parse it (see `parse_config`)."""
    config_path = config_path_of(bundle_dir)
    return parse_config(read_config_bytes(config_path), pathnames.dirname(config_path), config_path)


def state_annotations(state: State, bundle: Bundle) -> Mapping[str, str]:
    """Annotations as the hook should see them: config.json's, overridden by the state's."""
    merged = dict(bundle.annotations)
    merged.update(state.annotations)
    return merged
