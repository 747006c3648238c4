"""pyxis.conf: where it is found, what it may hold, and the built-in defaults.

The file is TOML.  It is validated against `schemas/pyxis-conf.schema.json`
by a small interpreter of the schema subset we use (type, enum, pattern,
items, uniqueItems, additionalProperties) so that the per-container path never
imports jsonschema; the tests check that jsonschema itself agrees.  What the
interpreter reads of that schema is kept here as code (`SCHEMA`), so no start
finds, reads or parses the file (docs/decisions/2026-12-07-start-costs.md).
A test keeps the two equal, keyword for keyword.
"""

from __future__ import annotations

import posix
import sys

from pyxis_hook import pathnames
from pyxis_hook.errors import ConfigError
from pyxis_hook.record import field, fields, record
from pyxis_hook.sysrecord import FACILITIES

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: nothing imported at run time (docs/decisions/2026-12-07-start-costs.md)
    from collections.abc import Mapping

DEFAULT_CONFIG_PATH = "/etc/pyxis-hook/pyxis.conf"
ENV_CONFIG = "PYXIS_HOOK_CONFIG"

ALL_CAPABILITIES = ("compute", "compat32", "graphics", "utility", "video", "display", "ngx")


@record
class Config:
    """The effective configuration; attribute names are the TOML keys with '_' for '-'."""

    driver_root: str = "/"
    dev_root: str = "/"
    proc_root: str = "/proc"
    ldconfig: str = "@/sbin/ldconfig"
    ldcache: str = "merge"
    no_cgroups: bool = False
    log_file: str = ""
    log_level: str = "info"
    syslog: bool = True
    syslog_facility: str = "daemon"
    default_capabilities: tuple[str, ...] = ("utility", "compute")
    supported_capabilities: tuple[str, ...] = ALL_CAPABILITIES
    disable_require: bool = False
    slurm_policy: str = "allocation"
    snapshot_dir: str = "/var/cache/pyxis-hook"
    path: tuple[str, ...] = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
    mps_pipe_dir: str = "/tmp/nvidia-mps"
    graphics_config_files: bool = False
    cuda_compat: str = "ldconfig"
    cdi_kind: str = "nvidia.com/gpu"
    writable_bundle: str = "warn"
    #: where the values came from: a file path, or "<defaults>"
    source: str = field(default="<defaults>", compare=False)

    def host_ldconfig(self) -> tuple[bool, str]:
        """Return (is_host_binary, path) for the `ldconfig` key.

        `@/sbin/ldconfig` names a host binary.  Ubuntu's /sbin/ldconfig is a
        shell wrapper around ldconfig.real, so a sibling `.real` is preferred
        when the host has one (apptainer#2028).
        """
        value = self.ldconfig
        if value.startswith("@"):
            path = value[1:]
            real = path + ".real"
            if not path.endswith(".real") and pathnames.isfile(real):
                return True, real
            return True, path
        return False, value


def find_config_path(explicit: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """--config, else $PYXIS_HOOK_CONFIG, else the default path if it exists, else None.

    Without `environ`, the process's own: `os.environ` once something imported
    `os` (it is the live copy: its writes reach putenv, not `posix.environ`),
    else `posix.environ`, the interpreter's copy at start (bytes names and
    values, decoded as `os.environ` decodes them): a container start does not
    import `os` (pathnames.py says why).
    """
    if explicit:
        return explicit
    if environ is None:
        os_module = sys.modules.get("os")
        if os_module is not None:
            value = os_module.environ.get(ENV_CONFIG)
        else:
            raw = posix.environ.get(ENV_CONFIG.encode())
            value = pathnames.fsdecode(raw) if raw is not None else None
    else:
        value = environ.get(ENV_CONFIG)
    if value:
        return value
    if pathnames.exists(DEFAULT_CONFIG_PATH):
        return DEFAULT_CONFIG_PATH
    return None


def load_config(explicit: str | None = None, environ: dict[str, str] | None = None) -> Config:
    """Find, parse and validate pyxis.conf; built-in defaults when there is none."""
    path = find_config_path(explicit, environ)
    if path is None:
        return Config()
    from pyxis_hook.rootfs import read_regular_path

    try:
        raw = read_regular_path(path, 1 << 20)  # a FIFO or /dev/zero given as pyxis.conf: one line, no hang
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    return parse_config(raw, path)


def parse_config(raw: bytes, path: str = "<string>") -> Config:
    """Parse TOML bytes into a Config, with one-line errors naming file and key.

    A plain `key = value` file is read by flattoml (no tomllib import on the
    hook's path); anything else goes to tomllib (`toml_reader`), which also words the errors.
    """
    from pyxis_hook.spec import flattoml

    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    data = flattoml.loads(text)
    if data is None:
        toml = toml_reader(path)
        try:
            data = toml.loads(text)
        except toml.TOMLDecodeError as e:
            raise ConfigError(f"{path}: not valid TOML: {e}") from None
    problem = validate(data, SCHEMA)
    if problem:
        raise ConfigError(f"{path}: {problem}")
    for key, value in data.items():  # a NUL would reach open()/exec() as "embedded null byte", naming nothing
        if any(isinstance(v, str) and "\0" in v for v in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"{path}: key '{key}': contains a NUL byte")
    values: dict = {}  # key -> TOML value, as Config takes them
    for key, value in data.items():
        name = key.replace("-", "_")
        values[name] = tuple(value) if isinstance(value, list) else value
    return Config(source=path, **values)


def toml_reader(path: str = "<string>"):
    """The TOML reader module: `tomllib` (Python >= 3.11), else `tomli`, the package it was made from.

    setup.cfg requires tomli on Python < 3.11.  Errors: ConfigError naming `path` when neither is there.
    """
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError:
        raise ConfigError(f"{path}: more than flat `key = value` lines, which Python < 3.11 reads with tomli: "
                          "it is not installed") from None
    return tomli


#: `schemas/pyxis-conf.schema.json` as `validate` reads it: its validation keywords, without the
#: descriptions and defaults (tests/unit/spec/test_config.py checks that it equals the file)
_SYSLOG_FACILITIES = list(FACILITIES)  # the names log.configure takes
_CAPABILITY = {"type": "string", "enum": ["compute", "compat32", "graphics", "utility", "video", "display", "ngx"]}
SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "driver-root": {"type": "string", "pattern": "^/"},
        "dev-root": {"type": "string", "pattern": "^/"},
        "proc-root": {"type": "string", "pattern": "^/"},
        "ldconfig": {"type": "string", "pattern": "^@?/"},
        "ldcache": {"type": "string", "enum": ["merge", "ldconfig"]},
        "no-cgroups": {"type": "boolean"},
        "log-file": {"type": "string", "pattern": "^(/.*)?$"},
        "log-level": {"type": "string", "enum": ["debug", "info", "warning", "error"]},
        "syslog": {"type": "boolean"},
        "syslog-facility": {"type": "string", "enum": _SYSLOG_FACILITIES},
        "default-capabilities": {"type": "array", "uniqueItems": True, "items": _CAPABILITY},
        "supported-capabilities": {"type": "array", "uniqueItems": True, "items": _CAPABILITY},
        "disable-require": {"type": "boolean"},
        "slurm-policy": {"type": "string", "enum": ["allocation", "ignore"]},
        "snapshot-dir": {"type": "string", "pattern": "^/"},
        "path": {"type": "array", "items": {"type": "string", "pattern": "^/"}},
        "mps-pipe-dir": {"type": "string", "pattern": "^/"},
        "graphics-config-files": {"type": "boolean"},
        "cuda-compat": {"type": "string", "enum": ["ldconfig", "disabled"]},
        "cdi-kind": {"type": "string", "pattern": "^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$"},
        "writable-bundle": {"type": "string", "enum": ["warn", "refuse"]},
    },
}


_TYPES = {
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "integer": (int,),
}


def _type_ok(value: object, typ: str) -> bool:
    if typ == "integer" and isinstance(value, bool):
        return False
    return isinstance(value, _TYPES[typ])


def _describe(sub: dict) -> str:
    if "enum" in sub:
        return "one of " + ", ".join(map(str, sub["enum"]))
    if sub.get("type") == "array":
        items = sub.get("items", {})
        return "a list of " + (_describe(items) if items else "values")
    if "pattern" in sub:
        hint = {"^/": "an absolute path", "^@?/": "an absolute path, '@' first for a host binary",
                "^(/.*)?$": "an absolute path or \"\""}.get(sub["pattern"])
        return f"a {sub.get('type', 'value')} ({hint or 'matching ' + sub['pattern']})"
    return f"a {sub.get('type', 'value')}"


def _one_line(v: str) -> bool:
    """No newline, except one at the very end (what `.*$` lets through)."""
    return "\n" not in (v[:-1] if v.endswith("\n") else v)


_VENDOR = frozenset("abcdefghijklmnopqrstuvwxyz0123456789.-")
_CLASS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _cdi_kind(v: str) -> bool:
    vendor, slash, cls = (v[:-1] if v.endswith("\n") else v).partition("/")
    return (bool(slash) and vendor[:1].isascii() and vendor[:1].isalnum() and not vendor[:1].isupper()
            and _VENDOR.issuperset(vendor) and cls[:1].isascii() and cls[:1].isalnum() and _CLASS.issuperset(cls))


#: re.search(pattern, value) for the patterns schemas/pyxis-conf.schema.json uses, as string code:
#: `re` stays off the start path (docs/decisions/2026-12-07-start-costs.md).
#: tests/unit/spec/test_config.py checks each against re; a pattern missing here still works (through re), just slower.
PATTERN_CHECKS = {
    "^/": lambda v: v.startswith("/"),
    "^@?/": lambda v: v.startswith(("/", "@/")),
    "^(/.*)?$": lambda v: v in ("", "\n") or (v.startswith("/") and _one_line(v)),
    "^[a-z0-9][a-z0-9.-]*/[a-zA-Z0-9][a-zA-Z0-9_.-]*$": _cdi_kind,
}


def _pattern_ok(pattern: str, value: str) -> bool:
    check = PATTERN_CHECKS.get(pattern)
    if check is not None:
        return check(value)
    import re

    return re.search(pattern, value) is not None


def validate(value: object, schema: dict = SCHEMA, where: str = "") -> str | None:
    """Check `value` against the schema subset we use; return one line or None.

    The line names the key (`key 'log-level'`), the bad value and what is
    allowed.  Kept tiny on purpose: it runs on the hook's hot path.
    """
    label = f"key '{where}'" if where else "top level"
    typ = schema.get("type")
    if typ and not _type_ok(value, typ):
        return f"{label}: {value!r} is not {_describe(schema)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{label}: {value!r} is not {_describe(schema)}"
    if "pattern" in schema and isinstance(value, str) and not _pattern_ok(schema["pattern"], value):
        return f"{label}: {value!r} is not {_describe(schema)}"
    if isinstance(value, list):
        if schema.get("uniqueItems") and len(set(map(repr, value))) != len(value):
            return f"{label}: {value!r} repeats an item"
        items = schema.get("items")
        if items:
            for i, item in enumerate(value):
                problem = validate(item, items, where)
                if problem:
                    return problem.replace(f"key '{where}'", f"key '{where}[{i}]'", 1) if where else problem
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for key, item in value.items():
            sub = props.get(key)
            if sub is None:
                if schema.get("additionalProperties", True) is False:
                    allowed = ", ".join(sorted(props))
                    return f"unknown key '{key}' (known keys: {allowed})"
                continue
            problem = validate(item, sub, key if not where else f"{where}.{key}")
            if problem:
                return problem
    return None


def config_keys() -> tuple[str, ...]:
    """The TOML key names, in declaration order."""
    return tuple(f.name.replace("_", "-") for f in fields(Config) if f.name != "source")
