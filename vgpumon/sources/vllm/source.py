"""The vLLM source: finds the host's vLLM servers, scrapes them concurrently, keeps each one's
state, and hands the agent one ``ServerSample`` per server per poll. This module supervises the
set of servers (discovery, static targets, the polling loop, idle discovery, shutdown); the poll
of one server (its requests, readings, the door and its sample) is ``scrape.ServerScraper``, and
the GPU activity the prewarm figure reads is ``activity.GpuActivityLog``.

Isolation (ARCHITECTURE "Nothing blocks the loop"): every HTTP request has its own timeout and a
response-size limit (an oversized body is an error, read no further than the limit); requests to
all servers run concurrently, so a hung server costs the others nothing; ``/metrics`` is parsed
and the process table read on a worker thread, so the event loop (which schedules NVML ticks)
is never held by a large scrape.

Endpoints: ``/health`` and ``/metrics`` every poll; ``/version`` until known (it never touches the
engine); ``/v1/models`` until it lists a model (readiness needs one listed, or ``vllm:`` metrics); ``/load`` (0.8.5+), ``/is_sleeping`` (dev mode) and a JSON
``/stats`` (not part of vLLM; some deployments add one) every poll once they answered 200 — a 404
stops asking for that server's lifetime.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncIterator, Callable, Sequence
from urllib.parse import urlsplit

import aiohttp

from vgpumon import catalogue
from vgpumon.base.pacing import sleep_unless
from vgpumon.base.workers import Latch, name_os_thread
from vgpumon.catalogue import Door
from vgpumon.model import InstanceIdentity, ServerProcess, ServerSample, Snapshot, SourceStatus, VllmServers
from vgpumon.sources.vllm.activity import GpuActivityLog
from vgpumon.sources.vllm.discovery import ProcessTable, PsutilProcessTable, VllmProcess
from vgpumon.sources.vllm.energy import GpuEnergyLog
from vgpumon.sources.vllm.scrape import ServerScraper, TrackedServer
from vgpumon.sources.vllm.slo import SloTargets
from vgpumon.sources.vllm.state import Lifecycle

__all__ = ["DEFAULT_MAX_RESPONSE_BYTES", "GpuActivityLog", "VllmSource"]

log = logging.getLogger(__name__)
DEFAULT_MAX_RESPONSE_BYTES = 8 << 20  # a real 0.32 scrape is ~50 kB; many LoRA adapters × buckets stay far below


def _key_of_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    return parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)


class VllmSource(ServerScraper):
    """Discovers and scrapes the vLLM servers of one host.

    Args:
        static_urls: base URLs to scrape besides the discovered servers (servers in containers
            whose processes the agent cannot see), e.g. ``http://10.0.0.5:8000``.
        processes: the process table (``PsutilProcessTable`` by default; ``NoProcesses`` turns
            discovery off).
        clock: epoch-seconds clock for sample times, prewarm and state (``time.time``); injected
            so that tests drive time.
        interval: seconds between polls in ``run``.
        idle_interval: seconds between polls while no server is tracked (discovery only); a new
            server is found within this plus one scan (the prewarm rule needs its start).
        request_timeout: per-request timeout in seconds (connect + full body).
        max_response_bytes: larger bodies are errors (``"too large"``), read no further.
        hang_after: scrapes with work queued and token counters flat before "hung"; also the
            polls an engine process must stay stopped (``T``) or in ``D``.
        slo: SLO targets and window of the attainment figures (``vgpumon.sources.vllm.slo``).
        probe_timeout: deadline in seconds of the one-token generation probe sent to a server
            that reads idle while clients wait on it (``hang.HangWatch``); 0 turns it off.
        session: an aiohttp session to use (created on first poll otherwise, closed by
            ``close``).
        activity: the GPU activity log the prewarm figure reads (fed by ``observe``).
    """

    def __init__(
        self,
        *,
        static_urls: Sequence[str] = (),
        processes: ProcessTable | None = None,
        clock: Callable[[], float] = time.time,
        interval: float = 2.0,
        idle_interval: float = 4.0,
        request_timeout: float = 1.5,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        hang_after: int = 3,
        probe_timeout: float = 10.0,
        slo: SloTargets | None = None,
        session: aiohttp.ClientSession | None = None,
        activity: GpuActivityLog | None = None,
    ) -> None:
        self.static_urls = tuple(u.rstrip("/") if "://" in u else f"http://{u.rstrip('/')}" for u in static_urls)
        self.processes: ProcessTable = processes if processes is not None else PsutilProcessTable()
        self.clock = clock
        self.interval = interval
        self.idle_interval = idle_interval
        self.request_timeout = request_timeout
        self.max_response_bytes = max_response_bytes
        self.hang_after = hang_after
        self.probe_timeout = probe_timeout
        self.slo = slo or SloTargets()
        self.activity = activity or GpuActivityLog()
        self.energy_log = GpuEnergyLog()
        self._session = session
        self._own_session = session is None
        self._servers: dict[tuple[str, int], TrackedServer] = {}
        self._gpu_pids: dict[str, set[int]] = {}
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-vllm", initializer=name_os_thread)
        # every value from a server passes the field catalogue's door; rejections counted per field
        self.door = Door((*catalogue.fields_of("vllm_samples"), *catalogue.fields_of("vllm_instances")))
        self.rejected = self.door.rejected

    # -- inputs from the agent -----------------------------------------------------------------

    def observe(self, snap: Snapshot) -> None:
        """Take the NVML view of a tick: compute processes per GPU (host pids, for the
        server → GPU mapping) and GPU activity (for prewarm). Called with each tick, on the
        agent's sampling thread (paced runs) or the event loop (replays): both are assigned or
        appended whole, and read from copies."""
        self._gpu_pids = {s.uuid: {pid for pid, _ in s.processes} for s in snap.samples}
        self.activity.observe(snap)
        self.energy_log.observe(snap)

    # -- polling -------------------------------------------------------------------------------

    @property
    def servers(self) -> dict[tuple[str, int], ServerSample | None]:
        """(host, port) → the latest sample of each server being tracked."""
        return {k: s.last for k, s in self._servers.items()}

    def discovered(self) -> dict[str, VllmProcess]:
        """Base URL → the process of each server found in the process table, as last discovered
        (static targets, whose processes the agent cannot see, are left out, and so are servers not
        yet listening where they say): the PIDs ``diagnose --stacks`` may dump, and no others."""
        return {s.identity.url: s.process for s in self._servers.values() if s.process is not None and s.process.listening}

    def attach(self, snap: Snapshot) -> Snapshot:
        """``snap`` carrying this source's view (``Snapshot.vllm``) and its status among the
        snapshot's sources: what the exporter and the API serve of vLLM. Called with each tick
        on the sampling thread while a poll may run on the event loop: the tracked servers are
        copied whole (one C-level copy under the GIL) and each sample is immutable."""
        tracked = tuple(self._servers.values())
        samples = tuple(t.last for t in tracked if t.last is not None)
        processes = {
            t.identity.url: ServerProcess(t.process.pid, tuple(t.process.engine_pids))
            for t in tracked if t.process is not None and t.process.listening
        }
        view = VllmServers(samples=samples, interval=self.interval, read_at=self.clock(), processes=processes)
        recent = view.recent()
        status = SourceStatus(
            "vllm", bool(recent) or not samples, max((s.ts for s in samples), default=None),
            max((s.scrape_seconds for s in recent if s.scrape_seconds is not None), default=float("nan")),
            dict(self.rejected),
        )
        return dataclasses.replace(snap, vllm=view, sources=(*snap.sources, status))

    async def poll(self) -> list[ServerSample]:
        """One poll of every server: discovery, concurrent scrapes, state, derived figures.

        Returns:
            One sample per server tracked in this poll, plus a final sample (``ended``) for
            each discovered server whose process went away or was replaced.
        """
        now = self.clock()
        try:
            found: Sequence[VllmProcess] = await self._offload(self.processes.scan)
            # a process listening where it says wins over one that merely claims the address
            live = {(p.host, p.port): p for p in sorted(found, key=lambda p: p.listening)}
        except Exception as exc:  # noqa: BLE001 - a broken process table must not stop scraping
            log.warning("vLLM discovery failed: %s", exc)
            # nothing is known of the discovered servers this poll: keep them as they were
            live = {k: s.process for k, s in self._servers.items() if s.process is not None}
        out: list[ServerSample] = []
        for key, srv in list(self._servers.items()):
            if srv.identity.origin != "discovered":
                continue
            p = live.get(key)
            if p is None or (p.pid, p.create_time) != (srv.identity.pid, srv.identity.process_start):
                del self._servers[key]
                try:
                    out.append(self._ended(srv, now))
                except Exception as exc:  # noqa: BLE001 - one server's failure costs only its own sample
                    log.exception("vLLM server %s: final sample failed", srv.identity.url)
                    out.extend(self._failed(srv, now, exc))
        for key, p in live.items():
            tracked = self._servers.get(key)
            if tracked is None:
                ident = InstanceIdentity(
                    host=p.host, port=p.port, url=f"http://{_url_host(p.host)}:{p.port}", origin="discovered",
                    pid=p.pid, process_start=p.create_time, first_seen=now,
                )
                tracked = TrackedServer(
                    ident, Lifecycle(first_seen=now, process_start=p.create_time, hang_after=self.hang_after)
                )
                self._servers[key] = tracked
                log.info("vLLM server found: pid %d on %s", p.pid, ident.url)
            tracked.pids = p.pids
            tracked.process = p
        for url in self.static_urls:
            key = _key_of_url(url)
            if key not in self._servers:
                ident = InstanceIdentity(
                    host=key[0], port=key[1], url=url, origin="static", pid=None, process_start=None, first_seen=now
                )
                self._servers[key] = TrackedServer(ident, Lifecycle(first_seen=now, hang_after=self.hang_after))
        servers = list(self._servers.values())
        if servers and self._session is None:  # made when there is a server to ask, not before
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit_per_host=8), trust_env=False, raise_for_status=False
            )
        samples = await asyncio.gather(*(self._poll_one(s, now) for s in servers), return_exceptions=True)
        for srv, smp in zip(servers, samples):
            if isinstance(smp, BaseException):
                if isinstance(smp, asyncio.CancelledError) or not isinstance(smp, Exception):
                    raise smp
                log.error("vLLM poll of %s failed", srv.identity.url, exc_info=smp)
                out.extend(self._failed(srv, now, smp))
                continue
            out.append(smp)
        return out

    async def run(self, stop: asyncio.Event) -> AsyncIterator[list[ServerSample]]:
        """Poll every ``interval`` seconds (monotonic wall clock) until ``stop`` is set.

        While no server is tracked (none discovered, none configured) only discovery runs: the
        process table is scanned every ``idle_interval`` seconds on the source's own thread, and
        nothing is yielded until a scan finds a server (then it is polled at once) or ``stop`` is
        set. An idle agent's event loop thus sleeps through discovery instead of waking twice
        per scan (docs/benchmarks.md, "Agent footprint"); a new server is still found within
        ``idle_interval`` plus one scan."""
        due = time.monotonic()
        while not stop.is_set():
            if not self._servers and not self.static_urls:
                if not await self._await_server(stop, due - time.monotonic()):
                    return
            yield await self.poll()
            due += self.interval if self._servers else max(self.interval, self.idle_interval)
            now = time.monotonic()
            if due < now:  # the poll overran: the next one now, no burst to catch up
                due = now
            await sleep_unless(stop, due - now)

    async def _await_server(self, stop: asyncio.Event, delay: float) -> bool:
        """Idle discovery (see ``run``): True when a scan found a server, False when stopped."""
        latch = Latch()
        watch = asyncio.get_running_loop().create_task(stop.wait())
        watch.add_done_callback(lambda _: latch.set())
        try:
            return bool(await self._offload(self._scan_until_found, latch, delay))
        finally:
            watch.cancel()
            latch.set()  # a cancelled wait must not leave the thread scanning

    def _scan_until_found(self, latch: Latch, delay: float) -> bool:
        """On the source's thread: scan every ``idle_interval`` seconds, the first after
        ``delay``, until a scan finds a server (True) or ``latch`` is set (False). A failing scan
        is logged, as in ``poll``, and tried again at the next."""
        if delay > 0 and latch.wait(delay):
            return False
        while True:
            try:
                if self.processes.scan():
                    return True
            except Exception as exc:  # noqa: BLE001 - a broken process table must not stop discovery
                log.warning("vLLM discovery failed: %s", exc)
            if latch.wait(self.idle_interval):
                return False

    async def close(self) -> None:
        """Close the HTTP session (when the source made it) and the worker thread; a probe in
        flight is cancelled."""
        for srv in self._servers.values():
            if srv.hang is not None:
                srv.hang.cancel()
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None
        self._exec.shutdown(wait=False)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
