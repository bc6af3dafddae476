"""A real agent with its HTTP server, for the API and ``diagnose HOST`` tests: it replays a capture
into a store through the agent (rules on, as ``vgpumon agent`` runs them), then keeps serving
``/metrics`` and ``/api/v1`` from its own event loop on a thread until the test is done."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from typing import Any

from vgpumon.agent import Agent
from vgpumon.alerts.runner import RuleRunner
from vgpumon.exporter import ExporterConfig
from vgpumon.exporter.api import ApiConfig
from vgpumon.exporter.server import serving
from vgpumon.rules.engine import Engine
from vgpumon.sources.nvml import NvmlSource
from vgpumon.store import open_store
from vgpumon.testing.vllm import free_port


class ServingAgent:
    """``with ServingAgent(url, backend, listen="127.0.0.1:0", api=ApiConfig(...)) as a:`` — the
    replay is stored and the server answers at ``a.base`` (``http://host:port``) inside the block.

    Args:
        url: the store.
        backend: the NVML backend to replay (a ``ReplayBackend`` or ``scenarios.backend``).
        listen: the exporter's listen address (port 0: a free one).
        api: the API's settings.
        hostname: the host's name in the store.
        exporter: more ``ExporterConfig`` settings (the HTTP door's limits).
        agent_kw: more ``Agent`` arguments (``vllm=…``, ``sysfs_root=…``).
    """

    def __init__(self, url: str, backend: Any, *, listen: str = "127.0.0.1:0", api: ApiConfig | None = None,
                 hostname: str = "h200-agent", exporter: dict[str, Any] | None = None, **agent_kw: Any) -> None:
        if listen.endswith(":0"):  # --listen takes ports 1-65535: pick a free one
            listen = f"{listen[:-2]}:{free_port()}"
        self.url, self.backend, self.listen, self.api = url, backend, listen, api or ApiConfig()
        self.hostname, self.agent_kw, self.exporter = hostname, agent_kw, exporter or {}
        self.port: int | None = None
        self.agent: Agent | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="serving-agent", daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> "ServingAgent":
        self._thread.start()
        if not self._ready.wait(120):
            raise TimeoutError("the agent did not finish its replay in 120 s")
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        store = open_store(self.url)
        rules = RuleRunner(Engine(self.api.thresholds), sinks=[], wall=None)
        self.agent = Agent(NvmlSource(self.backend), store, hostname=self.hostname, rules=rules, **{"paced": False, **self.agent_kw})
        try:
            async with serving(self.agent, ExporterConfig(listen=self.listen, **self.exporter), rules=rules, api=self.api) as server:
                assert server is not None, "the test server could not listen"
                self.port = server.port
                await self.agent.run()
                self._ready.set()
                await self._stop.wait()
        finally:
            store.close()


def get(url: str, token: str | None = None, method: str = "GET") -> tuple[int, dict[str, str], Any]:
    """One request: ``(status, headers, body)``; the body parsed as JSON when it is JSON."""
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"} if token else {})  # noqa: S310  the tests' own loopback URL
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=30) as answer:
            status, headers, body = answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        status, headers, body = exc.code, dict(exc.headers), exc.read()
    try:
        return status, headers, json.loads(body)
    except ValueError:
        return status, headers, body.decode(errors="replace")
