"""Per-server state machine (FACTS §5). Pure: it sees one ``Observation`` per poll, with the
poll's time from the injected clock, and never reads a clock or the network itself.

::

    starting ──/health 200 + model──► ready ──► busy ⇄ idle ⇄ sleeping   (telemetry_down, hung beside)
       │                        │
       └─process gone──► failed_to_start   └─/health 500/503, refused, reset, or process gone──► dead

* **starting**: the process is alive (or, for a static target, unknown) and ``/health`` has not
  answered 200 yet: the port refuses until weights are loaded, the KV cache sized and graphs
  captured; a 0.33 data-parallel supervisor answers 503 meanwhile.
* **ready**: the first poll with ``/health`` 200 *and* something served: its model listed by
  ``/v1/models`` or its ``vllm:`` metrics (the end of prewarm). A ``/health`` 200 alone is not
  ready: a router or an API process in front of an engine still loading answers it while it
  lists no model and serves no ``vllm:`` metric (the server stays starting, and says so). Also
  every healthy poll of a server without ``vllm:`` metrics (``--disable-log-stats``: limited
  telemetry). A server that answers ``/v1/models`` with 404 offers nothing to check: its
  ``/health`` 200 is taken alone.
* **busy** / **idle**: healthy; work running or waiting, or token counters advancing / nothing
  running or waiting and counters flat.
* **hung**: ``/health`` 200 (or ``/health`` timing out) while requests run or wait and the token
  counters stay flat for ``hang_after`` scrapes — a hung engine still answers 200 — unless the
  engine processes are seen using CPU (a long prefill counts no token until it ends); an engine
  process stopped (``T``) or in uninterruptible sleep (``D``) for ``hang_after`` polls, whatever
  the gauges say (they freeze with it); a generation probe unanswered by its deadline while the
  server read idle (``hang.HangWatch``).
* **sleeping**: ``vllm:engine_sleep_state`` not ``awake`` (0.12+) or ``/is_sleeping`` true.
* **telemetry_down**: ``/health`` 200 but ``/metrics`` fails (error, oversized, garbage).
* **dead**: after ready, ``/health`` 500 (0.9–0.10) or 503 (0.11+), a refused or reset
  connection, or the process gone — whatever its exit status (vLLM exits 0 after its engine dies);
  also an engine process gone from the server's process tree while the API process lives
  ("engine lost"): ``/health`` may stay 200 then (always in 0.2.x and V1 0.8.x) and, with no
  request queued, nothing else would tell an idle server from one that can no longer serve.
* **failed_to_start**: the process went away before it was ever ready.
"""

from __future__ import annotations

from dataclasses import dataclass

from vgpumon.model import ServerState

# What a failed request looks like, as the scraper reports it.
REFUSED = "refused"  # nothing listens on the port (ECONNREFUSED)
TIMEOUT = "timeout"  # no complete answer within the per-request timeout
CONNECTION = "connection"  # reset / disconnected / other transport error
TOO_LARGE = "too large"  # the body exceeded the response-size limit
#: engine CPU (cores) at or above which work queued with flat counters is a long step, not a hang
ENGINE_WORKING_CPU = 0.1


@dataclass(frozen=True, slots=True)
class Observation:
    """What one poll saw of one server.

    Attributes:
        ts: poll time (epoch seconds, injected clock).
        process_alive: the server's process still exists (same pid and start time); ``None`` for
            static targets (no process known).
        health_status: HTTP status of ``/health``; ``None`` when no answer.
        health_error: ``REFUSED``, ``TIMEOUT``, ``CONNECTION`` or ``TOO_LARGE`` when no answer.
        metrics_error: why ``/metrics`` gave no reading (HTTP status, transport error, oversized,
            unparseable); ``None`` when it did.
        has_vllm: the ``/metrics`` reading had ``vllm:`` families.
        model_listed: ``/v1/models`` listed at least one model (now or at an earlier poll);
            ``None`` when the server offers no ``/v1/models`` (404): nothing to check it by.
        work: running + waiting requests (summed over engines); ``None`` when unknown.
        tokens_advanced: prompt + generation tokens processed since the previous scrape;
            ``None`` when unknown (first scrape, no counters).
        sleeping: from ``engine_sleep_state`` or ``/is_sleeping``; ``None`` when unknown.
        server_load: ``/load`` in-flight requests (0.8.5+); ``None`` when absent.
        engine_lost: why an engine process of the server counts as lost (it was seen in the
            process tree since ``/health`` first answered 200 and is gone or a zombie now);
            ``None`` when every engine process seen is still there, or nothing is known.
        engine_stalled: why an engine process counts as stalled (stopped or in ``D`` for
            ``hang_after`` polls, ``hang.HangWatch.engine_stalled``); ``None`` otherwise.
        engine_working: the engine processes used CPU since the previous poll (at least
            ``ENGINE_WORKING_CPU`` of a core); ``None`` when not known (static targets).
        probe_hung: why the last generation probe says hung (no token by its deadline);
            ``None`` when it answered, or none ran.
    """

    ts: float
    process_alive: bool | None
    health_status: int | None
    health_error: str | None = None
    metrics_error: str | None = None
    has_vllm: bool = False
    model_listed: bool | None = False
    work: float | None = None
    tokens_advanced: float | None = None
    sleeping: bool | None = None
    server_load: float | None = None
    engine_lost: str | None = None
    engine_stalled: str | None = None
    engine_working: bool | None = None
    probe_hung: str | None = None

    @property
    def answered(self) -> bool:
        """Any HTTP answer at all (the port accepted the connection)."""
        return self.health_status is not None or self.health_error in (TIMEOUT, TOO_LARGE)


class Lifecycle:
    """State of one server process (one start). A restart is a new ``Lifecycle``.

    Args:
        first_seen: when the agent first saw this server (epoch seconds).
        process_start: the process's start time (``psutil.Process.create_time()``), ``None``
            for static targets.
        hang_after: scrapes with work queued and flat token counters before "hung".

    Attributes:
        state: current state.
        reason: why, in words (``"/health 503"``, ``"connection refused"``...).
        first_connect_ts: first poll whose connection was accepted (any HTTP answer).
        ready_ts: first poll with ``/health`` 200 and a model listed or ``vllm:`` metrics.
        stale: gauges unchanged and counters flat for ``hang_after`` scrapes (an idle engine
            keeps its last gauge values).
    """

    def __init__(self, *, first_seen: float, process_start: float | None = None, hang_after: int = 3) -> None:
        self.first_seen = first_seen
        self.process_start = process_start
        self.hang_after = hang_after
        self.state = ServerState.STARTING
        self.reason = "not answering yet"
        self.first_connect_ts: float | None = None
        self.ready_ts: float | None = None
        self.stale = False
        self._flat = 0
        self._load_tracking = False
        self._seen_before_ready = False  # observed while not ready: the start was watched

    @property
    def start_ts(self) -> float:
        """Start of the prewarm window: the process start, else when first seen."""
        return self.process_start if self.process_start is not None else self.first_seen

    @property
    def prewarm_seconds(self) -> float | None:
        """Process start (else first seen) → ready (``ready_ts``); ``None`` until ready, and
        when the agent never saw the server before it was ready (start not observed)."""
        if self.ready_ts is None or not self._seen_before_ready:
            return None
        return self.ready_ts - self.start_ts

    @property
    def flat_scrapes(self) -> int:
        """Consecutive scrapes whose token counters did not move."""
        return self._flat

    def note_frozen(self, unchanged: bool) -> None:
        """Tell the machine whether this scrape's gauges equal the previous scrape's."""
        self.stale = unchanged and self._flat >= self.hang_after

    def step(self, obs: Observation) -> ServerState:
        """Advance with one poll's observation; returns the new state."""
        if self.state.terminal:
            # stays dead; the reason follows what is seen (503 → refused → process gone)
            if obs.process_alive is False:
                self.reason = "process gone"
            elif obs.health_error == REFUSED:
                self.reason = "connection refused"
            return self.state
        if obs.answered and self.first_connect_ts is None:
            self.first_connect_ts = obs.ts
        if obs.process_alive is False:
            ready = self.ready_ts is not None
            return self._set(ServerState.DEAD if ready else ServerState.FAILED_TO_START, "process gone")
        if self.ready_ts is None:
            if obs.health_status == 200 and (obs.model_listed is not False or obs.has_vllm):
                self.ready_ts = obs.ts
                if obs.metrics_error is not None:  # ready, and its telemetry already broken: say the latter
                    return self._set(ServerState.TELEMETRY_DOWN, f"first /health 200; /metrics: {obs.metrics_error}")
                return self._set(ServerState.READY, "first /health 200")
            self._seen_before_ready = True
            if obs.health_status == 200:
                return self._set(ServerState.STARTING, "/health 200, but no model listed by /v1/models and no vllm: metrics yet")
            what = obs.health_error or f"/health {obs.health_status}"
            return self._set(ServerState.STARTING, "connection refused" if what == REFUSED else what)
        # ready before: is it still alive and well?
        if obs.engine_lost is not None:
            return self._set(ServerState.DEAD, obs.engine_lost)
        if obs.health_status in (500, 503):
            return self._set(ServerState.DEAD, f"/health {obs.health_status}")
        if obs.health_error in (REFUSED, CONNECTION):
            return self._set(ServerState.DEAD, "connection refused" if obs.health_error == REFUSED else "connection lost")
        if obs.health_error == TIMEOUT:
            return self._set(ServerState.HUNG, "/health timed out")
        if obs.health_status != 200:
            return self._set(ServerState.TELEMETRY_DOWN, obs.health_error or f"/health {obs.health_status}")
        if obs.metrics_error is not None:
            return self._set(ServerState.TELEMETRY_DOWN, f"/metrics: {obs.metrics_error}")
        if not obs.has_vllm:
            return self._set(ServerState.READY, "no vllm: metrics (limited telemetry)")
        if obs.server_load:
            self._load_tracking = True  # --enable-server-load-tracking is on: /load means something
        if obs.tokens_advanced is not None:
            self._flat = self._flat + 1 if obs.tokens_advanced == 0 else 0
        if obs.engine_stalled is not None:
            return self._set(ServerState.HUNG, obs.engine_stalled)
        if obs.probe_hung is not None and not obs.tokens_advanced:
            return self._set(ServerState.HUNG, obs.probe_hung)
        if obs.sleeping:
            return self._set(ServerState.SLEEPING, "engine asleep")
        if obs.work is None:
            return self._set(ServerState.READY, "no request gauges")
        if obs.work > 0:
            if self._flat >= self.hang_after:
                if self._load_tracking and obs.server_load == 0:
                    # nothing in flight at the API server: the gauges are frozen, not the engine
                    return self._set(ServerState.IDLE, "gauges frozen (/load 0)")
                if obs.engine_working:
                    # a long prefill counts its prompt tokens when it ends: the engine steps
                    return self._set(ServerState.BUSY, f"engine working, no token counted for {self._flat} scrapes")
                return self._set(ServerState.HUNG, f"work queued, token counters flat for {self._flat} scrapes")
            return self._set(ServerState.BUSY, "serving")
        if obs.tokens_advanced:
            return self._set(ServerState.BUSY, "tokens advancing")
        return self._set(ServerState.IDLE, "nothing running or waiting")

    def _set(self, state: ServerState, reason: str) -> ServerState:
        self.state, self.reason = state, reason
        return state
