"""pyxis.conf: where it is found, the built-in defaults, and reading one.

The file is TOML, valid when `schemas/pyxis-conf.schema.json` accepts it:
jsonschema decides (`spec.confcheck`).  A start imports neither jsonschema
nor `re` for a file it has seen: `read_config` takes the verdict the node
artifact records (`host.artifact`, under its trust rule) for bytes the
schema already accepted, and checks only when it records none for them: on
the first start after the file or the schema changed.  The package's
owner's start then records the new verdict in the artifact
(`artifact.obtain`); reading a configuration writes nothing.
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

    from pyxis_hook.host.artifact import Stored

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
    """Find, parse and validate pyxis.conf (`read_config`'s Config); built-in defaults when there is none."""
    return read_config(explicit, environ, verdicts)[0]


def read_config(explicit: str | None = None, environ: dict[str, str] | None = None,
                verdicts: bool = True) -> tuple[Config, Stored | None]:
    """(the Config, the node artifact read for its verdict): pyxis.conf found, parsed and validated.

    Built-in defaults and None when there is no file.  The bytes are parsed
    as `parse_config` parses them.  With `verdicts`, the node artifact at the
    path the parsed values give is read first (`host.artifact.read`); when it
    records a verdict that holds for these bytes (`holds`), jsonschema is not
    asked, else the values are checked (`spec.confcheck`).  A refused file is
    ConfigError naming the key; one that passes goes on with its new verdict
    (the Stored's last item), which `artifact.obtain` records as the package's
    owner: pass the Stored to it, so a start reads the artifact once.  Without
    `verdicts` (`config check`) the values are always checked, and no artifact is read.
    """
    path = find_config_path(explicit, environ)
    if path is None:
        return Config(), None
    from pyxis_hook.rootfs import read_regular_path

    try:
        raw = read_regular_path(path, 1 << 20)  # a FIFO or /dev/zero given as pyxis.conf: one line, no hang
    except OSError as e:
        raise ConfigError(f"{path}: cannot read configuration: {e.strerror}") from None
    data, text = _document(raw, path)
    values = _values(data)
    try:
        config = Config(source=path, **values)
    except TypeError:
        config = None  # an unknown key: the check names it
    stored = _stored(config) if verdicts and config is not None else None
    if stored is not None and holds(stored[1], text):
        return config, (*stored[:3], stored[1]["pyxis_conf"])
    _check(data, path)
    if stored is not None:
        from pyxis_hook.spec import confcheck

        kept = stored[1].get("pyxis_conf") if isinstance(stored[1], dict) else None
        others = [v for v in kept if isinstance(v, dict) and v.get("text") != text] if isinstance(kept, list) else []
        verdict = {"text": text, "schema": list(confcheck.schema_file()[1])}
        stored = (*stored[:3], [verdict, *others][:VERDICTS_KEPT])
    return Config(source=path, **values) if config is None else config, stored


def parse_config(raw: bytes, path: str = "<string>") -> Config:
    """Parse TOML bytes into a Config, with one-line errors naming file and key (ConfigError).

    A plain `key = value` file is read by flattoml (no tomllib import on the
    hook's path); anything else goes to tomllib (`toml_reader`), which also words the errors.
    The values are checked against the schema file with jsonschema (`spec.confcheck`).
    """
    data, _ = _document(raw, path)
    _check(data, path)
    return Config(source=path, **_values(data))


#: the pyxis.conf texts whose verdicts a node artifact keeps, newest first: two files that share one
#: artifact (they differ only in keys discovery does not read, e.g. log-level) must not undo each other's
VERDICTS_KEPT = 8


def holds(artifact_data: dict | None, text: str) -> bool:
    """Whether a node artifact's document (as `artifact.read` gives it) records that pyxis.conf's `text` passed the schema file
    as it is now: one of its verdicts (`VERDICTS_KEPT`) has the same text, and the schema file's stat signature
    (`host.freshness`) is unchanged."""
    from pyxis_hook.host.freshness import stat_signature

    try:
        for kept in artifact_data["pyxis_conf"]:
            if kept["text"] == text:
                return stat_signature(kept["schema"][0]) == tuple(kept["schema"])
    except (TypeError, KeyError, IndexError, ValueError):  # none recorded, or not as recorded here
        pass
    return False


def _document(raw: bytes, path: str) -> tuple[dict, str]:
    """(the TOML document of `raw`, its text); ConfigError naming `path` for bytes that are not one."""
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
    return data, text


def _values(data: dict) -> dict:
    """Config's keyword arguments for TOML document `data`: '_' for '-', a tuple for a list."""
    return {key.replace("-", "_"): tuple(value) if isinstance(value, list) else value for key, value in data.items()}


def _stored(config: Config) -> Stored | None:
    """The node artifact for the unchecked `config` (`artifact.read`); None when its values name none."""
    if not isinstance(config.snapshot_dir, str) or not config.snapshot_dir.startswith("/"):
        return None
    from pyxis_hook.host import artifact

    try:
        return artifact.read(config)
    except (TypeError, ValueError, AttributeError):  # a value of another type: the check names it
        return None


def _check(data: dict, path: str) -> None:
    """ConfigError naming `path` and the first bad key when the schema refuses `data` (`spec.confcheck`)."""
    from pyxis_hook.spec import confcheck

    problem = confcheck.problem(data)
    if problem:
        raise ConfigError(f"{path}: {problem}")


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
