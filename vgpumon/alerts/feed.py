"""What the rules engine hands the exporter: the alerts it holds and its memory-leak slopes.

The exporter does not evaluate rules. An engine that implements ``RulesFeed`` is passed to
``MetricsExporter(rules=...)`` (``vgpumon agent`` does it when an engine is wired); the exporter
calls both methods once per scrape, on the event loop, so they must return what the engine
already holds — no store query, no evaluation. Without a feed, ``vgpumon_alerts`` and
``vgpumon_gpu_memory_used_slope_bytes_per_second`` have no series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

#: Alert labels that pass to ``vgpumon_alerts`` besides alertname, severity and state: the
#: identity of what the alert is about. Anything else an alert carries (values, thresholds,
#: descriptions) stays out: a label whose value changes starts a new series (docs/exporter.md).
ALERT_SUBJECT_LABELS = ("gpu", "uuid", "server", "model_name", "port")
#: The states an alert is served in; a resolved alert has no series.
ALERT_STATES = ("pending", "firing")


@dataclass(frozen=True)
class AlertSample:
    """One alert as the exporter serves it.

    Attributes:
        alertname: CamelCase rule name (``GpuMemoryLeak``), the same as the Prometheus twin's.
        severity: ``critical``, ``warning`` or ``info``.
        state: ``pending`` or ``firing``.
        labels: what the alert is about; only ``ALERT_SUBJECT_LABELS`` are served.
    """

    alertname: str
    severity: str
    state: str
    labels: Mapping[str, str] = field(default_factory=dict)


class RulesFeed(Protocol):
    """The rules engine as the exporter reads it (issue 11 implements it)."""

    def alerts(self) -> Iterable[AlertSample]:
        """Alerts pending or firing now (resolved ones are left out)."""
        ...

    def memory_slopes(self) -> Mapping[str, float]:
        """GPU UUID → robust slope of its memory used, bytes per second (positive: growing);
        GPUs without an estimate are left out."""
        ...
