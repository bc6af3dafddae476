"""The agent's read-only HTTP API, on the same aiohttp server as ``/metrics``: ``/api/v1/snapshot``
(the newest tick), ``/api/v1/alerts`` (what the rule engine holds) and ``/api/v1/diagnose`` (the
on-call report, built by ``vgpumon.diagnose`` from the agent's own store, with what only the live
agent knows: Kubernetes owners of the processes, its own freshness, and on request the stacks of
its vLLM servers). ``vgpumon diagnose HOST`` reads it. Decisions: docs/api.md.

Access: ``GET`` (and ``HEAD``) only. When the server listens off loopback, or whenever a token is
configured, every ``/api/v1`` request must carry ``Authorization: Bearer <token>``; the token is
compared in constant time (as SHA-256 digests, so its length does not leak either) and never
logged (the server keeps no access log, and no error repeats a header). ``/metrics`` and
``/healthz`` stay open for scrapers and probes. Every error under ``/api/`` is JSON:
``{"error": {"status": 401, "message": "…"}}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.diagnose.schema import Report
    from vgpumon.exporter.collector import MetricsExporter
    from vgpumon.exporter.view import AgentView
    from vgpumon.store import Store

log = logging.getLogger(__name__)

PREFIX = "/api/v1"
ENDPOINTS = {
    f"{PREFIX}/snapshot": "the newest tick: GPUs, their readings, the host, vLLM servers, sources",
    f"{PREFIX}/alerts": "alerts pending or firing as of the rule engine's newest evaluation",
    f"{PREFIX}/diagnose": "the on-call report (query: window, since, max_age, stacks=1)",
}


@dataclasses.dataclass(frozen=True)
class ApiConfig:
    """Settings of the API (``[api]`` and the parts of ``[diagnose]`` and ``[rules]`` it uses).

    Attributes:
        enabled: serve ``/api/v1`` at all.
        token: the bearer token; ``None`` when unset (then the API answers only on loopback).
        stacks: ``diagnose?stacks=1`` may run py-spy on the host's discovered vLLM processes.
        window_seconds: the report's default window (``[diagnose] window``).
        thresholds: the rules' ``Thresholds`` for the report (the agent's own).
        py_spy: the py-spy executable; ``None`` finds it (tests pass a stand-in).
    """

    enabled: bool = True
    token: str | None = None
    stacks: bool = False
    window_seconds: float = 900.0
    thresholds: Thresholds | None = None
    py_spy: str | None = None

    def __repr__(self) -> str:  # never print the token (a log line of the config, a traceback)
        return f"ApiConfig(enabled={self.enabled}, token={'***' if self.token else None}, stacks={self.stacks})"


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine (``127.0.0.0/8``, ``::1``,
    ``localhost``). Any other name or address, ``0.0.0.0`` and ``::`` included, is off loopback."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def plain(obj: object) -> object:
    """Model data (any value of ``vgpumon.model``: opaque here) as JSON-able values: dataclasses as dicts, enums as their values, mappings with
    string keys, tuples and sets as lists; a parsed scrape (``ServerSample.reading``) is left out;
    a non-finite float (never stored, but never served either) becomes ``None``."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: plain(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.name != "reading"}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, Mapping):
        return {str(k) if not isinstance(k, tuple) else ":".join(map(str, k)): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [plain(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> web.Response:
    """An API error: ``{"error": {"status": …, "message": …}}`` with that HTTP status."""
    return web.Response(status=status, text=json.dumps({"error": {"status": status, "message": message}}) + "\n",
                        content_type="application/json", headers=headers)


def _json(body: object) -> web.Response:  # JSON-able (``plain``); what is not becomes its str
    return web.Response(text=json.dumps(body, default=str) + "\n", content_type="application/json")


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


class AgentApi:
    """``/api/v1`` of one agent.

    Args:
        agent: the running agent (its newest snapshot, store, sources, rule runner).
        exporter: the agent's ``/metrics`` exporter (freshness as ``/healthz`` judges it).
        config: ``ApiConfig``.
        bound_host: the host part of the listen address: off loopback, a token is required.
        clock: wall clock for the report's "now" (``time.time``).
    """

    def __init__(self, agent: "AgentView", exporter: "MetricsExporter", config: ApiConfig, *, bound_host: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.agent = agent
        self.exporter = exporter
        self.config = config
        self.clock = clock
        self.token_required = config.token is not None or not is_loopback(bound_host)
        self._token = _digest(config.token) if config.token is not None else None
        if self.token_required and self._token is None:  # said once at start, not only to each caller
            log.warning("the API on %s is closed: this agent listens off loopback and has no API token "
                        "([api] token, VGPUMON_API_TOKEN); /metrics is served", bound_host)
        # one report at a time, off the event loop: a slow store never delays a tick or a scrape
        self._exec = ThreadPoolExecutor(1, thread_name_prefix="vgpumon-api")

    def install(self, app: web.Application) -> None:
        """Add the routes and the guard (token, methods, JSON errors) to ``app`` before it starts."""
        app.middlewares.append(self._guard)
        app.router.add_get(PREFIX, self._index)
        app.router.add_get(PREFIX + "/", self._index)
        app.router.add_get(f"{PREFIX}/snapshot", self._snapshot)
        app.router.add_get(f"{PREFIX}/alerts", self._alerts)
        app.router.add_get(f"{PREFIX}/diagnose", self._diagnose)

    def close(self) -> None:
        """Stop the report thread (a report under way finishes on its own)."""
        self._exec.shutdown(wait=False, cancel_futures=True)

    # -- guard ---------------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> tuple[int, str] | None:
        """``None`` when the request may pass, else its status and why not (the header's value
        never appears)."""
        if not self.token_required:
            return None
        if self._token is None:
            return 401, "this agent listens off loopback and has no API token set ([api] token, VGPUMON_API_TOKEN): the API is closed"
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return 401, "a bearer token is required (Authorization: Bearer …; diagnose reads VGPUMON_API_TOKEN or [api] token)"
        try:  # bytes that are not UTF-8 reach here as lone surrogates: no token is made of them
            digest = _digest(given.strip())
        except UnicodeEncodeError:
            return 400, "the Authorization header is not UTF-8 text"
        if not hmac.compare_digest(digest, self._token):
            return 401, "the bearer token is wrong"
        return None

    @web.middleware
    async def _guard(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        refused = self._authorized(request)
        if refused is not None:
            status, why = refused
            return json_error(status, why, {"WWW-Authenticate": 'Bearer realm="vgpumon"'} if status == 401 else None)
        if request.method not in ("GET", "HEAD"):
            return json_error(405, f"{request.method} is not allowed: the API is read-only (GET)", {"Allow": "GET, HEAD"})
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status == 404:
                return json_error(404, f"no such endpoint {request.path}; see {PREFIX}")
            return json_error(exc.status, exc.reason or "error")
        except Exception:  # noqa: BLE001 - a bug in one request must not reach the client as HTML
            log.exception("API request %s failed", request.path)
            return json_error(500, "internal error (the agent's log has the traceback)")

    # -- endpoints -------------------------------------------------------------------------------

    async def _index(self, _request: web.Request) -> web.Response:
        return _json({"hostname": self.agent.hostname, "endpoints": ENDPOINTS})

    async def _snapshot(self, _request: web.Request) -> web.Response:
        snap = self.agent.latest
        if snap is None:
            return json_error(503, "no tick yet: the agent is starting")
        return _json({
            "hostname": snap.hostname,
            "ts": snap.ts,
            "age_seconds": self.exporter.age(),
            "fresh": self.exporter.fresh(),
            "gpus": [{"identity": plain(g), "sample": plain(s)} for g, s in zip(snap.gpus, snap.samples)],
            "xid_events": plain(snap.xid_events),
            "host": plain(snap.host),
            "kubernetes": plain(snap.kubernetes),
            "events": plain(snap.events),
            "sources": plain(snap.sources),
            "vllm": [plain(s) for s in (snap.vllm.samples if snap.vllm is not None else ())],
        })

    async def _alerts(self, _request: web.Request) -> web.Response:
        rules = getattr(self.agent, "rules", None)
        if rules is None:
            return _json({"hostname": self.agent.hostname, "evaluated_at": None, "alerts": [],
                          "note": "this agent evaluates no rules (--no-rules); diagnose evaluates them itself"})
        return _json({"hostname": self.agent.hostname, "evaluated_at": rules.evaluated_at, "alerts": rules.open_alerts()})

    async def _diagnose(self, request: web.Request) -> web.Response:
        from vgpumon.base.durations import parse_duration
        from vgpumon.diagnose import parse_since

        q = request.query
        try:
            window = parse_duration(q["window"]) if q.get("window") else self.config.window_seconds
            max_age = parse_duration(q["max_age"]) if q.get("max_age") else None
            lookback, since = parse_since(q["since"]) if q.get("since") else (None, None)
        except ValueError as exc:
            return json_error(400, f"bad query: {exc}")
        stacks = q.get("stacks", "") in ("1", "true", "yes")
        agent_store = self.agent.store
        if agent_store is None:
            return json_error(503, "this agent has no store to report from")
        loop = asyncio.get_running_loop()
        report = await loop.run_in_executor(self._exec, self._report, agent_store, window, max_age, lookback, since)
        self._add_live(report)
        if stacks:
            await loop.run_in_executor(self._exec, self._add_stacks, report)
        return _json(report)

    # -- the report ------------------------------------------------------------------------------

    def _report(self, agent_store: Store, window: float, max_age: float | None, lookback: float | None, since: float | None) -> Report:
        from vgpumon.diagnose import build_report
        from vgpumon.store import Store

        store = Store(engine=agent_store.engine)  # the agent's pool; this thread only reads
        return build_report(store, self.agent.hostname, window_seconds=window, now=self.clock(), max_age_seconds=max_age,
                            local_hostname=self.agent.hostname, thresholds=self.config.thresholds, since=since,
                            lookback_seconds=lookback)

    def _add_live(self, report: Report) -> None:
        """What only the running agent knows: Kubernetes owners of the processes (not stored),
        and how old its newest tick is on its own clock."""
        snap = self.agent.latest
        fresh = report.get("freshness")
        if fresh is not None:
            fresh["agent"] = {"last_tick_age_seconds": self.exporter.age(), "fresh": self.exporter.fresh()}
        k8s = snap.kubernetes if snap is not None else None
        if k8s is None:
            return
        uuid_of = {g["index"]: g["uuid"] for g in report.get("gpus", [])}
        for p in report.get("processes", []):
            owner = k8s.processes.get((uuid_of.get(p["gpu"], ""), p["pid"]))
            if owner is not None:
                p["pod"] = str(owner.owner) if owner.owner is not None else None
                p["pod_note"] = owner.reason

    def _add_stacks(self, report: Report) -> None:
        """py-spy dumps of the discovered vLLM processes, under their servers (when allowed)."""
        if not self.config.stacks:
            report["stacks_note"] = "this agent's config does not allow stacks ([api] stacks = false)"
            return
        from vgpumon.diagnose.stacks import dump

        snap = self.agent.latest  # the processes the newest tick saw listening where they say
        found = snap.vllm.processes if snap is not None and snap.vllm is not None else {}
        for server in report.get("vllm", []):
            proc = found.get(server["url"])
            if proc is None:
                server["stacks_note"] = "not a process this agent discovered (a static URL, or gone): no stacks"
                continue
            server["stacks"] = [{**dump(proc.pid, py_spy=self.config.py_spy), "role": "api server"}]
            server["stacks"] += [{**dump(pid, py_spy=self.config.py_spy), "role": "engine"} for pid in proc.engine_pids]
        if not report.get("vllm"):
            report["stacks_note"] = "no vLLM server in the report: nothing to dump"
