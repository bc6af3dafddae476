"""Rules in the agent: evaluated on a schedule, off the sampling path.

The agent pokes the runner with each tick's time (``poke``: never blocks). When ``interval``
seconds of data time have passed and no evaluation is running, one evaluation cycle starts as a
task: the engine reads the store and runs the alert lifecycle on the runner's own thread, the
alerts it changed are written through the agent's store thread (the one writer), and the
notifications go to the sinks' dispatcher, whose tasks retry failing sinks without holding
anything up. A slow store or a slow rule delays only the next evaluation, never a tick.

A cycle evaluates at each ``interval`` of data time since the previous one, up to the newest
stored tick (at most ``max_catch_up`` times), so a fast replay or a store that comes back after
an outage still walks through time and ``for`` clocks mean what they say. Each rule is evaluated
only every ``Rule.every_seconds``. Open alerts are restored from the store at start: a restart
keeps pending clocks and does not notify firing alerts again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Callable, Sequence

from vgpumon.alerts.sinks import Dispatcher, LogSink, Sink
from vgpumon.alerts.windows import RuleWindows
from vgpumon.base.errors import StoreUnavailableError
from vgpumon.base.workers import DaemonExecutor
from vgpumon.rules.engine import Engine
from vgpumon.rules.lifecycle import AlertBook, Changes
from vgpumon.rules.view import CarriedValues, HostView, StoreReads
from vgpumon.store import Store
from vgpumon.store.alerts import AlertRepository

if TYPE_CHECKING:
    from vgpumon.store.codec import GpuRow

if TYPE_CHECKING:
    from vgpumon.alerts.feed import AlertSample, UnknownSample
    from vgpumon.rules.core import Finding

log = logging.getLogger(__name__)


class RuleRunner:
    """Evaluates the rule catalogue for one agent.

    Args:
        engine: the rules and thresholds (default ``Engine()``).
        sinks: where firing and resolved alerts go (default: a log line).
        interval: seconds of data time between evaluation cycles; default: the shortest
            ``Rule.every_seconds`` of the engine's rules (a cycle more often than any rule is due
            only reads the store for nothing).
        wall: "now" for the silence rule; ``None`` uses each evaluation's own time (replays).
        max_catch_up: most evaluation times one cycle walks through.
        in_memory: the rules read the agent's own GPUs' windows from memory, fed with each batch
            the agent stores (``stored``; ``vgpumon.alerts.windows``), not from the store; false: every read from
            the store (``bench/rules_cycle.py``'s "before", and stores written by someone else).
    """

    def __init__(
        self,
        engine: Engine | None = None,
        *,
        sinks: Sequence[Sink] | None = None,
        interval: float | None = None,
        wall: Callable[[], float] | None = time.time,
        max_catch_up: int = 720,
        in_memory: bool = True,
    ) -> None:
        self.engine = engine or Engine()
        self.dispatcher = Dispatcher(list(sinks) if sinks is not None else [LogSink()])
        self.interval = interval if interval is not None else min((r.every_seconds for r in self.engine.rules), default=15.0)
        self.wall = wall
        self.max_catch_up = max_catch_up
        self.book = AlertBook(self.engine.by_name, self.engine.thresholds)
        self.evaluations = 0
        self._store: Store | None = None
        self._hostname = ""
        self._repo: AlertRepository | None = None
        self._write_exec: Executor | None = None
        self._slopes: dict[str, float] = {}
        self._published: list[AlertSample] = []
        self._published_alerts: list[dict[str, object]] = []
        self._published_unknown: list[UnknownSample] = []
        #: rule name → its findings at its newest evaluation (rules run at their own cadences)
        self._newest: dict[str, list[Finding]] = {}
        #: data time of the newest evaluation (``None`` before the first)
        self.evaluated_at: float | None = None
        # a daemon thread: a read stuck on a silent store must not keep the process from exiting
        # (the agent watches ``executor.running_since`` and cuts such a store's connections)
        self._exec = DaemonExecutor("vgpumon-rules")
        self._task: asyncio.Task[None] | None = None
        self._last_poke: float | None = None
        self._last_at: float | None = None
        self._last_rule: dict[str, float] = {}
        self._carry = CarriedValues()
        self._skipped = 0  # cycles in a row the store could not serve
        self.in_memory = in_memory
        #: the windows in memory (``start`` makes them when ``in_memory``)
        self.windows: RuleWindows | None = None

    async def start(self, store: Store, hostname: str, write_executor: Executor) -> None:
        """Attach to the agent's store (writes go through ``write_executor``), restore the host's
        open alerts and start the sinks."""
        self._store, self._hostname, self._write_exec = store, hostname, write_executor
        self._repo = AlertRepository(store.engine)
        if self.in_memory:
            self.windows = RuleWindows(store, hostname)
        loop = asyncio.get_running_loop()
        try:
            self.book.restore(await loop.run_in_executor(self._exec, self._repo.open_alerts, hostname))
        except StoreUnavailableError as exc:
            log.warning("open alerts not restored: %s", exc)
        await self.dispatcher.start()

    def stored(self, rows: Sequence[GpuRow], whole: bool = True) -> None:
        """A batch of ticks is stored (on the store thread, after the write): its GPU rows go
        into the windows in memory, so they hold what the store holds, no tick ahead of the
        events, XIDs and vLLM polls a view reads from the store. ``whole`` false: rows came back
        from the spool besides (an outage ended): the windows restore from the store instead."""
        windows = self.windows
        if windows is None:
            return
        if whole:
            windows.feed(rows)
        else:
            windows.forget()

    def poke(self, data_ts: float) -> None:
        """A tick at ``data_ts`` was taken: start a cycle if one is due and none is running."""
        if self._store is None or (self._task is not None and not self._task.done()):
            return
        if self._last_poke is not None and data_ts - self._last_poke < self.interval:
            return
        if self._last_poke is None:
            self._last_at = data_ts - self.interval  # the first cycle walks from the first tick on
        self._last_poke = data_ts
        self._task = asyncio.get_running_loop().create_task(self._cycle())

    def due(self, data_ts: float) -> bool:
        """Whether ``poke(data_ts)`` would start a cycle now. Only reads, so the agent's sampling
        thread asks it each tick and wakes the event loop for ``poke`` only when it says yes."""
        task = self._task
        return (
            self._store is not None and (task is None or task.done())
            and (self._last_poke is None or data_ts - self._last_poke >= self.interval)
        )

    @property
    def executor(self) -> DaemonExecutor:
        """The rules' thread (its ``running_since`` tells the agent how long a read has run)."""
        return self._exec

    async def finish(self, evaluate: bool = True) -> None:
        """At the agent's stop (every row written): a last cycle up to the newest tick (unless
        ``evaluate`` is false: the store is away), then the sinks get a few seconds to deliver."""
        if self._task is not None:
            await self._task
        if self._store is not None and evaluate:
            await self._cycle(final=True)
        await self.dispatcher.close()
        self._exec.shutdown(wait=False)  # idle by now; its thread ends on its own

    async def _cycle(self, final: bool = False) -> None:
        loop = asyncio.get_running_loop()
        try:
            changes = await loop.run_in_executor(self._exec, self._evaluate, final)
            if changes.saved or changes.dropped:
                assert self._repo is not None
                await loop.run_in_executor(self._write_exec, self._repo.save, self._hostname, changes.saved, changes.dropped)
        except StoreUnavailableError as exc:
            # one line per outage, as the agent's store line: not one every cycle (15 s)
            log.log(logging.DEBUG if self._skipped else logging.WARNING, "rules not evaluated: %s%s", exc,
                    "" if self._skipped else " (said once until they are evaluated again)")
            self._skipped += 1
            return
        except Exception:  # noqa: BLE001 - a rule bug must never take the sampling down
            log.exception("rule evaluation failed")
            return
        if self._skipped:
            log.warning("rules evaluated again after %d cycle(s) without the store", self._skipped)
            self._skipped = 0
        self.dispatcher.submit(changes.notify)

    # -- what /metrics serves of the engine (vgpumon.alerts.feed.RulesFeed) ----------------------

    def alerts(self) -> list["AlertSample"]:
        """Alerts pending or firing as of the newest cycle, as ``vgpumon_alerts`` serves them: a
        list published by the rules thread after each cycle (no evaluation, no store query; called
        on the event loop at each scrape)."""
        return self._published

    def open_alerts(self) -> list[dict[str, object]]:
        """Alerts pending or firing as of the newest cycle, whole (``Alert.as_dict``: description,
        since, runbook), as the agent's ``/api/v1/alerts`` serves them; published with
        ``alerts``, no evaluation or store query."""
        return self._published_alerts

    def unknown(self) -> list["UnknownSample"]:
        """Rules that cannot judge a subject as of their newest evaluation, as
        ``vgpumon_rule_unknown`` serves them; published with ``alerts``."""
        return self._published_unknown

    def _publish(self) -> None:
        from vgpumon.alerts.feed import AlertSample, UnknownSample
        from vgpumon.rules.core import unknown_code

        open_ = [a for a in self.book.open() if a.state in ("pending", "firing")]
        # each a new list, assigned once: read by the event loop's thread
        self._published = [AlertSample(alertname=a.name, severity=a.severity, state=a.state, labels=dict(a.labels)) for a in open_]
        self._published_alerts = [a.as_dict() for a in open_]
        by_name = self.engine.by_name
        self._published_unknown = [
            UnknownSample(rule=f.rule, severity=by_name[f.rule].severity, reason=unknown_code(f.reason), labels=dict(f.labels))
            for name, found in self._newest.items() if name in by_name for f in found if f.state == "unknown"
        ]

    def memory_slopes(self) -> dict[str, float]:
        """GPU UUID → the memory-leak rule's newest Theil–Sen slope, bytes per second."""
        return self._slopes

    def _evaluate(self, final: bool = False) -> Changes:
        """One cycle, on the rules thread: evaluate at each due time up to the newest stored tick
        (``final``: every rule at the newest, whatever its cadence — the agent stops)."""
        assert self._store is not None
        reads: StoreReads = self._store
        if self.windows is not None:
            self.windows.prepare()  # restores from the store what the previous cycle missed
            reads = self.windows
            gpus = self.windows.gpus
        else:
            gpus = self._store.gpus_of(self._hostname)
        ids = [g.id for g in gpus]
        newest = self._store.newest_ts(ids) if self.windows is None else self.windows.newest_ts(ids)
        total = Changes()
        if newest is None:
            return total
        times = [newest]
        if self._last_at is not None:
            times = []
            t = self._last_at + self.interval
            while t < newest and len(times) < self.max_catch_up - 1:
                times.append(t)
                t += self.interval
            times.append(newest)
            if newest <= self._last_at and not final:
                return total
        carry: CarriedValues | None = self._carry if self.windows is None else None  # memory needs no carrying
        if len(times) > 2:
            # catching up (after an outage, a slow cycle, a replay): ticks folded into rollups
            # while the store was away are seen only by whole reads, made at each time
            self._carry.forget()
            carry = None
        for at in times:
            due = [r for r in self.engine.rules
                   if at - self._last_rule.get(r.name, -1e18) >= r.every_seconds or (final and at == newest)]
            if not due:
                continue
            # catch-up times are in the past: only the newest is compared with the wall clock
            wall = self.wall() if self.wall is not None and at == newest else at
            view = HostView(reads, self._hostname, at, wall=max(wall, at), active=self.book.active(), gpus=gpus,
                            carry=carry)
            findings = self.engine.evaluate(view, due, self._newest)
            slopes = {
                f.labels["uuid"]: f.value / 86400.0  # the rule's figure is bytes per day
                for f in findings
                if f.rule == "GpuMemoryLeak" and f.value is not None and "uuid" in f.labels
            }
            if slopes:
                self._slopes = {**self._slopes, **slopes}  # one assignment: read by the loop's thread
            ch = self.book.update(findings, due, at)
            for r in due:
                self._last_rule[r.name] = at
            total.saved += [a for a in ch.saved if all(a is not b for b in total.saved)]
            total.dropped += ch.dropped
            total.notify += ch.notify
            self.evaluations += 1
        self._last_at = newest
        self.evaluated_at = newest
        self._publish()
        # an alert dropped after it was saved in this cycle is never stored
        total.saved = [a for a in total.saved if a.id is not None or all(a is not d for d in total.dropped)]
        return total
