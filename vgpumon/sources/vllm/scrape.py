"""Scraping one vLLM server: its requests (each with its own timeout and size limit), what their
answers say (``/metrics`` parsed on the source's thread), the door every value from outside
passes, and the poll's ``ServerSample``. ``ServerScraper`` is the part of ``VllmSource`` that
handles one server; ``vgpumon.sources.vllm.source`` supervises the set of them."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import aiohttp

from vgpumon import catalogue
from vgpumon.catalogue import Door, Rejected
from vgpumon.catalogue.vllm import ENGINE_KEY_LENGTHS, ENGINE_SERIES_LIMIT
from vgpumon.model import EngineSample, InstanceIdentity, ServerSample, ServerState
from vgpumon.sources.vllm import kv
from vgpumon.sources.vllm.activity import GpuActivityLog
from vgpumon.sources.vllm.derive import IntervalDeriver, gauge_fingerprint
from vgpumon.sources.vllm.discovery import ProcessTable, VllmProcess
from vgpumon.sources.vllm.energy import EnergyMeter, EnergyPerToken, GpuEnergyLog, memory_shares
from vgpumon.sources.vllm.hang import HangWatch, client_connections, engine_states, engine_working
from vgpumon.sources.vllm.metrics import (
    MetricsParseError,
    MetricsReading,
    parse_metrics,
    parse_version,
    prefix_cache_unit,
)
from vgpumon.sources.vllm.slo import SloTargets
from vgpumon.sources.vllm.state import (
    CONNECTION,
    ENGINE_WORKING_CPU,
    REFUSED,
    TIMEOUT,
    TOO_LARGE,
    Lifecycle,
    Observation,
)

#: the source's logger (``vgpumon.sources.vllm.source``'s): one name for every line the source logs
log = logging.getLogger("vgpumon.sources.vllm.source")
#: ``vllm_samples`` fields whose values come from outside (a server's answers, psutil) and are
#: checked at the door; the others are the source's own (state, reasons, flags).
_ADMITTED = frozenset(f.name for f in catalogue.fields_of("vllm_samples") if f.kind in ("gauge", "counter")) | {
    "sleep_state",
    "health_status",
}

_ACCEPT_METRICS = "text/plain;version=0.0.4;q=1.0, application/openmetrics-text;q=0.5"


@dataclass
class Reply:
    """One HTTP request's answer, or why there was none (``error``)."""

    status: int | None = None
    body: bytes | bytearray | None = None
    error: str | None = None
    content_type: str = ""

    def json(self) -> Any:
        if self.status != 200 or self.body is None:
            return None
        try:
            return json.loads(self.body)
        except ValueError:
            return None


_T = TypeVar("_T")


@dataclass
class TrackedServer:
    """What the source keeps of one server between polls."""

    identity: InstanceIdentity
    lifecycle: Lifecycle
    pids: tuple[int, ...] = ()
    deriver: IntervalDeriver = field(default_factory=IntervalDeriver)
    version: str | None = None
    models: tuple[str, ...] | None = None
    caps: dict[str, bool] = field(default_factory=dict)  # endpoint → answers (False after a 404)
    prev_fingerprint: Mapping[object, object] | None = None  # gauge_fingerprint of the last scrape
    prev_cpu: Mapping[int, float] | None = None
    prev_cpu_ts: float | None = None
    gpus_seen: set[str] = field(default_factory=set)
    prewarm_activity: tuple[float, str] | None = None
    last: ServerSample | None = None
    process: VllmProcess | None = None  # as last discovered (None for static targets)
    engines_seen: dict[int, None] = field(default_factory=dict)  # engine pids seen since /health 200
    partial: bool = False  # the last /metrics had unreadable lines (logged when it starts)
    rejecting: bool = False  # the last poll had values refused at the door (logged when it starts)
    hang: HangWatch | None = None  # engine states and the generation probe (made at the first poll)
    energy: EnergyMeter = field(default_factory=EnergyMeter)  # energy per generated token


class ServerScraper:
    """The poll of one server: requests, readings, the door and the sample. The part of
    ``VllmSource`` that handles one server; the source sets these attributes (see its docstring)."""

    processes: ProcessTable
    request_timeout: float
    max_response_bytes: int
    hang_after: int
    probe_timeout: float
    slo: SloTargets
    activity: GpuActivityLog
    energy_log: GpuEnergyLog
    door: Door
    rejected: Counter[str]
    _session: aiohttp.ClientSession | None
    _servers: dict[tuple[str, int], TrackedServer]
    _gpu_pids: dict[str, set[int]]
    _exec: ThreadPoolExecutor

    async def _offload(self, fn: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._exec, fn, *args)

    def _failed(self, srv: TrackedServer, now: float, exc: Exception) -> list[ServerSample]:
        """The sample of a poll that raised: the server's state as it stood, the error as the
        reason, nothing measured. One server's failure thus costs only its own poll, and the
        store still shows that the poll happened and why it has no figures."""
        try:
            smp = replace(self._sample(srv, now), reason=f"poll failed: {type(exc).__name__}: {exc}"[:200])
        except Exception:  # noqa: BLE001 - not even that: the gap is logged above
            log.exception("vLLM server %s: no sample for this poll", srv.identity.url)
            return []
        srv.last = smp
        return [smp]

    async def _get(self, url: str, *, accept: str | None = None) -> Reply:
        assert self._session is not None
        headers = {"Accept": accept} if accept else {}
        try:
            async with self._session.get(
                url, headers=headers, allow_redirects=False, timeout=aiohttp.ClientTimeout(total=self.request_timeout)
            ) as r:
                if r.content_length is not None and r.content_length > self.max_response_bytes:
                    return Reply(status=r.status, error=TOO_LARGE)
                body = bytearray()
                async for chunk in r.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > self.max_response_bytes:
                        return Reply(status=r.status, error=TOO_LARGE)
                # the bytearray itself: a bytes() copy would hold the body twice while it is read
                return Reply(status=r.status, body=body, content_type=r.headers.get("Content-Type", ""))
        except asyncio.TimeoutError:
            return Reply(error=TIMEOUT)
        except aiohttp.ClientConnectorError as exc:
            refused = isinstance(exc.os_error, ConnectionRefusedError) or "refused" in str(exc).lower()
            return Reply(error=REFUSED if refused else CONNECTION)
        except (aiohttp.ClientError, OSError):
            return Reply(error=CONNECTION)

    def _ended(self, srv: TrackedServer, now: float) -> ServerSample:
        """The last sample of a discovered server whose process is gone (or was replaced)."""
        lc = srv.lifecycle
        if srv.hang is not None:
            srv.hang.cancel()
        lc.step(Observation(ts=now, process_alive=False, health_status=None))
        smp = self._sample(srv, now, ended=True)
        srv.last = smp
        log.info("vLLM server pid %s on %s gone (%s)", srv.identity.pid, srv.identity.url, lc.state.value)
        return smp

    async def _poll_one(self, srv: TrackedServer, now: float) -> ServerSample:
        base = srv.identity.url
        t0 = time.perf_counter()
        lc = srv.lifecycle
        if srv.process is not None and not srv.process.listening:
            # its own socket does not prove the address yet: nothing is sent there (a port that
            # refuses, as far as the lifecycle is concerned: starting, then failed to start)
            unproven = _not_listening(srv.identity.port)
            requests: dict[str, Any] = {"health": _ready(unproven), "metrics": _ready(unproven)}
        else:
            requests = {
                "health": self._get(base + "/health"),
                "metrics": self._get(base + "/metrics", accept=_ACCEPT_METRICS),
            }
        listening = srv.process is None or srv.process.listening
        if listening and srv.version is None and srv.caps.get("version", True):
            requests["version"] = self._get(base + "/version")
        if listening and not srv.models and srv.caps.get("models", True):  # before ready too: readiness needs a model listed
            requests["models"] = self._get(base + "/v1/models")
        if lc.ready_ts is not None:
            for name, path in (("load", "/load"), ("is_sleeping", "/is_sleeping"), ("stats", "/stats")):
                if srv.caps.get(name, True):
                    requests[name] = self._get(base + path)
        if srv.identity.origin == "discovered" and srv.pids:
            requests["usage"] = self._offload(self.processes.usage, srv.pids)
        engines = srv.process.engine_pids if srv.process is not None else ()
        if engines and lc.ready_ts is not None:
            requests["engine_states"] = self._offload(engine_states, engines)
        replies = dict(zip(requests, await asyncio.gather(*requests.values())))
        scrape_seconds = time.perf_counter() - t0
        for name in ("version", "models", "load", "is_sleeping", "stats"):
            rep = replies.get(name)
            if isinstance(rep, Reply) and rep.status is not None:
                if rep.status == 404:
                    srv.caps[name] = False
                elif rep.status == 200:
                    srv.caps[name] = True
        health: Reply = replies["health"]
        if srv.identity.origin == "static" and lc.state is ServerState.DEAD and health.status == 200:
            # a static target answers again after it died: a new start of that server
            ident = replace(srv.identity, first_seen=now)
            srv = TrackedServer(ident, Lifecycle(first_seen=now, hang_after=self.hang_after))
            self._servers[(ident.host, ident.port)] = srv
            lc = srv.lifecycle
        # text from outside through the door (its length, no NUL), JSON of the wrong shape no
        # answer: a refused version or model name costs only itself, and both stores hold the same
        refused: dict[str, str] = {}
        if (v := replies.get("version")) is not None:
            srv.version = version_answer(self.door, v.json(), refused)
        if (m := replies.get("models")) is not None:
            srv.models = models_answer(self.door, m.json(), refused)

        reading: MetricsReading | None = None
        metrics: Reply = replies["metrics"]
        metrics_error: str | None = None
        if metrics.error is not None:
            metrics_error = metrics.error
        elif metrics.status != 200:
            metrics_error = f"HTTP {metrics.status}"
        else:
            body = metrics.body or b""
            om = metrics.content_type.startswith("application/openmetrics-text")
            try:
                reading = await self._offload(lambda: parse_metrics(body, openmetrics=om))
            except MetricsParseError as exc:
                metrics_error = str(exc)
            del body
            metrics.body = None  # what the reading keeps is all that stays of the body
            if reading is not None and reading.lines_dropped and not srv.partial:
                log.warning("vLLM server %s: %d /metrics lines unreadable; telemetry partial", base, reading.lines_dropped)
            srv.partial = bool(reading and reading.lines_dropped)
        stats = stats_fields(replies["stats"].json()) if "stats" in replies else {}
        load_doc = replies["load"].json() if "load" in replies else None
        server_load = load_answer(load_doc)
        sleeping_doc = replies["is_sleeping"].json() if "is_sleeping" in replies else None
        derived: dict[str, float | None] = {}
        running = waiting = kv_usage = kv_mean = None
        sleep_state = None
        if reading is not None:
            derived = srv.deriver.step(now, reading, self.slo)
            running, waiting = reading.running, reading.waiting
            kv_usage, kv_mean = reading.kv_cache_usage_ratio, reading.kv_cache_usage_mean_ratio
            sleep_state = reading.sleep_state
        running = running if running is not None else stats.get("running")
        waiting = waiting if waiting is not None else stats.get("waiting")
        kv_usage = kv_usage if kv_usage is not None else stats.get("kv_cache_usage")
        # The door (the field catalogue's ranges), before anything is derived from these: a
        # running count of 1e16, a KV usage of 1.7 or a negative queue is refused and counted.
        rejected: dict[str, str] = dict(reading.rejected) if reading is not None else {}
        self.rejected.update({name: 1 for name in rejected})
        rejected.update(refused)
        first = {"running": running, "waiting": waiting, "kv_cache_usage_ratio": kv_usage, "kv_cache_usage_mean_ratio": kv_mean}
        rejected.update(self.door.check_row(first, first))
        running, waiting = first["running"], first["waiting"]
        kv_usage, kv_mean = first["kv_cache_usage_ratio"], first["kv_cache_usage_mean_ratio"]
        work = None if running is None and waiting is None else (running or 0.0) + (waiting or 0.0)
        sleeping: bool | None = None
        if sleep_state is not None:
            sleeping = sleep_state != "awake"
        elif (sleeping := sleeping_answer(sleeping_doc)) is not None:
            sleep_state = "asleep" if sleeping else "awake"
        alive: bool | None = None if srv.identity.origin == "static" else True
        was_ready = lc.ready_ts is not None
        if srv.hang is None:
            srv.hang = HangWatch(after=self.hang_after, probe_timeout=self.probe_timeout)
        watch = srv.hang
        if derived.get("tokens_advanced"):
            watch.progressed()
        usage = replies.get("usage")
        lc.step(
            Observation(
                ts=now, process_alive=alive, health_status=health.status, health_error=health.error,
                metrics_error=metrics_error, has_vllm=bool(reading and reading.has_vllm) or bool(stats),
                model_listed=bool(srv.models) if srv.caps.get("models", True) else None, work=work,
                tokens_advanced=derived.get("tokens_advanced"), sleeping=sleeping, server_load=server_load,
                engine_lost=self._engine_lost(srv, health.status == 200),
                engine_stalled=watch.engine_stalled(replies.get("engine_states") or {}),
                engine_working=None if usage is None or srv.prev_cpu_ts is None else engine_working(
                    engines, usage.cpu_seconds, srv.prev_cpu, now - srv.prev_cpu_ts, ENGINE_WORKING_CPU),
                probe_hung=watch.probe_hung,
            )
        )
        await self._maybe_probe(srv, watch, now, reading)
        if reading is not None:
            fp = gauge_fingerprint(reading)
            lc.note_frozen(fp == srv.prev_fingerprint)
            srv.prev_fingerprint = fp
        # GPUs: any NVML compute process that belongs to the server's process tree
        tree = set(srv.pids)
        gpus = tuple(sorted(u for u, pids in self._gpu_pids.items() if pids & tree))
        generated = reading.counter_total("generation_tokens") if reading is not None else None
        srv.energy.note_tokens(now, generated)
        if gpus:
            log_ = self.energy_log
            shares, shared = memory_shares(gpus, log_.processes, tree)
            srv.energy.step({u: log_.reads[u] for u in gpus if u in log_.reads}, shares, shared)
        if not was_ready:
            srv.gpus_seen.update(gpus)
        if not was_ready and lc.ready_ts is not None:
            srv.prewarm_activity = self.activity.mean(srv.gpus_seen or gpus, lc.start_ts, lc.ready_ts)
            if lc.prewarm_seconds is None:
                log.info("vLLM server %s ready (its prewarm time is not known)", srv.identity.url)
            else:
                log.info("vLLM server %s ready; prewarm %.1f s", srv.identity.url, lc.prewarm_seconds)
        rss = cpu_rate = None
        if usage is not None:
            rss = usage.rss_bytes
            if srv.prev_cpu is not None and srv.prev_cpu_ts is not None and now > srv.prev_cpu_ts:
                common = set(usage.cpu_seconds) & set(srv.prev_cpu)
                if common:
                    cpu_rate = sum(max(usage.cpu_seconds[p] - srv.prev_cpu[p], 0.0) for p in common) / (now - srv.prev_cpu_ts)
            srv.prev_cpu, srv.prev_cpu_ts = usage.cpu_seconds, now
        cache = reading.cache if reading is not None else None
        est = kv.estimate(
            running=running, kv_usage_ratio=kv_usage,
            block_size=(cache.block_size if cache else None) or stats.get("block_size"),
            num_gpu_blocks=(cache.num_gpu_blocks if cache else None) or stats.get("num_gpu_blocks"),
            kv_cache_size_tokens=cache.kv_cache_size_tokens if cache else None,
            hybrid=cache.hybrid if cache else None,
        )
        version_t = parse_version(srv.version)
        values: dict[str, Any] = dict(
            health_status=health.status,
            metric_lines_dropped=reading.lines_dropped if reading is not None else None,
            kv_block_size=(cache.block_size if cache else None) or stats.get("block_size"),
            kv_num_gpu_blocks=(cache.num_gpu_blocks if cache else None) or stats.get("num_gpu_blocks"),
            kv_cache_size_tokens=cache.kv_cache_size_tokens if cache else None,
            kv_blocks_used=est.blocks_used if est else None,
            kv_fragmentation_ratio=est.fragmentation_ratio if est else None,
            kv_token_occupancy_ratio=est.token_occupancy_ratio if est else None,
            sleep_state=sleep_state,
            server_load=server_load,
            rss_bytes=rss,
            cpu_seconds_per_second=cpu_rate,
            **{k: v for k, v in derived.items() if k != "tokens_advanced"},
        )
        rejected.update(self.door.check_row(values, [n for n in values if n in _ADMITTED]))
        smp = self._sample(
            srv, now,
            metrics_error=metrics_error,
            telemetry=_telemetry(reading, stats),
            running=running, waiting=waiting, kv_cache_usage_ratio=kv_usage, kv_cache_usage_mean_ratio=kv_mean,
            prefix_cache_unit=prefix_cache_unit(reading, version_t) if reading is not None else None,
            kv_estimate_approximate=est.approximate if est else None,
            gauges_stale=lc.stale,
            gpu_uuids=gpus,
            engines=self._engines(reading, rejected) if reading is not None else (),
            scrape_seconds=scrape_seconds,
            generation_tokens_total=generated,
            **_energy_fields(srv.energy.last, now),
            engine_labels=self._texts("engine", reading.engines, ENGINE_KEY_LENGTHS["engine"], rejected) if reading is not None else (),
            label_models=self._texts("model_name", reading.model_names, ENGINE_KEY_LENGTHS["model_name"], rejected)
            if reading is not None else (),
            reading=reading,
            rejected=rejected,
            **values,
        )
        if rejected and not srv.rejecting:
            log.warning("vLLM server %s: impossible values refused: %s", base, "; ".join(f"{k} {v}" for k, v in rejected.items()))
        srv.rejecting = bool(rejected)
        srv.last = smp
        return smp

    def _engines(self, reading: MetricsReading, rejected: dict[str, str]) -> tuple[EngineSample, ...]:
        """Per-engine samples, each value through the door (an engine's impossible figure is
        ``None``; its reason names the engine)."""
        out = []
        for (model, engine), s in sorted(reading.series.items(), key=lambda kv_: (str(kv_[0][0]), str(kv_[0][1]))):
            if not s.gauges:
                continue
            labels: dict[str, str] = {}
            if (model is not None and self._text("model_name", model, ENGINE_KEY_LENGTHS["model_name"], labels) is None
                    or engine is not None and self._text("engine", engine, ENGINE_KEY_LENGTHS["engine"], labels) is None):
                for name, reason in labels.items():
                    rejected.setdefault(name, reason)
                continue  # a label no store can key a row by: that engine's row only is lost
            row = {"running": s.gauges.get("running"), "waiting": s.gauges.get("waiting"),
                   "kv_cache_usage_ratio": s.gauges.get("kv_cache_usage")}
            for name, reason in self.door.check_row(row, row).items():
                rejected.setdefault(name, f"{reason} (model {model}, engine {engine})")
            out.append(EngineSample(model_name=model, engine=engine, **row))
            if len(out) == ENGINE_SERIES_LIMIT:
                if len(reading.series) > ENGINE_SERIES_LIMIT:
                    self.door.rejected["engine"] += 1
                    rejected.setdefault("engine", f"rejected: {len(reading.series)} engine series; the first {ENGINE_SERIES_LIMIT} kept")
                break
        return tuple(out)

    def _text(self, name: str, raw: object, length: int | None, refused: dict[str, str]) -> str | None:
        return door_text(self.door, name, raw, length, refused)

    def _texts(self, name: str, raws: Sequence[object], length: int, refused: dict[str, str]) -> tuple[str, ...]:
        if len(raws) > ENGINE_SERIES_LIMIT:
            self.door.rejected[name] += 1
            refused.setdefault(name, f"rejected: {len(raws)} {name} labels; the first {ENGINE_SERIES_LIMIT} kept")
            raws = raws[:ENGINE_SERIES_LIMIT]
        return door_texts(self.door, name, raws, length, refused)

    async def _maybe_probe(self, srv: TrackedServer, watch: HangWatch, now: float, reading: MetricsReading | None) -> None:
        """Start the generation probe when it is due: the server reads idle with its counters flat
        for ``hang_after`` scrapes while clients hold connections open on its port (or an earlier
        probe said hung: a new one tells when it recovers). Discovered servers only: a static
        target's connections cannot be seen."""
        lc = srv.lifecycle
        suspect = lc.state is ServerState.IDLE and lc.flat_scrapes >= self.hang_after
        models = srv.models or (reading.model_names if reading is not None else ())
        if (self._session is None or not models or srv.identity.origin != "discovered"
                or not watch.probe_due(now, suspect=suspect)):
            return
        if lc.state is not ServerState.HUNG and not await self._offload(client_connections, srv.pids, srv.identity.port):
            return
        watch.start_probe(self._session, srv.identity.url, str(models[0]), now)

    @staticmethod
    def _engine_lost(srv: TrackedServer, healthy: bool) -> str | None:
        """Why the server's engine counts as lost: an engine process seen in its tree since
        ``/health`` first answered 200 is gone (or a zombie) while the API process lives. The
        process table is read at every poll, so the loss shows at the first poll after it."""
        p = srv.process
        if p is None:
            return None
        now = set(p.engine_pids)
        gone = [pid for pid in srv.engines_seen if pid not in now]
        if healthy or srv.engines_seen:
            srv.engines_seen.update(dict.fromkeys(p.engine_pids))
        if gone:
            return f"engine lost (pid {', '.join(map(str, gone))} gone)"
        return None

    def _sample(self, srv: TrackedServer, now: float, *, ended: bool = False, **values: Any) -> ServerSample:
        lc = srv.lifecycle
        act = srv.prewarm_activity
        label_models = values.pop("label_models", ())
        return ServerSample(
            instance=srv.identity,
            ts=now,
            state=lc.state,
            reason=lc.reason,
            version=srv.version,
            model_names=srv.models if srv.models is not None else label_models,
            first_connect_ts=lc.first_connect_ts,
            ready_ts=lc.ready_ts,
            prewarm_seconds=lc.prewarm_seconds,
            prewarm_gpu_active_ratio=act[0] if act else None,
            prewarm_gpu_activity_source=act[1] if act else None,
            ended=ended,
            **values,
        )


#: a figure older than this (three minute reads missed: a GPU lost, NVML wedged) is no longer served
_ENERGY_STALE_S = 180.0


def _not_listening(port: int) -> Reply:
    return Reply(error=f"not listening on port {port} yet (its own sockets say so; not asked)")


async def _ready(reply: Reply) -> Reply:
    return reply


def _energy_fields(e: EnergyPerToken | None, now: float) -> dict[str, Any]:
    """The sample's energy-per-token fields: the newest interval's, until it is stale."""
    if e is None or now - e.end > _ENERGY_STALE_S:
        return {"energy_per_token_joules": None, "energy_interval_joules": None, "energy_per_token_note": None}
    return {"energy_per_token_joules": e.joules_per_token, "energy_interval_joules": e.joules,
            "energy_per_token_note": e.note or None}


def _telemetry(reading: MetricsReading | None, stats: Mapping[str, Any]) -> str:
    """``"down"`` (no reading, no ``/stats``), ``"partial"`` (lines of ``/metrics`` dropped),
    ``"full"`` (``vllm:`` metrics or ``/stats``), else ``"limited"``."""
    if reading is None:
        return "full" if stats else "down"
    if reading.lines_dropped:
        return "partial"
    return "full" if reading.has_vllm or stats else "limited"

def _num(v: object) -> float | None:
    """A JSON number as a finite float; anything else (a bool, text, an integer too large for a
    float, Infinity or NaN, which Python's JSON parser accepts) is no value."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


#: JSON ``/stats`` field → canonical field. vLLM has no such endpoint; these are the names such
#: sidecars use (documented in docs/vllm.md). Ratios given in percent (> 1) are divided by 100.
STATS_FIELDS: dict[str, tuple[str, ...]] = {
    "running": ("num_requests_running", "running", "num_running", "running_requests"),
    "waiting": ("num_requests_waiting", "waiting", "num_waiting", "waiting_requests", "pending"),
    "kv_cache_usage": ("kv_cache_usage", "kv_cache_usage_perc", "gpu_cache_usage", "gpu_cache_usage_perc"),
    "block_size": ("block_size",),
    "num_gpu_blocks": ("num_gpu_blocks", "total_blocks", "num_total_gpu_blocks"),
    "free_blocks": ("num_free_gpu_blocks", "free_blocks", "free_gpu_blocks"),
}


def door_text(door: Door, name: str, raw: object, length: int | None, refused: dict[str, str]) -> str | None:
    """``raw`` if the door takes it as text (``Door.text``), else ``None`` with the reason in
    ``refused`` (the first of a poll kept)."""
    try:
        return door.text(name, raw, length)
    except Rejected as exc:
        refused.setdefault(name, exc.reason)
        return None


def door_texts(door: Door, name: str, raws: Sequence[object], length: int, refused: dict[str, str]) -> tuple[str, ...]:
    """The values of ``raws`` the door takes as text, in order (``door_text``)."""
    return tuple(t for r in raws if (t := door_text(door, name, r, length, refused)) is not None)


def version_answer(door: Door, doc: object, refused: dict[str, str]) -> str | None:
    """The version a ``/version`` document names (``{"version": "0.32.0"}``), through the door;
    ``None`` for a document of another shape or a refused text."""
    if not isinstance(doc, dict) or doc.get("version") is None:
        return None
    return door_text(door, "version", doc["version"], None, refused)


def models_answer(door: Door, doc: object, refused: dict[str, str]) -> tuple[str, ...] | None:
    """The served model names of a ``/v1/models`` document (``{"data": [{"id": …}, …]}``), each
    through the door; ``None`` (no answer: the ``model_name`` labels are used) for a document of
    another shape or when every name is refused."""
    if not isinstance(doc, dict) or not isinstance(data := doc.get("data"), list):
        return None
    ids = [d["id"] for d in data if isinstance(d, dict) and d.get("id") not in (None, "")]
    return door_texts(door, "model", ids, ENGINE_KEY_LENGTHS["model_name"], refused) or None


def load_answer(doc: object) -> float | None:
    """``server_load`` of a ``/load`` document, a finite number or ``None``."""
    return _num(doc.get("server_load")) if isinstance(doc, dict) else None


def sleeping_answer(doc: object) -> bool | None:
    """``is_sleeping`` of an ``/is_sleeping`` document when it is a boolean, else ``None``."""
    value = doc.get("is_sleeping") if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None


def stats_fields(doc: Any) -> dict[str, Any]:
    """Canonical fields of a JSON ``/stats`` document (see ``STATS_FIELDS``); empty when the
    document is absent or not an object."""
    if not isinstance(doc, dict):
        return {}
    out: dict[str, Any] = {}
    for canon, names in STATS_FIELDS.items():
        for n in names:
            v = _num(doc.get(n))
            if v is not None:
                out[canon] = v
                break
    if "kv_cache_usage" in out and out["kv_cache_usage"] > 1.0:
        out["kv_cache_usage"] /= 100.0
    for k in ("block_size", "num_gpu_blocks"):
        if k in out:
            out[k] = int(out[k])  # finite (_num)
    if "kv_cache_usage" not in out and out.get("num_gpu_blocks") and "free_blocks" in out and out["num_gpu_blocks"] > 1:
        out["kv_cache_usage"] = 1.0 - out["free_blocks"] / (out["num_gpu_blocks"] - 1)
    out.pop("free_blocks", None)
    return out
