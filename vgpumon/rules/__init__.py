"""Rules: one catalogue (``vgpumon.rules.catalogue.RULES``), evaluated natively by the engine
(``vgpumon.rules.engine.Engine``: the agent through ``vgpumon.alerts.runner.RuleRunner``, and
``diagnose``) and by Prometheus as generated twins (``vgpumon rules build`` → ``rules/*.rules.yml``).
Thresholds: ``vgpumon.config.thresholds.Thresholds`` (below the rules, where the settings check
reads them too). Design and figures: docs/rules.md.

Nothing is imported here, so that one module of the package is imported without the others.
"""

from __future__ import annotations


def rule_names() -> frozenset[str]:
    """The catalogue's rule names (``vgpumon.rules.catalogue.rule_names``), importing the catalogue
    only when called: it imports every rule and, through their views, the store. What the command
    line gives ``load_settings`` to check ``[rules.thresholds]``'s ``for`` and ``disabled``."""
    from vgpumon.rules.catalogue import rule_names

    return rule_names()
