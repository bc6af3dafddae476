"""Alerts as data: one episode of one rule on one subject, from pending through firing to resolved.
Produced by ``vgpumon.alerts`` (the lifecycle), stored by ``vgpumon.store.alerts``, sent by the sinks."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Mapping

#: Alert states. ``pending``: the condition holds but not yet for the rule's ``for``; ``firing``:
#: it held for ``for`` (sinks are told); ``resolved``: it stopped holding (after the rule's
#: ``keep_firing_for``; sinks are told). A pending alert whose condition stops is dropped, never
#: notified, as Prometheus does.
STATES = ("pending", "firing", "resolved")


def fingerprint(name: str, labels: Mapping[str, str]) -> str:
    """Identity of an alert: its name and labels (not its values), so that one condition on one
    subject is one alert however often it is evaluated (deduplication)."""
    text = json.dumps([name, sorted(labels.items())], separators=(",", ":"))
    return hashlib.sha1(text.encode()).hexdigest()  # noqa: S324  a fingerprint that deduplicates alerts (Alertmanager's own use), not a secret


@dataclass
class Alert:
    """One alert episode.

    Attributes:
        name: the rule's name (``GpuMemoryLeak``), as the Prometheus twin's ``alertname``.
        severity: ``critical`` (pages), ``warning`` (tickets) or ``info``.
        labels: identity of the subject (``hostname`` and ``gpu``/``uuid``, ``server``, ``port``
            …), as the twin's series carry them; ``severity`` and ``alertname`` are not in it.
        state: one of ``STATES``.
        active_since: epoch seconds of the first evaluation that found the condition (pending).
        fired_at: when it went firing; ``None`` while pending.
        resolved_at: when it was resolved; ``None`` while active.
        last_eval: newest evaluation that saw it.
        value: the rule's figure at the newest evaluation (slope, share of the link, …); ``None``
            for conditions without one.
        summary: the rule's static summary.
        description: the rule's description filled in with the evidence of the newest evaluation.
        runbook_url: where the runbook is.
        ok_since: first evaluation since which the condition no longer held while firing (the
            hysteresis clock); ``None`` while it holds.
        id: the stored row's id, once stored.
    """

    name: str
    severity: str
    labels: dict[str, str]
    state: str
    active_since: float
    last_eval: float
    summary: str = ""
    description: str = ""
    runbook_url: str = ""
    value: float | None = None
    fired_at: float | None = None
    resolved_at: float | None = None
    ok_since: float | None = None
    id: int | None = field(default=None, compare=False)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.name, self.labels)

    def as_dict(self) -> dict[str, object]:
        """JSON-able form (what the webhook sink sends and ``diagnose --json`` shows)."""
        return {
            "name": self.name,
            "severity": self.severity,
            "state": self.state,
            "labels": dict(self.labels),
            "summary": self.summary,
            "description": self.description,
            "runbook_url": self.runbook_url,
            "value": self.value,
            "active_since": self.active_since,
            "fired_at": self.fired_at,
            "resolved_at": self.resolved_at,
            "fingerprint": self.fingerprint,
        }
