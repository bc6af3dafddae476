"""Where alerts go: a log line, a JSON webhook, Alertmanager's API v2 (``POST /api/v2/alerts``).

The ``Dispatcher`` gives each sink its own queue and task on the agent's event loop: the rule
engine hands it the alerts that went firing or resolved (``submit`` never blocks, never waits on
the network); a sink that fails is retried with back-off (1 s, 2 s, 4 s … 60 s) while the others
go on, and the oldest notifications are dropped, counted and logged once if a queue reaches its
bound. Nothing a sink does can delay a tick or an evaluation.

Alertmanager forgets an alert that is not sent again before its ``endsAt``: firing alerts are
re-sent every ``resend_every`` seconds with ``endsAt`` four resends ahead, as Prometheus does; a
resolved alert is sent with ``endsAt`` at its resolution.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import TypedDict

import aiohttp

from vgpumon.model import Alert

log = logging.getLogger(__name__)


class WebhookBody(TypedDict):
    """What ``WebhookSink`` POSTs (the shape of Alertmanager's own webhook)."""

    version: str
    receiver: str
    status: str
    alerts: list[dict[str, object]]  # each ``{"status": …, **Alert.as_dict()}``


class AlertmanagerAlert(TypedDict):
    """One alert of Alertmanager's API v2 (``POST /api/v2/alerts``)."""

    labels: dict[str, str]
    annotations: dict[str, str]
    startsAt: str  # Alertmanager's key names
    endsAt: str


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class SinkError(Exception):
    """A sink could not deliver (refused, timed out, non-2xx answer)."""


class Sink:
    """A destination. ``send`` delivers a batch or raises ``SinkError``; ``pending`` is what a
    sink wants re-sent on its own (Alertmanager's keep-alive of firing alerts)."""

    name = "sink"
    #: seconds between two looks at ``resend`` while nothing new is queued; ``None``: the sink
    #: re-sends nothing on its own, and its task sleeps until a notification arrives
    resend_check: float | None = None

    async def send(self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float) -> None:
        raise NotImplementedError

    def resend(self, now: float) -> list[Alert]:
        return []


class LogSink(Sink):
    """One log line per firing or resolved alert: ``vgpumon.alerts`` logger at the alert's level
    (ERROR critical, WARNING warning, INFO info), so that a resolution shows where its alert did."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.log = logger or logging.getLogger("vgpumon.alerts")

    async def send(self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float) -> None:
        for a in alerts:
            level = {"critical": logging.ERROR, "warning": logging.WARNING}.get(a.severity, logging.INFO)
            labels = " ".join(f"{k}={v}" for k, v in a.labels.items())
            self.log.log(level, "%s %s [%s] %s: %s (%s)", a.state.upper(), a.name, a.severity, labels, a.description, a.runbook_url)


class _HttpSink(Sink):
    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url
        self.timeout = timeout

    async def _post(self, session: aiohttp.ClientSession, url: str, body: WebhookBody | list[AlertmanagerAlert]) -> None:
        try:
            # no redirects: an alert (and a URL's credentials) goes to the receiver named only
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=self.timeout),
                                    allow_redirects=False) as resp:
                if 300 <= resp.status < 400:
                    raise SinkError(f"{url} answered {resp.status}, a redirect: not followed")
                if resp.status >= 300:
                    raise SinkError(f"{url} answered {resp.status}")
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            raise SinkError(f"{url}: {exc.__class__.__name__}: {exc}") from None


class WebhookSink(_HttpSink):
    """POSTs ``{"version": "1", "receiver": "vgpumon", "status": …, "alerts": [Alert.as_dict() …]}``
    to a URL (the shape of Alertmanager's own webhook, so existing receivers read it)."""

    name = "webhook"

    async def send(self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float) -> None:
        status = "firing" if any(a.state == "firing" for a in alerts) else "resolved"
        body: WebhookBody = {"version": "1", "receiver": "vgpumon", "status": status,
                             "alerts": [{"status": a.state, **a.as_dict()} for a in alerts]}
        await self._post(session, self.url, body)


class AlertmanagerSink(_HttpSink):
    """Alertmanager API v2: ``POST <url>/api/v2/alerts`` with ``labels`` (``alertname``,
    ``severity`` and the subject's labels), ``annotations`` (summary, description, runbook_url),
    ``startsAt`` and ``endsAt``.

    Args:
        url: Alertmanager's base URL (``http://alertmanager:9093``).
        resend_every: seconds between re-sends of a firing alert.
    """

    name = "alertmanager"

    def __init__(self, url: str, timeout: float = 5.0, resend_every: float = 60.0) -> None:
        super().__init__(url.rstrip("/") + "/api/v2/alerts", timeout)
        self.resend_every = resend_every
        self._firing: dict[str, Alert] = {}
        self._last_send = 0.0

    def body(self, alerts: Sequence[Alert], now: float) -> list[AlertmanagerAlert]:
        out: list[AlertmanagerAlert] = []
        for a in alerts:
            ends = a.resolved_at if a.state == "resolved" and a.resolved_at else now + 4 * self.resend_every
            out.append({
                "labels": {"alertname": a.name, "severity": a.severity, **a.labels},
                "annotations": {"summary": a.summary, "description": a.description, "runbook_url": a.runbook_url},
                "startsAt": _iso(a.fired_at or a.active_since),
                "endsAt": _iso(ends),
            })
        return out

    async def send(self, session: aiohttp.ClientSession, alerts: Sequence[Alert], now: float) -> None:
        await self._post(session, self.url, self.body(alerts, now))
        self._last_send = now
        for a in alerts:
            if a.state == "firing":
                self._firing[a.fingerprint] = a
            else:
                self._firing.pop(a.fingerprint, None)

    @property
    def resend_check(self) -> float | None:  # type: ignore[override]
        return min(5.0, self.resend_every)

    def resend(self, now: float) -> list[Alert]:
        if self._firing and now - self._last_send >= self.resend_every:
            return list(self._firing.values())
        return []


class Dispatcher:
    """Delivers notifications to every sink, each on its own task, with retries.

    Args:
        sinks: where alerts go.
        queue_max: notifications held per sink; beyond it the oldest are dropped (counted).
        retry_max: longest wait between retries of a failing sink, seconds.
        clock: epoch seconds (``time.time``).
        sleep: ``asyncio.sleep`` (tests may pass a faster one).
    """

    def __init__(self, sinks: Sequence[Sink], *, queue_max: int = 1000, retry_max: float = 60.0,
                 clock: Callable[[], float] = time.time, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.sinks = list(sinks)
        seen: dict[str, int] = {}
        for s in self.sinks:  # two webhooks are "webhook" and "webhook-2" in logs and counters
            seen[s.name] = seen.get(s.name, 0) + 1
            if seen[s.name] > 1:
                s.name = f"{s.name}-{seen[s.name]}"
        self.queue_max = queue_max
        self.retry_max = retry_max
        self.clock = clock
        self.sleep = sleep
        self.dropped = {s.name: 0 for s in self.sinks}
        self.failures = {s.name: 0 for s in self.sinks}
        self.sent = {s.name: 0 for s in self.sinks}
        self._queues: dict[str, deque[Alert]] = {s.name: deque() for s in self.sinks}
        self._wake: dict[str, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    def submit(self, alerts: Sequence[Alert]) -> None:
        """Queue notifications for every sink (snapshots: later changes to an alert do not leak
        into a queued one). Never blocks; call on the event loop."""
        if not alerts:
            return
        for s in self.sinks:
            q = self._queues[s.name]
            for a in alerts:
                q.append(replace(a, labels=dict(a.labels)))
            over = len(q) - self.queue_max
            if over > 0:
                for _ in range(over):
                    q.popleft()
                if self.dropped[s.name] == 0:
                    log.error("alert sink %s is behind: dropping its oldest notifications", s.name)
                self.dropped[s.name] += over
            if s.name in self._wake:
                self._wake[s.name].set()

    async def start(self) -> None:
        """Start one task per sink on the running loop."""
        self._session = aiohttp.ClientSession()
        for s in self.sinks:
            self._wake[s.name] = asyncio.Event()
            self._tasks.append(asyncio.get_running_loop().create_task(self._worker(s)))

    async def _worker(self, sink: Sink) -> None:
        q, wake = self._queues[sink.name], self._wake[sink.name]
        backoff = 0.0
        while True:
            if not q:
                wake.clear()
                if sink.resend_check is None:  # nothing to re-send: no timer, no wake-ups
                    await wake.wait()
                else:
                    try:
                        await asyncio.wait_for(wake.wait(), timeout=sink.resend_check)
                    except asyncio.TimeoutError:
                        pass
            batch = list(q) or sink.resend(self.clock())
            if not batch:
                continue
            try:
                assert self._session is not None
                await sink.send(self._session, batch, self.clock())
            except SinkError as exc:
                self.failures[sink.name] += 1
                backoff = min(self.retry_max, backoff * 2 if backoff else 1.0)
                if self.failures[sink.name] == 1 or backoff == self.retry_max:
                    log.warning("alert sink %s failed (%s); retrying in %.0f s", sink.name, exc, backoff)
                await self.sleep(backoff)
                continue
            backoff = 0.0
            self.sent[sink.name] += len(batch)
            for _ in range(min(len(batch), len(q))):
                q.popleft()

    async def close(self, timeout: float = 5.0) -> None:
        """Give the queues up to ``timeout`` seconds to empty, then stop the tasks."""
        deadline = time.monotonic() + timeout
        while any(self._queues.values()) and time.monotonic() < deadline and self._tasks:
            await asyncio.sleep(0.05)
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except asyncio.CancelledError:
                pass
        self._tasks.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None
        left = sum(len(q) for q in self._queues.values())
        if left:
            log.error("%d alert notifications could not be delivered before exit", left)
