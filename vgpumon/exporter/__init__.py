"""The agent as a Prometheus exporter: ``/metrics`` over the newest snapshot (no NVML call at
scrape time), ``/healthz``, the metric selection file, and the hook the rules engine feeds.

Modules: ``collector`` (``MetricsExporter``: what a scrape serves), ``text`` (label sets and the
text format), ``server`` (aiohttp: ``MetricsServer``, and ``serving``, which ``vgpumon agent``
wraps around ``Agent.run``), ``selection`` (the metric selection file), ``feed`` (``RulesFeed``,
what the rules engine hands over), ``config`` (``ExporterConfig``). This package's top level
imports only the settings, so the command line can read its defaults cheaply. Label policy,
default port and the rules hook: docs/exporter.md.
"""

from __future__ import annotations

from vgpumon.exporter.config import DEFAULT_LISTEN, DEFAULT_PORT, ExporterConfig, ListenError, parse_listen

__all__ = ["DEFAULT_LISTEN", "DEFAULT_PORT", "ExporterConfig", "ListenError", "parse_listen"]
