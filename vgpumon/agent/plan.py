"""The shape of the agent's *plan*: the run ``vgpumon agent`` hands to the lean agent process
(``vgpumon.agent.process``) as JSON through a memory file.

Typed dicts, not dataclasses: the plan is written with ``json.dumps`` and read back with
``json.loads`` unchanged, key for key, and this module imports nothing the lean process would
not load anyway (``typing`` only).
"""

from __future__ import annotations

from typing import TypedDict


class StorePlan(TypedDict):
    """``[store]``: where rows go and the store's timeouts."""

    url: str
    busy_timeout_ms: int
    connect_timeout_s: float
    statement_timeout_s: float
    raw_retention: float
    rollup_retention: float


class AgentPlan(TypedDict):
    """``[agent]``: the sampling loop."""

    interval: float
    hostname: str
    slow_every: int | None
    host_every: int
    reprobe_every: int
    call_deadline: float | None
    flush_interval: float | None
    gpm: bool
    spool: str
    spool_max_mb: int
    buffer_max_rows: int


class VllmPlan(TypedDict):
    """``[vllm]``: which vLLM servers are scraped, and how often."""

    enabled: bool
    urls: list[str]
    interval: float
    probe_timeout: float


class ExporterPlan(TypedDict):
    """``[exporter]``: ``/metrics``."""

    listen: str
    metrics_file: str | None
    kubelet_socket: str | None
    otlp_url: str | None
    otlp_interval: float
    header_timeout: float
    keepalive_timeout: float
    max_connections: int


#: A value of ``[rules.thresholds]`` as the settings file gave it: a number, a duration string,
#: the ``for`` table of rule = duration, or the ``disabled`` list of rule names
#: (``Thresholds.from_mapping`` checks it).
ThresholdValue = float | str | list[str] | dict[str, float | str]


class RulesPlan(TypedDict):
    """``[rules]``: the rule engine and where alerts go."""

    enabled: bool
    thresholds: dict[str, ThresholdValue]
    webhooks: list[str]
    alertmanagers: list[str]


class ApiPlan(TypedDict):
    """``[api]`` and the report's window (``[diagnose] window``)."""

    enabled: bool
    token: str | None
    stacks: bool
    window: float


class RunPlan(TypedDict):
    """The run's own flags: replay, pace, duration, sysfs root, the replay's shift in time."""

    replay: str | None
    shift_s: float
    recorded_pace: bool
    #: a recorded-pace replay on the capture's clock (``--replay-clock capture``), not the wall's
    capture_clock: bool
    duration: float | None
    sysfs: str | None


class Plan(TypedDict):
    """The whole run, every value checked by ``vgpumon.config`` (``make_plan``)."""

    version: int
    log_level: str
    store: StorePlan
    agent: AgentPlan
    vllm: VllmPlan
    exporter: ExporterPlan
    rules: RulesPlan
    api: ApiPlan
    run: RunPlan
