"""The agent as a Prometheus exporter: ``/metrics`` over the newest snapshot (no NVML call at
scrape time), ``/healthz``, the metric selection file, and the hook the rules engine feeds.

Modules: ``collector`` (``MetricsExporter``: what a scrape serves), ``text`` (label sets and the
text format), ``server`` (aiohttp: ``MetricsServer``, and ``serving``, which ``vgpumon agent``
wraps around ``Agent.run``), ``selection`` (the metric selection file), ``vgpumon.alerts.feed`` (``RulesFeed``,
what the rules engine hands over), ``view`` (what it reads of the agent). ``ExporterConfig`` and the
listen address are ``vgpumon.base.listen``; this package's top level imports only those, so the command line can read its defaults cheaply. Label policy,
default port and the rules hook: docs/exporter.md.
"""

from __future__ import annotations

from vgpumon.base.listen import DEFAULT_LISTEN, DEFAULT_PORT, ExporterConfig, ListenError, parse_listen

__all__ = ["DEFAULT_LISTEN", "DEFAULT_PORT", "ExporterConfig", "ListenError", "parse_listen"]
