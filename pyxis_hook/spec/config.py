"""pyxis.conf: where it is found, the built-in defaults, and reading one.

The file is TOML, valid when `schemas/pyxis-conf.schema.json` accepts it:
jsonschema decides (`spec.confcheck`).  A start imports neither jsonschema
nor `re` for a file it has seen: `load_config` takes a trusted verdict kept
beside the node artifact (`spec.confverdict`) for bytes the schema already
accepted, and checks (and, as root, keeps a verdict) only when there is
none: on the first start after the file or the schema changed.
"""

from __future__ import annotations

import posix
import sys

from pyxis_hook import pathnames
from pyxis_hook.errors import ConfigError
from pyxis_hook.record import field, fields, record

TYPE_CHECKING = False
if TYPE_CHECKING:  # hints only: nothing imported at run time (docs/decisions/2026-12-07-start-costs.md)
    from collections.abc import Mapping

DEFAULT_CONFIG_PATH = "/etc/pyxis-hook/pyxis.conf"
ENV_CONFIG = "PYXIS_HOOK_CONFIG"
DEFAULT_SNAPSHOT_DIR = "/var/cache/pyxis-hook"

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
    snapshot_dir: str = DEFAULT_SNAPSHOT_DIR
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


def load_config(explicit: str | None = None, environ: dict[str, str] | None = None, verdicts: bool = True) -> Config:
    """Find, parse and validate pyxis.conf (`parse_config`); built-in defaults when there is none."""
    path = find_config_path(explicit, environ)
    if path is None:
        return Config()
    from pyxis_hook.rootfs import read_regular_path

    try:
        raw = read_regular_path(path, 1 << 20)  # a FIFO or /dev/zero given as pyxis.conf: one line, no hang
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    return parse_config(raw, path, verdicts)


def parse_config(raw: bytes, path: str = "<string>", verdicts: bool = False) -> Config:
    """Parse TOML bytes into a Config, with one-line errors naming file and key (ConfigError).

    A plain `key = value` file is read by flattoml (no tomllib import on the
    hook's path); anything else goes to tomllib (`toml_reader`), which also words the errors.
    The values are checked against the schema file with jsonschema
    (`spec.confcheck`), unless `verdicts` and a kept verdict says these
    bytes at `path` passed already; with `verdicts`, a check that passes
    keeps one (`spec.confverdict`: as the package's owner, in the
    configured snapshot-dir).
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
    for key, value in data.items():  # a NUL would reach open()/exec() as "embedded null byte", naming nothing
        if any(isinstance(v, str) and "\0" in v for v in (value if isinstance(value, list) else [value])):
            raise ConfigError(f"{path}: key '{key}': contains a NUL byte")
    snapshot_dir = data.get("snapshot-dir", DEFAULT_SNAPSHOT_DIR) if verdicts else ""
    if not isinstance(snapshot_dir, str) or not snapshot_dir.startswith("/"):
        snapshot_dir = ""  # none to look in: the check names the key
    kept = False
    if snapshot_dir:
        from pyxis_hook.spec import confverdict

        kept = confverdict.holds(raw, path, snapshot_dir)
    if not kept:
        from pyxis_hook.spec import confcheck

        problem = confcheck.problem(data)
        if problem:
            raise ConfigError(f"{path}: {problem}")
        if snapshot_dir:
            schema, signature, _ = confcheck.schema_file()
            confverdict.keep(raw, path, snapshot_dir, schema, signature)
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


def config_keys() -> tuple[str, ...]:
    """The TOML key names, in declaration order."""
    return tuple(f.name.replace("_", "-") for f in fields(Config) if f.name != "source")
