"""Alerts in the agent: the runner that evaluates the rule catalogue on its own thread, stores each
alert's lifecycle (``vgpumon.rules.lifecycle``: pending → firing → resolved) and tells the sinks
(log line, JSON webhook, Alertmanager API v2); ``feed`` is what ``/metrics`` shows of it."""
