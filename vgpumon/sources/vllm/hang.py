"""Telling a hung vLLM server from an idle or a slow one (docs/vllm.md, "Hung, not slow").

vLLM's gauges live in its engine process and freeze when it does: an engine stopped with SIGSTOP
leaves ``/metrics`` reading what it read last (often 0 running, 0 waiting) and ``/health`` answering
200, so every face of the server says idle while its clients wait. Two signals beside ``/metrics``
tell the two apart:

* **The engine processes' state** (psutil, the ``VLLM::EngineCore`` and worker children the
  process table found): stopped (``T``: SIGSTOP, a debugger's stop, ``t`` tracing) or in
  uninterruptible sleep (``D``) on ``after`` consecutive polls is hung. One poll in ``D`` is a page
  fault or a driver call; a long prefill keeps its engine running (``R``/``S``), never stopped.
* **A generation probe**: one token asked of ``/v1/completions`` with a deadline, marked so that it
  is told apart from user traffic (request id ``vgpumon-probe-…``, user ``vgpumon-probe``). It is
  sent only when the server looks idle (nothing running or waiting, token counters flat for
  ``after`` scrapes) while clients hold connections open on its port: the one situation in which a
  frozen engine and an idle one read alike. A probe with no answer by its deadline is hung; an
  answer (any token) clears it; a refusal (401, 404, 400: an API key, another model name) stops
  probing that server, logged once, and concludes nothing.

Everything here reads the process table or the network; the decision is the state machine's
(``state.Lifecycle``), which gets the verdicts as ``Observation.engine_stalled`` and
``Observation.probe_hung``.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count

import aiohttp
import psutil

log = logging.getLogger("vgpumon.sources.vllm.source")

#: request ids of the probe start with this (vLLM takes ``X-Request-Id`` as the request's id)
PROBE_ID_PREFIX = "vgpumon-probe-"
PROBE_USER = "vgpumon-probe"
#: seconds between two probes of one server while it stays suspect (idle, flat, clients waiting)
PROBE_EVERY = 30.0
#: the process states that are no progress when they last (psutil's names)
_STALLED = {psutil.STATUS_STOPPED: "stopped (T)", psutil.STATUS_TRACING_STOP: "stopped (t)",
            psutil.STATUS_DISK_SLEEP: "in uninterruptible sleep (D)"}
_ids = count(1)


def engine_states(pids: Sequence[int]) -> dict[int, str]:
    """psutil's status of each engine process that still exists (on the source's thread)."""
    out: dict[int, str] = {}
    for pid in pids:
        try:
            out[pid] = psutil.Process(pid).status()
        except psutil.Error:
            continue
    return out


def client_connections(server_pids: Sequence[int], port: int) -> int:
    """Established TCP connections to ``port`` held by the server's processes, less the agent's
    own (its scrapes keep connections alive): the clients waiting on the server."""
    own: set[tuple[str, int]] = set()
    try:
        own = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(os.getpid()).net_connections(kind="tcp") if c.laddr}
    except psutil.Error:
        pass
    n = 0
    for pid in server_pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port == port and c.raddr:
                n += (c.raddr.ip, c.raddr.port) not in own
    return n


@dataclass
class HangWatch:
    """What the source keeps of one server to tell hung from idle (see the module docstring).

    Args:
        after: polls an engine must stay stopped or in ``D`` (the state machine's ``hang_after``).
        probe_timeout: the probe's deadline in seconds; 0 turns the probe off.
    """

    after: int = 3
    probe_timeout: float = 10.0
    stalled_polls: dict[int, int] = field(default_factory=dict)
    probe_hung: str | None = None  # why the last probe says hung; None when it answered (or none ran)
    probing: asyncio.Task[None] | None = None
    last_probe_ts: float | None = None
    probe_off: str | None = None  # why this server is not probed (a refusal), logged once
    progress: int = 0  # times tokens were seen to advance: a probe outrun by progress concludes nothing

    def engine_stalled(self, states: Mapping[int, str]) -> str | None:
        """Fold one poll's engine states in; the reason when an engine has been stopped or in ``D``
        on ``after`` consecutive polls, else ``None``."""
        self.stalled_polls = {pid: self.stalled_polls.get(pid, 0) + 1 for pid, st in states.items() if st in _STALLED}
        for pid, n in sorted(self.stalled_polls.items()):
            if n >= self.after:
                return f"engine process {pid} {_STALLED[states[pid]]} for {n} polls"
        return None

    def progressed(self) -> None:
        """Tokens advanced: whatever a probe said before, the engine steps; a probe in flight now
        that later misses its deadline was queued behind work the engine did (a resumed engine
        serving its backlog), and says nothing of a hang."""
        self.progress += 1
        self.probe_hung = None

    def probe_due(self, now: float, *, suspect: bool) -> bool:
        """A probe should start now: enabled, none in flight, the server suspect (or hung by an
        earlier probe: a new probe tells when it recovers), the last probe ``PROBE_EVERY`` ago."""
        if self.probe_timeout <= 0 or self.probe_off is not None or (self.probing is not None and not self.probing.done()):
            return False
        if not suspect and self.probe_hung is None:
            return False
        return self.last_probe_ts is None or now - self.last_probe_ts >= PROBE_EVERY

    def start_probe(self, session: aiohttp.ClientSession, base: str, model: str, now: float) -> None:
        """Send the probe in the background; its verdict is read at a later poll."""
        self.last_probe_ts = now
        self.probing = asyncio.get_running_loop().create_task(self._probe(session, base, model))

    async def _probe(self, session: aiohttp.ClientSession, base: str, model: str) -> None:
        rid = f"{PROBE_ID_PREFIX}{os.getpid()}-{next(_ids)}"
        body = {"model": model, "prompt": "ping", "max_tokens": 1, "temperature": 0, "user": PROBE_USER}
        t0 = time.monotonic()
        seen = self.progress
        try:
            async with session.post(
                base + "/v1/completions", json=body, headers={"X-Request-Id": rid}, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=self.probe_timeout),
            ) as r:
                await r.read()
                status = r.status
        except asyncio.TimeoutError:
            if self.progress != seen:
                log.debug("vLLM server %s: probe %s missed its deadline while tokens advanced: no verdict", base, rid)
                return
            self.probe_hung = f"generation probe {rid}: no token within {self.probe_timeout:g} s"
            log.warning("vLLM server %s: %s", base, self.probe_hung)
            return
        except (aiohttp.ClientError, OSError):
            return  # refused or reset: the health checks decide dead; the probe concludes nothing
        if status == 200:
            self.probe_hung = None
            log.debug("vLLM server %s: probe answered in %.2f s", base, time.monotonic() - t0)
        elif status in (400, 401, 403, 404, 405, 422):
            self.probe_off = f"/v1/completions answered {status}"
            self.probe_hung = None
            log.info("vLLM server %s: generation probe refused (%s); not probed again", base, self.probe_off)

    def cancel(self) -> None:
        if self.probing is not None and not self.probing.done():
            self.probing.cancel()


def engine_working(engine_pids: Sequence[int], cpu_now: Mapping[int, float], cpu_before: Mapping[int, float] | None,
                   seconds: float, threshold: float) -> bool | None:
    """Whether the engine processes used at least ``threshold`` of a core over the last
    ``seconds`` (CPU seconds per process, from two polls); ``None`` when not known."""
    if cpu_before is None or seconds <= 0:
        return None
    common = set(engine_pids) & set(cpu_now) & set(cpu_before)
    if not common:
        return None
    return sum(max(cpu_now[p] - cpu_before[p], 0.0) for p in common) / seconds >= threshold
