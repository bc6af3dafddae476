"""The rule engine: evaluates the rule catalogue over a host's stored data at a given time.

The agent calls ``Engine.evaluate`` on a schedule (``vgpumon.alerts.runner``) and keeps the alerts'
lifecycle (``vgpumon.alerts.AlertBook``); ``diagnose`` calls ``Engine.evaluate_window``, which
evaluates the same rules at the end of its window — and, for rules with a ``for``, at five earlier
times across it — through the same lifecycle, so a report says pending or firing as the agent
would have.
"""

from __future__ import annotations

import logging
from typing import Iterable, MutableMapping, Sequence

from vgpumon.base.errors import StoreUnavailableError
from vgpumon.config.thresholds import Thresholds
from vgpumon.rules.catalogue import RULES
from vgpumon.rules.core import SUBJECT_LABELS, Finding, Rule
from vgpumon.rules.lifecycle import AlertBook
from vgpumon.rules.source import CANNOT_JUDGE, cannot_judge
from vgpumon.rules.view import HostView, Prefetch
from vgpumon.store import Store

log = logging.getLogger(__name__)

#: Evaluations across ``for`` that ``evaluate_window`` makes before the end of the window.
FOR_STEPS = 5


class Engine:
    """Evaluates rules over a host's stored data.

    Args:
        thresholds: what the rules compare with (defaults: ``Thresholds()``).
        rules: the rules (default: the catalogue); ``thresholds.disabled`` are left out.
    """

    def __init__(self, thresholds: Thresholds | None = None, rules: Sequence[Rule] = RULES) -> None:
        self.thresholds = thresholds or Thresholds()
        self.rules = tuple(r for r in rules if r.name not in self.thresholds.disabled)
        self.by_name = {r.name: r for r in self.rules}

    def evaluate(self, view: HostView, rules: Iterable[Rule] | None = None,
                 newest: MutableMapping[str, list[Finding]] | None = None) -> list[Finding]:
        """Run the checks of ``rules`` (default: all) at ``view.at``.

        A check that raises costs only itself: its rule says unknown on the host, with the error.
        ``VgpumonRuleCannotJudge`` reads no data: it is judged from ``newest`` (rule name → its
        findings at its newest evaluation; updated here with this evaluation's), so rules
        evaluated at other cadences count with their newest findings.

        Raises:
            StoreUnavailableError: the store cannot be read (nothing can be said).
        """
        out: list[Finding] = []
        todo = list(self.rules if rules is None else rules)
        for rule in todo:
            try:
                out.extend(rule.check(view, self.thresholds, rule))
            except StoreUnavailableError:
                raise
            except Exception as exc:  # noqa: BLE001 - one broken rule must not silence the others
                log.exception("rule %s failed", rule.name)
                labels = {k: "" for k in SUBJECT_LABELS[rule.subject]} | {"hostname": view.hostname}
                out.append(Finding(rule.name, labels, "unknown", reason=f"rule failed: {exc.__class__.__name__}: {exc}"))
        newest = {} if newest is None else newest
        for rule in todo:
            newest[rule.name] = [f for f in out if f.rule == rule.name]
        meta = self.by_name.get(CANNOT_JUDGE)
        if meta is not None and meta in todo:
            out.extend(cannot_judge(meta, view.hostname, newest, self.by_name))
        return out

    def evaluate_window(self, store: Store, hostname: str, end: float) -> tuple[list[Finding], AlertBook]:
        """Evaluate every rule at ``end`` as the agent would have: rules with a ``for`` are also
        evaluated at ``FOR_STEPS`` times spread over the ``for`` before ``end``, through one
        lifecycle, so that their alerts are pending or firing as they would be in the agent.

        Returns:
            The findings at ``end`` and the lifecycle (``book.open()``: the pending and firing
            alerts at ``end``).
        """
        th = self.thresholds
        times: dict[float, list[Rule]] = {}
        for rule in self.rules:
            f = rule.for_(th)
            steps = [end - f * k / FOR_STEPS for k in range(FOR_STEPS, 0, -1)] if f > 0 else []
            for t in (*steps, end):
                times.setdefault(t, []).append(rule)
        book = AlertBook(self.by_name, th)
        findings: list[Finding] = []
        prefetch = Prefetch(store, min(times), max(times))
        newest: dict[str, list[Finding]] = {}
        for t in sorted(times):
            view = HostView(store, hostname, t, active=book.active(), prefetch=prefetch)
            findings = self.evaluate(view, times[t], newest)
            book.update(findings, times[t], t)
        return findings, book
