"""Alert lifecycle: pending → firing (after the rule's ``for``) → resolved (after ``keep_firing_for``
without the condition), one open alert per rule and subject (deduplicated by fingerprint).

* A finding that fires opens a **pending** alert; it goes **firing** once the condition has held
  for the rule's ``for`` (at once when ``for`` is 0). Sinks hear of firing and resolved alerts,
  never of pending ones.
* A pending alert whose condition stops is dropped (it never fired), as Prometheus does.
* A firing alert resolves only after its condition has not held for ``keep_firing_for``
  (hysteresis in time); rules also clear at a lower threshold than they fire at while their
  alert is active (hysteresis in value, ``HostView.is_active``). Either way an alert at its
  threshold does not flap.
* A firing alert whose inputs became **unknown** (the GPU stopped reporting, say) is held as it
  is for ``unknown_grace_seconds`` — absent data is not health — and then resolves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Mapping

from vgpumon.model import Alert, fingerprint

if TYPE_CHECKING:
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.rules.core import Finding, Rule


@dataclass
class Changes:
    """What one update changed.

    Attributes:
        saved: alerts created or changed (to store).
        dropped: pending alerts whose condition stopped before they fired (to delete).
        notify: alerts that went firing or resolved (to send to the sinks), as they were at that
            transition: one update may walk an alert through both.
    """

    saved: list[Alert] = field(default_factory=list)
    dropped: list[Alert] = field(default_factory=list)
    notify: list[Alert] = field(default_factory=list)


class AlertBook:
    """The open alerts of one host and their transitions.

    Args:
        rules: rule name → rule.
        thresholds: for per-rule ``for`` overrides and the runbook base URL.
        unknown_grace_seconds: how long a firing alert whose inputs are unknown is held.
    """

    def __init__(self, rules: Mapping[str, "Rule"], thresholds: "Thresholds", unknown_grace_seconds: float = 900.0) -> None:
        self.rules = rules
        self.thresholds = thresholds
        self.unknown_grace_seconds = unknown_grace_seconds
        self._open: dict[str, Alert] = {}

    def restore(self, alerts: Iterable[Alert]) -> None:
        """Take over open alerts stored by an earlier run (an agent restart keeps ``for`` clocks
        and firing alerts; nothing is notified twice)."""
        for a in alerts:
            rule = self.rules.get(a.name)
            if rule is not None and a.state in ("pending", "firing"):
                a.runbook_url = rule.runbook_url(self.thresholds.runbook_base_url)
                self._open[a.fingerprint] = a

    def active(self) -> frozenset[str]:
        """Fingerprints of the pending and firing alerts."""
        return frozenset(self._open)

    def open(self) -> list[Alert]:
        """Pending and firing alerts, by rule order then labels."""
        order = {name: i for i, name in enumerate(self.rules)}
        return sorted(self._open.values(), key=lambda a: (order.get(a.name, 1 << 30), sorted(a.labels.items())))

    def update(self, findings: Iterable["Finding"], evaluated: Iterable["Rule"], at: float) -> Changes:
        """Apply one evaluation of ``evaluated`` rules at time ``at``.

        Args:
            findings: the findings of that evaluation.
            evaluated: the rules evaluated (an open alert of another rule is left alone).
            at: evaluation time (epoch seconds).
        """
        th = self.thresholds
        names = {r.name for r in evaluated}
        ch = Changes()
        seen: dict[str, "Finding"] = {}
        for f in findings:
            if f.rule in names:
                seen[fingerprint(f.rule, f.labels)] = f
        for fp, f in seen.items():
            if f.state != "firing":
                continue
            rule = self.rules[f.rule]
            a = self._open.get(fp)
            if a is None:
                a = Alert(name=rule.name, severity=rule.severity, labels=dict(f.labels), state="pending", active_since=at,
                          last_eval=at, summary=rule.summary, runbook_url=rule.runbook_url(th.runbook_base_url))
                self._open[fp] = a
            a.last_eval, a.value, a.description, a.ok_since = at, f.value, rule.describe(f), None
            if a.state == "pending" and at - a.active_since >= rule.for_(th):
                a.state, a.fired_at = "firing", at
                ch.notify.append(_snapshot(a))
            ch.saved.append(a)
        for fp, a in list(self._open.items()):
            if a.name not in names:
                continue
            found = seen.get(fp)
            if found is not None and found.state == "firing":
                continue
            if a.state == "pending":
                del self._open[fp]
                ch.dropped.append(a)
                continue
            if found is not None and found.state == "unknown" and at - a.last_eval < self.unknown_grace_seconds:
                continue  # absent inputs are not health: hold the alert for a while
            a.ok_since = at if a.ok_since is None else a.ok_since
            if at - a.ok_since >= self.rules[a.name].keep_firing_seconds:
                a.state, a.resolved_at = "resolved", at
                del self._open[fp]
                ch.notify.append(_snapshot(a))
            ch.saved.append(a)
        return ch


def _snapshot(a: Alert) -> Alert:
    return replace(a, labels=dict(a.labels))
