"""What the rules engine hands the exporter: the alerts it holds, the rules that cannot judge and
its memory-leak slopes.

The exporter does not evaluate rules. An engine that implements ``RulesFeed`` is passed to
``MetricsExporter(rules=...)`` (``vgpumon agent`` does it when an engine is wired); the exporter
calls its methods once per scrape, on the event loop, so they must return what the engine
already holds — no store query, no evaluation. Without a feed, ``vgpumon_alerts``,
``vgpumon_rule_unknown`` and ``vgpumon_gpu_memory_used_slope_bytes_per_second`` have no series.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol

#: Alert labels that pass to ``vgpumon_alerts`` besides alertname, severity and state: the
#: identity of what the alert is about. Anything else an alert carries (values, thresholds,
#: descriptions) stays out: a label whose value changes starts a new series (docs/exporter.md).
ALERT_SUBJECT_LABELS = ("gpu", "uuid", "server", "model_name", "port", "source", "rule")
#: Subject labels that pass to ``vgpumon_rule_unknown`` besides hostname, rule, severity and
#: reason: a process-level subject (``pid``) folds into its GPU's series.
UNKNOWN_SUBJECT_LABELS = ("gpu", "uuid", "server", "port", "source")
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


@dataclass(frozen=True)
class UnknownSample:
    """One rule that cannot judge one subject, as the exporter serves it.

    Attributes:
        rule: the rule's name (``GpuStuck``).
        severity: the rule's severity.
        reason: a bounded code (``vgpumon.rules.core.UNKNOWN_CODES``: ``not_supported``,
            ``not_reported``, ``no_data``, ``warming_up``, ``rule_failed``, ``other``).
        labels: the subject; only ``UNKNOWN_SUBJECT_LABELS`` are served.
    """

    rule: str
    severity: str
    reason: str
    labels: Mapping[str, str] = field(default_factory=dict)


class RulesFeed(Protocol):
    """The rules engine as the exporter reads it (issue 11 implements it)."""

    def alerts(self) -> Iterable[AlertSample]:
        """Alerts pending or firing now (resolved ones are left out)."""
        ...

    def unknown(self) -> Iterable[UnknownSample]:
        """Rules that cannot judge a subject as of their newest evaluation."""
        ...

    def memory_slopes(self) -> Mapping[str, float]:
        """GPU UUID → robust slope of its memory used, bytes per second (positive: growing);
        GPUs without an estimate are left out."""
        ...
