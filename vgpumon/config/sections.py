"""The sections of the settings (``[store]``, ``[agent]``, ``[vllm]``, ``[diagnose]``,
``[exporter]``, ``[api]``, ``[rules]``): one pydantic model each, its fields with their defaults,
ranges and descriptions (docs/configuration.md). A new feature adds its section here and one field
for it on ``vgpumon.config.settings.Settings``."""

from __future__ import annotations

import contextvars
from pathlib import Path
from typing import Annotated, Any, Callable, Collection, Optional

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from vgpumon.base.durations import MAX_DURATION_S, parse_duration
from vgpumon.config.checks import (
    check_alert_urls,
    check_hostname,
    check_listen,
    check_otlp_url,
    check_store_url,
    normalise_vllm_url,
    split_words,
)

# -- durations ----------------------------------------------------------------------------------
# (in vgpumon.base.durations, which the lean agent process imports without pydantic)

def _duration(minimum: float = 0.0, maximum: float = MAX_DURATION_S) -> Any:
    return BeforeValidator(lambda v: parse_duration(v, minimum=minimum, maximum=maximum))


def _off_or_duration(minimum: float, maximum: float) -> Any:
    """A duration, or 0 (``0``, ``"0s"``, ``"off"``) for "not at all"."""

    def parse(v: Any) -> float:
        if (isinstance(v, (int, float)) and not isinstance(v, bool) and v == 0) or (
                isinstance(v, str) and v.strip().lower() in ("0", "0s", "off")):
            return 0.0
        return parse_duration(v, minimum=minimum, maximum=maximum)

    return parse


Duration = Annotated[float, _duration()]


# -- sections -----------------------------------------------------------------------------------


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class StoreSettings(_Section):
    """``[store]``: where samples go and how long a command waits for the database."""

    url: Annotated[Optional[str], AfterValidator(lambda v: None if v is None else check_store_url(v))] = Field(
        default=None,
        description="sqlite:///path.db, a plain file path, or postgresql+psycopg://user@host/db; "
        "default: vgpumon.db under the user's data directory",
    )
    connect_timeout: Annotated[float, _duration(1, 3600)] = Field(
        default=5.0, description="Postgres: give up connecting after this long (libpq counts whole seconds, at least 2)"
    )
    statement_timeout: Annotated[float, _duration(0.001, 86400)] = Field(
        default=60.0, description="Postgres: the server cancels a statement that runs longer"
    )
    busy_timeout: Annotated[float, _duration(0.001, 3600)] = Field(
        default=5.0, description="SQLite: how long a write waits for another writer's lock"
    )
    raw_retention: Duration = Field(default=72 * 3600.0, description="how long raw per-tick rows are kept")
    rollup_retention: Duration = Field(default=90 * 86400.0, description="how long 1-minute rollups are kept")


class AgentSettings(_Section):
    """``[agent]``: what ``vgpumon agent`` samples and where it holds ticks while the store is
    away."""

    hostname: Annotated[Optional[str], AfterValidator(lambda v: None if v is None else check_hostname(v))] = Field(
        default=None, description="name this host is stored under; default: the system host name"
    )
    interval: Annotated[float, _duration(0.05, 86400)] = Field(default=1.0, description="time between ticks")
    slow_every: Optional[int] = Field(
        default=None, ge=1, le=1_000_000, description="read the slow set every N ticks; default 10, or a replayed capture's cadence"
    )
    host_every: int = Field(default=5, ge=1, le=1_000_000, description="sample host CPU/memory and GPU processes every N ticks")
    reprobe_every: int = Field(
        default=600, ge=1, le=1_000_000,
        description="ask again every N ticks the NVML calls a GPU answered 'not supported' (a driver upgrade or a MIG change can make them answer)",
    )
    call_deadline: Optional[Annotated[float, _duration(0.01, 60)]] = Field(
        default=None, description="a GPU whose read takes longer counts as wedged and is skipped until the call returns; default: half the interval, 0.25–5 s"
    )
    flush_interval: Optional[Annotated[float, _duration(0.1, 300)]] = Field(
        default=None, description="time between batched writes to the store; a process killed outright loses at most this much; "
        "default: 10 s, 5 s for a replay as fast as possible"
    )
    gpm: bool = Field(default=True, description="use GPM for SM activity and PCIe bytes/s where the GPU has it")
    spool: Optional[Path] = Field(
        default=None, description="directory where ticks wait while the store is away; default: per store under the user's state directory"
    )
    spool_max_mb: int = Field(default=1024, ge=1, le=1 << 30, description="spool size above which its oldest ticks become 1-minute rollups")
    buffer_max_rows: int = Field(
        default=8 * 3600, ge=1, le=1 << 40, description="rows held in memory when the spool cannot be written"
    )

    @field_validator("spool")
    @classmethod
    def _spool_not_empty(cls, v: Optional[Path]) -> Optional[Path]:
        if v is not None and str(v).strip() in ("", "."):
            raise ValueError("empty spool directory")
        return v


class VllmSettings(_Section):
    """``[vllm]``: the vLLM servers the agent scrapes."""

    enabled: bool = Field(default=True, description="discover and scrape vLLM servers")
    urls: Annotated[list[str], NoDecode, BeforeValidator(split_words)] = Field(
        default_factory=list, description="also scrape these servers (e.g. published by a container)"
    )
    interval: Annotated[float, _duration(0.1, 3600)] = Field(default=2.0, description="time between scrapes")
    probe_timeout: Annotated[float, BeforeValidator(_off_or_duration(0.1, 600))] = Field(
        default=10.0,
        description="deadline of the one-token generation probe of a server that reads idle while clients wait on it (0 or off: no probe)",
    )

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return [normalise_vllm_url(u) for u in v]


class DiagnoseSettings(_Section):
    """``[diagnose]``: the report's window and how long it may take."""

    window: Duration = Field(default=900.0, description="window ending at the host's newest stored sample")
    max_age: Optional[Duration] = Field(
        default=None, description="UNKNOWN when the newest sample is older than this (monitoring); default: report on what is stored"
    )
    timeout: Annotated[float, _duration(1, 3600)] = Field(
        default=10.0, description="answer UNKNOWN when the store or the agent has not answered within this long"
    )
    port: int = Field(
        default=19400, ge=1, le=65535, description="port of the agent that `diagnose HOST` asks when HOST names none (its /api/v1)"
    )


class ExporterSettings(_Section):
    """``[exporter]``: the agent's ``/metrics`` and ``/healthz`` (docs/exporter.md)."""

    listen: Annotated[str, AfterValidator(check_listen)] = Field(
        default="127.0.0.1:19400",
        description="host:port to serve /metrics and /healthz on ([v6]:port, :port for every interface, or off); "
        "19400 is used by no common exporter",
    )
    metrics_file: Optional[Path] = Field(
        default=None, description="serve only the metric families this selection file lists (exporters/metrics.csv format)"
    )
    kubelet_socket: Optional[str] = Field(
        default=None,
        description="the kubelet's pod-resources socket for pod/namespace/container labels; "
        "default /var/lib/kubelet/pod-resources/kubelet.sock where it exists; off to skip",
    )
    otlp_url: Annotated[Optional[str], AfterValidator(check_otlp_url)] = Field(
        default=None,
        description="also push the GPU fields over OTLP/HTTP to this collector (base URL or its /v1/metrics; "
        "headers from OTEL_EXPORTER_OTLP_HEADERS); needs the otlp extra",
    )
    otlp_interval: Annotated[float, _duration(1, 3600)] = Field(default=15.0, description="time between OTLP pushes")
    header_timeout: Annotated[float, _duration(1, 600)] = Field(
        default=10.0,
        description="a connection to /metrics and the API has this long from its accept (or a later request's "
        "first byte) to the end of its request's headers, then it is closed",
    )
    keepalive_timeout: Annotated[float, _duration(1, 3600)] = Field(
        default=75.0, description="an idle keep-alive connection is closed after this long"
    )
    max_connections: int = Field(
        default=64, ge=1, le=10000,
        description="connections open at once; one more closes the oldest waiting for a request, "
        "or itself when every one is being answered",
    )


class ApiSettings(_Section):
    """``[api]``: the agent's read-only HTTP API (``/api/v1/…``, on the ``/metrics`` server) and
    the token ``diagnose HOST`` sends to it (docs/api.md)."""

    enabled: bool = Field(default=True, description="serve /api/v1 on the exporter's listen address")
    token: Optional[SecretStr] = Field(
        default=None,
        description="bearer token: the agent requires it on every /api/v1 request when bound off loopback "
        "(and whenever it is set); diagnose sends it",
    )
    stacks: bool = Field(
        default=False, description="let `diagnose --stacks` run py-spy dump on this host's vLLM server processes (needs ptrace rights)"
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


#: The rule names that ``[rules.thresholds]``'s ``for`` and ``disabled`` may use, as the caller of
#: ``load_settings`` gives them (the catalogue is the rules', above the settings); called only when
#: the table names a rule. ``None``: every rule name is unknown.
RULE_NAMES: contextvars.ContextVar[Callable[[], Collection[str]] | None] = contextvars.ContextVar(
    "vgpumon_rule_names", default=None
)


def _check_thresholds(v: dict[str, Any]) -> dict[str, Any]:
    from vgpumon.config.thresholds import Thresholds

    Thresholds.from_mapping(v, RULE_NAMES.get())  # unknown keys, wrong types and values, unknown rule names refused here
    return v


class RulesSettings(_Section):
    """``[rules]``: the rule engine in the agent and in ``diagnose``, and where alerts go
    (docs/rules.md). ``[rules.thresholds]`` overrides thresholds, ``for`` durations per rule and
    disables rules by name."""

    enabled: bool = Field(default=True, description="evaluate the rules in the agent (--no-rules sets false)")
    webhooks: Annotated[list[str], NoDecode, BeforeValidator(split_words), AfterValidator(check_alert_urls)] = Field(
        default_factory=list, description="POST firing and resolved alerts as JSON to these URLs"
    )
    alertmanagers: Annotated[list[str], NoDecode, BeforeValidator(split_words), AfterValidator(check_alert_urls)] = Field(
        default_factory=list, description="send alerts to these Alertmanagers (base URL; API v2)"
    )
    thresholds: Annotated[dict[str, Any], AfterValidator(_check_thresholds)] = Field(
        default_factory=dict, description="threshold overrides (keys in docs/rules.md), 'for' per rule, 'disabled' rules"
    )
