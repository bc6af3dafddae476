"""Alerts: the lifecycle of a rule's findings (pending → firing → resolved, with hysteresis and
deduplication) and the sinks that are told (log line, JSON webhook, Alertmanager API v2)."""

from vgpumon.alerts.lifecycle import AlertBook, Changes

__all__ = ["AlertBook", "Changes"]
