"""The agent's HTTP server (aiohttp, on the agent's event loop): ``/metrics``, ``/healthz`` and the
read-only API ``/api/v1/…`` (``vgpumon.exporter.api``).

``/metrics`` and ``/healthz`` need no token: both are read-only and hold no secrets. The server
binds to loopback unless ``--listen`` says otherwise; off loopback the API asks for a bearer
token (docs/api.md).

``/metrics`` is rendered on the event loop from memory (about a millisecond for 8 GPUs and 8 vLLM
servers, docs/benchmarks.md), as client_python's own aiohttp handler does; it never waits for
NVML. The text format 0.0.4 is served whatever the ``Accept`` header asks, like client_golang's
default (OpenMetrics off): nothing here needs OpenMetrics (no exemplars, no ``_created``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator, cast

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from vgpumon.alerts.feed import RulesFeed
from vgpumon.base.listen import ExporterConfig
from vgpumon.exporter.collector import MetricsExporter
from vgpumon.exporter.selection import read_selection
from vgpumon.exporter.text import CONTENT_TYPE

if TYPE_CHECKING:
    from vgpumon.exporter.api import ApiConfig
    from vgpumon.exporter.view import AgentView

log = logging.getLogger(__name__)

#: What a request aiohttp's parser refuses is answered with: the parser's own text would repeat
#: the offending line (an ``Authorization`` header's token in clear), and it logged that line
#: with a traceback per request.
_PARSER_REFUSALS = {
    400: "malformed HTTP request: a header with a control character, a NUL or bytes that are not text",
    413: "request too large",
    431: "request headers too large",
}


#: The private parts of aiohttp's connection handler the door works through (aiohttp 3.10-3.14):
#: an aiohttp without them serves without the door's deadline and cap, and says so at start.
_DOOR_HOOKS = {"_next_keepalive_close_time", "_keepalive_handle", "_request_in_progress", "_force_close"} <= set(
    getattr(RequestHandler, "__slots__", ())) and hasattr(RequestHandler, "_process_keepalive")


def _too_large(exc: BaseException | None) -> bool:
    from aiohttp.http_exceptions import LineTooLong

    text = str(exc or "")
    return isinstance(exc, LineTooLong) or "Too many headers" in text or "too long" in text.lower()


def _refusal(status: int, exc: BaseException | None) -> str:
    """What a refused request is told (and the log says): never the request's own bytes."""
    from aiohttp.http_exceptions import BadHttpMethod, BadStatusLine, InvalidHeader

    if status != 400:
        return _PARSER_REFUSALS.get(status, "bad request")
    if isinstance(exc, (BadStatusLine, BadHttpMethod)):
        return "malformed HTTP request: a request line that is not METHOD PATH HTTP/1.x"
    if isinstance(exc, InvalidHeader):
        return _PARSER_REFUSALS[400]
    return "malformed HTTP request"


class _Throttle:
    """At most one log line per ``every`` seconds; the lines not written are counted."""

    def __init__(self, every: float = 1.0) -> None:
        self.every, self._last, self._held = every, float("-inf"), 0

    def said(self) -> int | None:
        """``None``: stay silent (counted); else log now, with this many held back before."""
        import time

        now = time.monotonic()
        if now - self._last < self.every:
            self._held += 1
            return None
        self._last, held, self._held = now, self._held, 0
        return held



class _JsonErrors(RequestHandler):
    """aiohttp's connection handler, answering what its parser refuses (and a failure outside
    every handler) in the API's JSON (``{"error": {"status": …, "message": …}}``), logged in one
    line that names the peer and the status only: never the request's bytes, whose headers may
    hold a token.

    It also holds the door's deadlines (docs/security.md, "The HTTP door"): aiohttp closes a
    connection that waits for a request past its keep-alive close time, which it sets at accept
    and after each answer and which no byte received moves. That time is brought forward here to
    ``header_timeout`` after the accept, and after a later request's first byte, so that headers
    dribbled a byte at a time hold a connection no longer than that.
    """

    def __init__(self, manager: web.Server, *, door: "_Door | None", **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._door = door
        self._answered = 0  # requests answered on this connection
        self._begun = False  # bytes received since the last answer (a request under way)

    # -- the door ----------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._door is None:
            super().connection_made(transport)
            return
        if not self._door.admit(self._manager):
            self._manager = None  # never registered: connection_lost has nothing to undo
            self._door.count("limit")
            cast(asyncio.Transport, transport).abort()  # at once: no FIN handshake to wait on
            return
        super().connection_made(transport)
        self._deadline(self._loop.time() + self._door.header_timeout)

    def data_received(self, data: bytes) -> None:
        if self._door is not None and not self._request_in_progress and not self._begun and self._answered:
            # the first byte of a later request: its headers have header_timeout from now
            self._deadline(self._loop.time() + self._door.header_timeout)
        self._begun = True
        super().data_received(data)

    def _deadline(self, when: float) -> None:
        """Close this connection at ``when`` unless a request is being answered by then."""
        if when >= self._next_keepalive_close_time and self._keepalive_handle is not None:
            return
        self._next_keepalive_close_time = when
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
        self._keepalive_handle = self._loop.call_at(when, self._process_keepalive)

    def _process_keepalive(self) -> None:
        was_closed = self._force_close
        super()._process_keepalive()
        if self._door is not None and self._force_close and not was_closed:
            self._door.count("idle" if self._answered and not self._begun else "header_deadline")

    def held(self) -> bool:
        """True until this side closes the connection."""
        return not self._force_close

    def waiting(self) -> bool:
        """True while no request is being answered: the connection may be closed to make room."""
        return not self._request_in_progress and not self._force_close

    async def finish_response(self, request: web.BaseRequest, resp: web.StreamResponse,
                              start_time: float | None) -> tuple[web.StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            self._answered += 1
            self._begun = False

    # -- parser refusals ---------------------------------------------------------------------------

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status == 400 and _too_large(exc):
            status = 431  # aiohttp says 400 for a line, a field or a header count past its bounds
        if status >= 500:
            log.error("HTTP request from %s failed (%s)", request.remote, type(exc).__name__ if exc else "error")
            text = "internal error"
        else:
            text = _refusal(status, exc)
            # one line a second at most: a client sending thousands of bad requests does not fill the log
            throttle = getattr(self._manager, "refusals", None) or _Throttle()
            if (said := throttle.said()) is not None:
                log.warning("HTTP request from %s refused (%d): %s%s", request.remote, status, text,
                            f" ({said} more refused since the last line)" if said else "")
        if request.writer.output_size > 0:  # part of an answer sent already: aiohttp's own handling
            raise ConnectionError("the answer was under way when the request failed")
        resp = web.Response(status=status, text=json.dumps({"error": {"status": status, "message": text}}) + "\n",
                            content_type="application/json")
        resp.force_close()
        return resp


class _Door:
    """The server's limits on connections (``ExporterConfig``) and what they closed, counted in
    ``closed`` (``vgpumon_agent_http_connections_closed_total{reason}``).

    aiohttp has no cap on connections (nor asyncio's ``create_server``): ``admit`` is ours. At the
    cap, the oldest connection that waits for a request (dribbling its headers, or idle between
    scrapes) is closed to make room, so that a client holding every slot cannot keep a scrape
    out; only when every connection is being answered is the new one closed at once.
    """

    def __init__(self, config: ExporterConfig, closed: dict[str, int]) -> None:
        self.header_timeout = config.header_timeout
        self.max_connections = config.max_connections
        self.closed = closed

    def count(self, reason: str) -> None:
        self.closed[reason] = self.closed.get(reason, 0) + 1

    def admit(self, manager: web.Server | None) -> bool:
        if manager is None:
            return False
        # oldest first (a dict's order); one closed here stays listed until its transport reports it
        held = [c for c in manager.connections if not isinstance(c, _JsonErrors) or c.held()]
        if len(held) < self.max_connections:
            return True
        for conn in held:
            if isinstance(conn, _JsonErrors) and conn.waiting():
                self.count("limit")
                conn.force_close()  # leaves ``connections`` when its transport reports the close
                return True
        return False


class _Server(web.Server):
    door: _Door | None
    refusals: _Throttle

    def __call__(self) -> RequestHandler:
        return _JsonErrors(self, loop=self._loop, door=self.door, **self._kwargs)


class _Runner(web.AppRunner):
    """``web.AppRunner`` whose connections are ``_JsonErrors`` (aiohttp takes no handler class)."""

    def __init__(self, app: web.Application, door: _Door | None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._door = door

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same object, its connections made by ``_Server.__call__``
        server.door = self._door  # type: ignore[attr-defined]
        server.refusals = _Throttle()  # type: ignore[attr-defined]  # one per server: its log lines
        return server


def build_app(exporter: MetricsExporter) -> web.Application:
    """The application serving ``exporter``: ``/metrics``, ``/healthz`` and ``/`` (a link page)."""

    async def metrics(_request: web.Request) -> web.Response:
        return web.Response(body=exporter.render(), headers={"Content-Type": CONTENT_TYPE})

    async def healthz(_request: web.Request) -> web.Response:
        # 200 while ticks arrive; 503 before the first tick and when the newest is too old (a
        # wedged NVML thread): a readiness probe, since a stalled sampler needs a person, not
        # a restart loop that hides it.
        age = exporter.age()
        ok = exporter.fresh()
        body = {
            "status": "ok" if ok else ("starting" if age is None else "stale"),
            "last_tick_age_seconds": None if age is None else round(age, 3),
            "stale_after_seconds": exporter.config.stale_after_intervals * exporter.interval,
        }
        return web.Response(status=200 if ok else 503, text=json.dumps(body) + "\n", content_type="application/json")

    async def index(_request: web.Request) -> web.Response:
        return web.Response(
            text="<html><head><title>vgpumon agent</title></head><body><h1>vgpumon agent</h1>"
            '<p><a href="metrics">/metrics</a> · <a href="healthz">/healthz</a> · <a href="api/v1">/api/v1</a></p></body></html>\n',
            content_type="text/html",
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", index)
    return app


class MetricsServer:
    """``/metrics`` and ``/healthz`` on ``host:port``, started and stopped around ``Agent.run``.

    Args:
        exporter: what ``/metrics`` renders.
        host, port: where to listen (``ExporterConfig.address``); port 0 picks a free one
            (``port`` then holds it after ``start``).
    """

    def __init__(self, exporter: MetricsExporter, host: str, port: int) -> None:
        self.exporter = exporter
        self.host = host
        self.port = port
        self.app = build_app(exporter)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listen.

        Raises:
            OSError: the address cannot be bound (in use, not local, no permission).
        """
        config = self.exporter.config
        door = _Door(config, self.exporter.http_closed) if _DOOR_HOOKS else None
        if door is None:
            import aiohttp

            log.warning("aiohttp %s lacks the connection hooks the HTTP door uses: no header deadline and no connection cap "
                        "(docs/security.md, \"The HTTP door\")", aiohttp.__version__)
        # aiohttp's own limits: the keep-alive timeout (its close time, brought forward by the
        # door), a body drained after the answer for at most header_timeout (the API reads none),
        # its parser's bounds on the request line and headers (431 past them)
        runner = _Runner(self.app, door, handle_signals=False, access_log=None, shutdown_timeout=1.0,
                         keepalive_timeout=config.keepalive_timeout, lingering_time=config.header_timeout,
                         max_line_size=8190, max_field_size=8190, max_headers=128)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        sockets = getattr(site._server, "sockets", None) or ()  # noqa: SLF001 - aiohttp has no public accessor
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("serving /metrics on %s/metrics", self.url)

    async def stop(self) -> None:
        """Stop listening (open scrapes get ``shutdown_timeout`` to finish)."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


@contextlib.asynccontextmanager
async def serving(
    agent: "AgentView", config: ExporterConfig, *, rules: RulesFeed | None = None, api: "ApiConfig | None" = None
) -> AsyncIterator[MetricsServer | None]:
    """Serve ``/metrics`` for ``agent`` while the block runs (``vgpumon agent`` wraps
    ``agent.run`` in it); yields the server, or ``None`` when serving is off or failed.

    With ``api`` (enabled), the same server also answers ``/api/v1/…`` (``vgpumon.exporter.api``),
    behind a bearer token when it listens off loopback.

    The exporter observes the agent's ticks even when the address cannot be bound: sampling into
    the store is the agent's first job, so a port in use costs ``/metrics`` (one error line),
    never the samples.

    Raises:
        ListenError: ``config.listen`` is malformed.
        SelectionError: ``config.metrics_file`` cannot be read or names an unknown family.
    """
    address = config.address
    selection = read_selection(config.metrics_file) if config.metrics_file is not None else None
    exporter = MetricsExporter.for_agent(agent, config, selection=selection, rules=rules)
    server = None
    agent_api = None
    if address is not None:
        candidate = MetricsServer(exporter, *address)
        if api is not None and api.enabled:
            from vgpumon.exporter.api import AgentApi

            agent_api = AgentApi(agent, exporter, api, bound_host=address[0])
            agent_api.install(candidate.app)
        try:
            await candidate.start()
            server = candidate
        except OSError as exc:
            log.error("cannot serve /metrics on %s:%d (%s); sampling goes on without it", address[0], address[1], exc)
    try:
        yield server
    finally:
        if server is not None:
            await server.stop()
        if agent_api is not None:
            agent_api.close()
