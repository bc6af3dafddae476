"""Rules: one catalogue (``vgpumon.rules.catalogue.RULES``), evaluated natively by the engine
(``vgpumon.rules.engine.Engine``: the agent through ``vgpumon.alerts.runner.RuleRunner``, and
``diagnose``) and by Prometheus as generated twins (``vgpumon rules build`` → ``rules/*.rules.yml``).
Thresholds: ``vgpumon.rules.thresholds.Thresholds``. Design and figures: docs/rules.md.

Nothing is imported here, so that ``vgpumon.rules.thresholds`` stays cheap to import for a
settings loader.
"""
