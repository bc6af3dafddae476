"""A scriptable fake vLLM server (real aiohttp, real sockets on 127.0.0.1) and a fake process
table, for tests and demos of the vLLM source.

The server serves what it is told — normally a recorded real ``/metrics`` capture — and can be
made to refuse connections (``stop``), answer ``/health`` 503, hang on a path, or send an
oversized or garbage body. Nothing about vLLM is invented here: bodies come from captures.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from vgpumon.sources.nvml.shapes import JsonValue
from vgpumon.sources.vllm.discovery import ProcessUsage, VllmProcess


def with_adapters(body: str, target_bytes: int, model: str = "tiny") -> bytes:
    """A recorded scrape grown to ``target_bytes``: its ``vllm:`` samples of ``model`` repeated
    under ``model_name="lora-1"``, ``"lora-2"``, … (each LoRA adapter gets its own series, as on
    a server with many adapters), for the size and memory limits of the scraper."""
    lines = [ln for ln in body.splitlines() if ln.startswith("vllm:") and f'model_name="{model}"' in ln]
    out = [body if body.endswith("\n") else body + "\n"]
    size = len(out[0])
    k = 0
    while size < target_bytes and lines:
        k += 1
        block = "\n".join(ln.replace(f'model_name="{model}"', f'model_name="lora-{k}"') for ln in lines) + "\n"
        out.append(block)
        size += len(block)
    return "".join(out).encode()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeVllmServer:
    """A fake vLLM HTTP server.

    Attributes (change them between polls):
        metrics: ``/metrics`` body (text or bytes).
        metrics_status: HTTP status of ``/metrics``.
        metrics_content_type: its Content-Type.
        metrics_chunked: send ``/metrics`` without Content-Length (chunked), so only reading
            the body can tell its size.
        health_status: HTTP status of ``/health``.
        version: ``/version`` answer (``{"version": ...}``); ``None`` → 404.
        models: ``/v1/models`` ids; ``None`` → 404.
        load: ``/load`` ``server_load``; ``None`` → 404.
        is_sleeping: ``/is_sleeping`` answer; ``None`` → 404 (not in dev mode).
        stats: a JSON ``/stats`` document; ``None`` → 404 (vLLM has none).
        hang: paths that never answer (the request waits until the server stops).
        raw: paths answered 200 with exactly these bytes (JSON of any shape, or none), before
            anything above.
        requests: paths requested, in order.
        completions: the ``X-Request-Id`` of each ``POST /v1/completions`` (the generation
            probe), in order; each is answered with one token unless the path is in ``hang``.
        completions_status: HTTP status of ``POST /v1/completions`` (401: an API key is required).
    """

    metrics: str | bytes = ""
    metrics_status: int = 200
    metrics_content_type: str = "text/plain; version=0.0.4; charset=utf-8"
    metrics_chunked: bool = False
    health_status: int = 200
    version: str | None = None
    models: Sequence[str] | None = None
    load: float | None = None
    is_sleeping: bool | None = None
    stats: dict[str, JsonValue] | None = None
    hang: set[str] = field(default_factory=set)
    raw: dict[str, bytes] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    completions: list[str] = field(default_factory=list)
    completions_status: int = 200
    port: int = 0

    def __post_init__(self) -> None:
        self._runner: web.AppRunner | None = None
        self._release = asyncio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self, port: int | None = None) -> "FakeVllmServer":
        """Listen on ``port`` (default: the previous port, else a free one)."""
        app = web.Application()
        app.router.add_get("/{path:.*}", self._handle)
        app.router.add_post("/v1/completions", self._complete)
        self._release = asyncio.Event()
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port if port is not None else self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        """Stop listening: connections are refused from now on."""
        self._release.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _json(self, value: JsonValue) -> web.Response:
        if value is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.json_response(value)

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        self.requests.append("/v1/completions")
        self.completions.append(request.headers.get("X-Request-Id", ""))
        if "/v1/completions" in self.hang:
            await self._release.wait()
            return web.Response(status=503)
        if self.completions_status != 200:
            return web.json_response({"error": "refused"}, status=self.completions_status)
        doc = await request.json()
        return web.json_response({"object": "text_completion", "model": doc.get("model"),
                                  "choices": [{"index": 0, "text": " pong", "finish_reason": "length"}]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = "/" + request.match_info["path"]
        self.requests.append(path)
        if path in self.hang:
            await self._release.wait()
            return web.Response(status=503)
        if path in self.raw:
            return web.Response(body=self.raw[path], content_type="application/json")
        if path == "/health":
            return web.Response(status=self.health_status)
        if path == "/metrics":
            body = self.metrics.encode() if isinstance(self.metrics, str) else self.metrics
            if self.metrics_chunked:
                resp = web.StreamResponse(status=self.metrics_status, headers={"Content-Type": self.metrics_content_type})
                resp.enable_chunked_encoding()
                await resp.prepare(request)
                step = 1 << 20
                try:
                    for i in range(0, len(body), step):
                        await resp.write(body[i : i + step])
                    await resp.write_eof()
                except (ConnectionError, RuntimeError):
                    pass  # the client stopped reading (size limit): expected
                return resp
            return web.Response(body=body, status=self.metrics_status, headers={"Content-Type": self.metrics_content_type})
        if path == "/version":
            return await self._json(None if self.version is None else {"version": self.version})
        if path == "/v1/models":
            return await self._json(
                None if self.models is None else {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
            )
        if path == "/load":
            return await self._json(None if self.load is None else {"server_load": self.load})
        if path == "/is_sleeping":
            return await self._json(None if self.is_sleeping is None else {"is_sleeping": self.is_sleeping})
        if path == "/stats":
            return await self._json(self.stats)
        return web.json_response({"detail": "Not Found"}, status=404)


class FakeProcessTable:
    """A process table holding the servers a test puts in it (``processes``); ``usage`` reports
    nothing (RSS/CPU unknown)."""

    def __init__(self, processes: Sequence[VllmProcess] = ()) -> None:
        self.processes: list[VllmProcess] = list(processes)

    def scan(self) -> list[VllmProcess]:
        return list(self.processes)

    def usage(self, pids: Sequence[int]) -> ProcessUsage | None:
        return None


class FakeClock:
    """An epoch clock that moves only when told (``advance``)."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now
