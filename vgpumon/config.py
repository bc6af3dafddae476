"""Settings: one typed object, read from a TOML file, ``VGPUMON_*`` environment variables and
command-line flags (docs/configuration.md).

Precedence, highest first: a command-line flag, then the environment, then the config file, then
the default. Every value is validated once, here, whatever its origin; an invalid one is reported
in one line that names where it came from (``--window``, ``VGPUMON_STORE__URL``,
``config.toml: [diagnose] window``). Sections (``[store]``, ``[agent]``, ``[vllm]``,
``[diagnose]``, ``[exporter]``, ``[rules]``, ``[api]``) are pydantic models: a new feature adds
its own section as one more field of ``Settings``.

Environment variables: ``VGPUMON_<SECTION>__<KEY>`` for every setting (``VGPUMON_STORE__URL``,
``VGPUMON_AGENT__INTERVAL``), plus the short names the README documents (``VGPUMON_DB``,
``VGPUMON_HOSTNAME``, ... in ``ENV_ALIASES``); the long form wins when both are set. Empty
variables count as unset.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
import re
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Optional

import platformdirs
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings import SettingsError as _PydanticSettingsError

from vgpumon.base.durations import MAX_DURATION_S, format_duration, parse_duration
from vgpumon.base.errors import ConfigFileError, UsageError
from vgpumon.base.masking import MASK, mask_secrets

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ENV_PREFIX = "VGPUMON_"
CONFIG_ENV = "VGPUMON_CONFIG"
#: Short environment names (documented in the README since before the settings object) → the
#: setting they set.
ENV_ALIASES: dict[str, tuple[str, str]] = {
    "VGPUMON_DB": ("store", "url"),
    "VGPUMON_RAW_RETENTION": ("store", "raw_retention"),
    "VGPUMON_ROLLUP_RETENTION": ("store", "rollup_retention"),
    "VGPUMON_HOSTNAME": ("agent", "hostname"),
    "VGPUMON_SPOOL": ("agent", "spool"),
    "VGPUMON_LISTEN": ("exporter", "listen"),
    "VGPUMON_METRICS_FILE": ("exporter", "metrics_file"),
    "VGPUMON_KUBELET_SOCKET": ("exporter", "kubelet_socket"),
    "VGPUMON_ALERT_WEBHOOKS": ("rules", "webhooks"),
    "VGPUMON_ALERTMANAGERS": ("rules", "alertmanagers"),
    "VGPUMON_VLLM_URLS": ("vllm", "urls"),
    "VGPUMON_API_TOKEN": ("api", "token"),
}

# -- durations ----------------------------------------------------------------------------------
# (in vgpumon.base.durations, which the lean agent process imports without pydantic)

def _duration(minimum: float = 0.0, maximum: float = MAX_DURATION_S) -> Any:
    return BeforeValidator(lambda v: parse_duration(v, minimum=minimum, maximum=maximum))


Duration = Annotated[float, _duration()]


# -- other value checks -------------------------------------------------------------------------


def check_hostname(name: str) -> str:
    """A host name as stored: 1–255 characters (the ``hosts.hostname`` column), no control
    characters (they would break log lines and reports). Unicode and punctuation are fine.

    Raises:
        ValueError: empty, too long or with control characters.
    """
    if not name.strip():
        raise ValueError("empty host name")
    if len(name) > 255:
        raise ValueError(f"host name of {len(name)} characters; at most 255")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError("host name with control characters")
    return name


def normalise_vllm_url(text: str) -> str:
    """A vLLM base URL: ``http(s)://host:port`` (``host:port`` means ``http://host:port``),
    without a trailing slash.

    Raises:
        ValueError: not a URL of a host (spaces, no host, a port that is not a number).
    """
    from urllib.parse import urlsplit

    raw = text.strip()
    url = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        raise ValueError(f"{raw!r} is not a URL (e.g. http://127.0.0.1:8000)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in raw) or not raw:
        raise ValueError(f"{raw!r} is not an http(s) URL of a host (e.g. http://127.0.0.1:8000)")
    return url.rstrip("/")


def check_alert_url(text: str) -> str:
    """Where alerts are sent (a webhook, an Alertmanager): an ``http(s)://host[:port][/path]``
    URL, scheme written out (a typo must not become a host name that is never reached).

    Raises:
        ValueError: another scheme, no host, a bad port, spaces.
    """
    from urllib.parse import urlsplit

    raw = text.strip()
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        raise ValueError(f"{raw!r} is not a URL (e.g. http://alertmanager:9093)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in raw):
        raise ValueError(f"{raw!r} is not an http(s) URL of a host (e.g. http://alertmanager:9093)")
    return raw


def check_store_url(url: str) -> str:
    """A store URL as ``--db`` takes it: a SQLAlchemy URL of SQLite or Postgres, or a plain path
    of a SQLite file.

    Raises:
        ValueError: empty, not parseable, another database, or a SQLite URL without a file.
    """
    if not url.strip():
        raise ValueError("empty store URL (e.g. sqlite:///vgpumon.db, or a file path)")
    if "://" not in url:
        return url  # a plain file path
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ValueError(f"not a database URL: {mask_secrets(url)!r} (e.g. sqlite:///vgpumon.db)") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(f"vgpumon stores into SQLite or Postgres, not {backend!r}")
    if backend == "sqlite" and not parsed.database:
        raise ValueError("a SQLite store needs a file: sqlite:///path/to/vgpumon.db")
    if backend == "sqlite" and (parsed.database == ":memory:" or str(parsed.query.get("mode", "")) == "memory"):
        raise ValueError("an in-memory SQLite store keeps nothing and no other command can read it; give a file: sqlite:///path/to/vgpumon.db")
    return url


def _split_words(value: Any) -> Any:
    # VGPUMON_VLLM_URLS="http://a:8000 http://b:8000" (whitespace or commas between URLs)
    return [w for w in re.split(r"[\s,]+", value) if w] if isinstance(value, str) else value


# -- sections -----------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class StoreSettings(_Section):
    """``[store]``: where samples go and how long a command waits for the database."""

    url: Annotated[Optional[str], AfterValidator(lambda v: None if v is None else check_store_url(v))] = Field(
        None,
        description="sqlite:///path.db, a plain file path, or postgresql+psycopg://user@host/db; "
        "default: vgpumon.db under the user's data directory",
    )
    connect_timeout: Annotated[float, _duration(1, 3600)] = Field(
        5.0, description="Postgres: give up connecting after this long (libpq counts whole seconds, at least 2)"
    )
    statement_timeout: Annotated[float, _duration(0.001, 86400)] = Field(
        60.0, description="Postgres: the server cancels a statement that runs longer"
    )
    busy_timeout: Annotated[float, _duration(0.001, 3600)] = Field(
        5.0, description="SQLite: how long a write waits for another writer's lock"
    )
    raw_retention: Duration = Field(72 * 3600.0, description="how long raw per-tick rows are kept")
    rollup_retention: Duration = Field(90 * 86400.0, description="how long 1-minute rollups are kept")


class AgentSettings(_Section):
    """``[agent]``: what ``vgpumon agent`` samples and where it holds ticks while the store is
    away."""

    hostname: Annotated[Optional[str], AfterValidator(lambda v: None if v is None else check_hostname(v))] = Field(
        None, description="name this host is stored under; default: the system host name"
    )
    interval: Annotated[float, _duration(0.05, 86400)] = Field(1.0, description="time between ticks")
    slow_every: Optional[int] = Field(
        None, ge=1, le=1_000_000, description="read the slow set every N ticks; default 10, or a replayed capture's cadence"
    )
    host_every: int = Field(5, ge=1, le=1_000_000, description="sample host CPU/memory and GPU processes every N ticks")
    reprobe_every: int = Field(
        600, ge=1, le=1_000_000,
        description="ask again every N ticks the NVML calls a GPU answered 'not supported' (a driver upgrade or a MIG change can make them answer)",
    )
    call_deadline: Optional[Annotated[float, _duration(0.01, 60)]] = Field(
        None, description="a GPU whose read takes longer counts as wedged and is skipped until the call returns; default: half the interval, 0.25–5 s"
    )
    flush_interval: Optional[Annotated[float, _duration(0.1, 300)]] = Field(
        None, description="time between batched writes to the store; a process killed outright loses at most this much; "
        "default: 10 s, 5 s for a replay as fast as possible"
    )
    gpm: bool = Field(True, description="use GPM for SM activity and PCIe bytes/s where the GPU has it")
    spool: Optional[Path] = Field(
        None, description="directory where ticks wait while the store is away; default: per store under the user's state directory"
    )
    spool_max_mb: int = Field(1024, ge=1, le=1 << 30, description="spool size above which its oldest ticks become 1-minute rollups")
    buffer_max_rows: int = Field(
        8 * 3600, ge=1, le=1 << 40, description="rows held in memory when the spool cannot be written"
    )

    @field_validator("spool")
    @classmethod
    def _spool_not_empty(cls, v: Optional[Path]) -> Optional[Path]:
        if v is not None and str(v).strip() in ("", "."):
            raise ValueError("empty spool directory")
        return v


class VllmSettings(_Section):
    """``[vllm]``: the vLLM servers the agent scrapes."""

    enabled: bool = Field(True, description="discover and scrape vLLM servers")
    urls: Annotated[list[str], NoDecode, BeforeValidator(_split_words)] = Field(
        default_factory=list, description="also scrape these servers (e.g. published by a container)"
    )
    interval: Annotated[float, _duration(0.1, 3600)] = Field(2.0, description="time between scrapes")

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return [normalise_vllm_url(u) for u in v]


class DiagnoseSettings(_Section):
    """``[diagnose]``: the report's window and how long it may take."""

    window: Duration = Field(900.0, description="window ending at the host's newest stored sample")
    max_age: Optional[Duration] = Field(
        None, description="UNKNOWN when the newest sample is older than this (monitoring); default: report on what is stored"
    )
    timeout: Annotated[float, _duration(1, 3600)] = Field(
        10.0, description="answer UNKNOWN when the store or the agent has not answered within this long"
    )
    port: int = Field(
        19400, ge=1, le=65535, description="port of the agent that `diagnose HOST` asks when HOST names none (its /api/v1)"
    )


def _check_listen(v: str) -> str:
    from vgpumon.base.listen import ListenError, parse_listen

    try:
        parse_listen(v)
    except ListenError as exc:
        raise ValueError(str(exc)) from None
    return v.strip()


class ExporterSettings(_Section):
    """``[exporter]``: the agent's ``/metrics`` and ``/healthz`` (docs/exporter.md)."""

    listen: Annotated[str, AfterValidator(_check_listen)] = Field(
        "127.0.0.1:19400",
        description="host:port to serve /metrics and /healthz on ([v6]:port, :port for every interface, or off); "
        "19400 is used by no common exporter",
    )
    metrics_file: Optional[Path] = Field(
        None, description="serve only the metric families this selection file lists (exporters/metrics.csv format)"
    )
    kubelet_socket: Optional[str] = Field(
        None,
        description="the kubelet's pod-resources socket for pod/namespace/container labels; "
        "default /var/lib/kubelet/pod-resources/kubelet.sock where it exists; off to skip",
    )


class ApiSettings(_Section):
    """``[api]``: the agent's read-only HTTP API (``/api/v1/…``, on the ``/metrics`` server) and
    the token ``diagnose HOST`` sends to it (docs/api.md)."""

    enabled: bool = Field(True, description="serve /api/v1 on the exporter's listen address")
    token: Optional[SecretStr] = Field(
        None,
        description="bearer token: the agent requires it on every /api/v1 request when bound off loopback "
        "(and whenever it is set); diagnose sends it",
    )
    stacks: bool = Field(
        False, description="let `diagnose --stacks` run py-spy dump on this host's vLLM server processes (needs ptrace rights)"
    )

    @field_validator("token")
    @classmethod
    def _token(cls, v: Optional[SecretStr]) -> Optional[SecretStr]:
        if v is not None:
            text = v.get_secret_value()
            if not text.strip() or any(c.isspace() or ord(c) < 33 or ord(c) > 126 for c in text):
                # a header value: printable ASCII without spaces (RFC 6750 b64token)
                raise ValueError("a token is printable ASCII without spaces")
        return v


def _check_thresholds(v: dict[str, Any]) -> dict[str, Any]:
    from vgpumon.rules.thresholds import Thresholds

    Thresholds.from_mapping(v, _rule_names)  # unknown keys, wrong types and values, unknown rule names refused here
    return v


def _rule_names() -> frozenset[str]:
    """The rule names, imported only when ``for`` or ``disabled`` names one: the catalogue
    imports every rule and, through their views, the store (every command checks its settings)."""
    from vgpumon.rules.catalogue import rule_names

    return rule_names()


def _alert_urls(v: list[str]) -> list[str]:
    return [check_alert_url(u) for u in v]


class RulesSettings(_Section):
    """``[rules]``: the rule engine in the agent and in ``diagnose``, and where alerts go
    (docs/rules.md). ``[rules.thresholds]`` overrides thresholds, ``for`` durations per rule and
    disables rules by name."""

    enabled: bool = Field(True, description="evaluate the rules in the agent (--no-rules sets false)")
    webhooks: Annotated[list[str], NoDecode, BeforeValidator(_split_words), AfterValidator(_alert_urls)] = Field(
        default_factory=list, description="POST firing and resolved alerts as JSON to these URLs"
    )
    alertmanagers: Annotated[list[str], NoDecode, BeforeValidator(_split_words), AfterValidator(_alert_urls)] = Field(
        default_factory=list, description="send alerts to these Alertmanagers (base URL; API v2)"
    )
    thresholds: Annotated[dict[str, Any], AfterValidator(_check_thresholds)] = Field(
        default_factory=dict, description="threshold overrides (keys in docs/rules.md), 'for' per rule, 'disabled' rules"
    )


LogLevel = Literal["debug", "info", "warning", "error"]

_FILE_DATA: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("vgpumon_config_file", default={})  # noqa: B039  the default is never mutated: each load sets its own dict


class _DictSource(PydanticBaseSettingsSource):
    """A settings source over a ready dict (the config file's table, the short env names)."""

    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]) -> None:
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:  # pragma: no cover - unused
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


def _alias_env() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var, (section, key) in ENV_ALIASES.items():
        value = os.environ.get(var)
        if value:
            out.setdefault(section, {})[key] = value
    return out


class Settings(BaseSettings):
    """Every setting of vgpumon, by section. Build it with ``load_settings``."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_ignore_empty=True,
        case_sensitive=False,
        extra="forbid",
        validate_default=True,
    )

    log_level: LogLevel = Field("warning", description="how much to log on stderr")
    store: StoreSettings = Field(default_factory=StoreSettings)
    agent: AgentSettings = Field(default_factory=AgentSettings)
    vllm: VllmSettings = Field(default_factory=VllmSettings)
    diagnose: DiagnoseSettings = Field(default_factory=DiagnoseSettings)
    exporter: ExporterSettings = Field(default_factory=ExporterSettings)
    rules: RulesSettings = Field(default_factory=RulesSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # flags > VGPUMON_<SECTION>__<KEY> > short names > config file > defaults; no .env files
        return init_settings, env_settings, _DictSource(settings_cls, _alias_env()), _DictSource(settings_cls, _FILE_DATA.get())

    @property
    def origins(self) -> dict[str, str]:
        """Where each setting came from, by dotted path: a flag (``--db``), an environment
        variable, the config file (``FILE: [section] key``) or ``default``."""
        return dict(getattr(self, "_origins", {}))

    @property
    def config_file(self) -> Path | None:
        """The config file that was read, ``None`` when none was."""
        return getattr(self, "_config_file", None)


def default_db_url() -> str:
    """The store when none is configured: a SQLite file under the user's data directory
    (``~/.local/share/vgpumon/vgpumon.db`` on Linux)."""
    return f"sqlite:///{Path(platformdirs.user_data_dir('vgpumon')) / 'vgpumon.db'}"


def default_hostname() -> str:
    """The system host name (what the agent stores under when ``agent.hostname`` is unset)."""
    return socket.gethostname()


def default_spool_dir(db_url: str) -> Path:
    """A spool directory per store URL under the user's state directory
    (``~/.local/state/vgpumon/spool/<hash>`` on Linux): rows spooled for one store are never
    replayed into another. Put it on a different disk than a SQLite store (docs/store.md)."""
    digest = hashlib.sha256(db_url.encode()).hexdigest()[:12]
    return Path(platformdirs.user_state_dir("vgpumon")) / "spool" / digest


def default_config_file() -> Path:
    """``config.toml`` under the user's config directory (``~/.config/vgpumon/`` on Linux)."""
    return Path(platformdirs.user_config_dir("vgpumon")) / "config.toml"


# -- loading ------------------------------------------------------------------------------------

#: A flag given on the command line: setting path → (option name, value).
Flags = dict[tuple[str, ...], tuple[str, Any]]


def _leaves(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            yield from _leaves(ann, (*prefix, name))
        else:
            yield (*prefix, name)


def _has(data: Any, path: tuple[Any, ...]) -> bool:
    return _get(data, path) is not None  # TOML has no null: a key present has a value


def _get(data: Any, path: tuple[Any, ...]) -> Any:
    """The value at ``path`` in nested dicts (``None`` where it is not)."""
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _nested_env_name(path: tuple[str, ...]) -> str:
    return ENV_PREFIX + "__".join(p.upper() for p in path)


def _origin(path: tuple[Any, ...], flags: Flags, file: Path | None, file_data: dict[str, Any]) -> tuple[str, bool]:
    """Where the value at ``path`` came from, and whether that is the config file."""
    keys = tuple(str(p) for p in path if isinstance(p, str))
    for n in range(len(keys), 0, -1):
        if keys[:n] in flags:
            return flags[keys[:n]][0], False
    for n in range(len(keys), 0, -1):
        name = _nested_env_name(keys[:n])
        if any(k.upper() == name for k, v in os.environ.items() if v):
            return name, False
    for var, target in ENV_ALIASES.items():
        if keys[: len(target)] == target and os.environ.get(var):
            return var, False
    if file is not None and keys and _has(file_data, keys[:2]):
        if len(keys) >= 2 and isinstance(_get(file_data, keys[:2]), dict):  # a table: [rules.thresholds]
            where = f"[{keys[0]}.{keys[1]}]"
        else:
            where = f"[{keys[0]}] {keys[1]}" if len(keys) >= 2 else keys[0]
        return f"{file}: {where}", True
    return ".".join(keys) or "settings", False


def _exists(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # a home directory we may not search (another user's, via sudo -u): absent
        return False


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ConfigFileError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"config file {path} is not TOML: {exc}") from None


def load_settings(config_file: Path | None = None, flags: Flags | None = None) -> Settings:
    """Read the settings: ``flags`` over the environment over the config file over defaults, then
    fill the defaults that depend on the machine (store URL, host name, spool directory).

    Args:
        config_file: ``--config``; ``None`` reads ``$VGPUMON_CONFIG``, else ``default_config_file()``
            when it exists.
        flags: command-line flags that were given (``None`` values are left out by the caller).

    Returns:
        The validated settings; ``origins`` says where each value came from.

    Raises:
        UsageError: a flag or an environment variable has an invalid value (one line naming it).
        ConfigFileError: the config file is missing (when named), unreadable, not TOML, or holds
            an unknown key or an invalid value (the line names the file and the key).
    """
    flags = {k: v for k, v in (flags or {}).items() if v[1] is not None}
    path: Path | None = config_file
    if path is None and os.environ.get(CONFIG_ENV):
        path = Path(os.environ[CONFIG_ENV])
    elif path is None and _exists(default_config_file()):
        path = default_config_file()
    file_data = _read_config_file(path.expanduser()) if path is not None else {}
    init: dict[str, Any] = {}
    for keys, (_, value) in flags.items():
        node = init
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    token = _FILE_DATA.set(file_data)
    try:
        settings = Settings(**init)
    except ValidationError as exc:
        err = exc.errors()[0]
        origin, in_file = _origin(err["loc"], flags, path, file_data)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown setting (see docs/configuration.md)"
        elif err["type"] not in ("value_error",) and "input" in err and not isinstance(err["input"], (dict, list)):
            msg += f" (got {mask_secrets(repr(err['input']))})"
        sep = " " if origin.endswith("]") else ": "  # "[rules.thresholds] key: …", "[agent] interval: …"
        raise (ConfigFileError if in_file else UsageError)(f"invalid {origin}{sep}{mask_secrets(msg)}") from None
    except _PydanticSettingsError as exc:  # VGPUMON_<SECTION> set to something that is not JSON
        m = re.search(r'field "(\w+)"', str(exc))
        name = ENV_PREFIX + m.group(1).upper() if m else "environment"
        raise UsageError(f"invalid {name}: a whole section must be a JSON object; set {name}__<KEY> instead") from None
    finally:
        _FILE_DATA.reset(token)
    origins: dict[str, str] = {}
    for leaf in _leaves(Settings):
        origin, _ = _origin(leaf, flags, path, file_data)
        origins[".".join(leaf)] = origin if origin != ".".join(leaf) else "default"
    if settings.store.rollup_retention < settings.store.raw_retention:
        origin, in_file = _origin(("store", "rollup_retention"), flags, path, file_data)
        if origin == "store.rollup_retention":
            origin, in_file = _origin(("store", "raw_retention"), flags, path, file_data)
        raise (ConfigFileError if in_file else UsageError)(
            f"invalid {origin}: rollups ({format_duration(settings.store.rollup_retention)}) must be kept at least as long "
            f"as raw rows ({format_duration(settings.store.raw_retention)})"
        )
    if settings.store.url is None:
        settings.store.url = default_db_url()
    if settings.agent.hostname is None:
        settings.agent.hostname = default_hostname()
    if settings.agent.spool is None:
        settings.agent.spool = default_spool_dir(settings.store.url)
    settings._origins = origins  # type: ignore[attr-defined]
    settings._config_file = path  # type: ignore[attr-defined]
    return settings


def settings_document(settings: Settings, *, with_origins: bool = False) -> dict[str, Any]:
    """The effective settings as plain data with secrets masked, durations as text (``72h``).

    Args:
        settings: from ``load_settings``.
        with_origins: also return each value's origin (``{"value": ..., "from": ...}``).

    Returns:
        ``{"log_level": ..., "store": {...}, ...}``; ``None`` where a setting is unset.
    """
    doc: dict[str, Any] = {}
    origins = settings.origins
    for leaf in _leaves(Settings):
        obj: Any = settings
        for k in leaf:
            obj = getattr(obj, k)
        value = _plain(obj)
        node = doc
        for k in leaf[:-1]:
            node = node.setdefault(k, {})
        node[leaf[-1]] = {"value": value, "from": origins.get(".".join(leaf), "default")} if with_origins else value
    return doc


def _field(leaf: tuple[str, ...]) -> Any:
    model: Any = Settings
    info = None
    for k in leaf:
        info = model.model_fields[k]
        model = info.annotation
    return info


def _plain(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, SecretStr):
        return MASK
    if isinstance(value, float):  # every float setting is a duration (intervals, timeouts, windows)
        return format_duration(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, str):
        return mask_secrets(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def field_descriptions() -> dict[str, str]:
    """Dotted setting path → its description (for ``config show`` and the docs)."""
    return {".".join(leaf): (_field(leaf).description or "") for leaf in _leaves(Settings)}
