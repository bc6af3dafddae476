"""``vgpumon agent --otlp URL``: the GPU fields pushed over OTLP/HTTP, as an OpenTelemetry
collector receives them — a local receiver that decodes the protobuf with opentelemetry-proto,
fed by a real agent process replaying the recorded H200 capture."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from conftest import H200_CAPTURE
from sqlalchemy import text
from vllm_support import shared_dir, source

from vgpumon.store.engine import make_engine
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer, free_port

pytest.importorskip("opentelemetry.proto.collector.metrics.v1.metrics_service_pb2")
pytestmark = pytest.mark.slow  # starts an agent process: not in the quick subset

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (  # noqa: E402
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

ROOT = Path(__file__).resolve().parents[2]


class Receiver:
    """An OTLP/HTTP metrics endpoint on its own thread: every request decoded and kept."""

    def __init__(self) -> None:
        self.requests: list[ExportMetricsServiceRequest] = []
        self.content_types: list[str] = []
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def handle(request: web.Request) -> web.Response:
            msg = ExportMetricsServiceRequest()
            msg.ParseFromString(await request.read())
            self.requests.append(msg)
            self.content_types.append(request.headers.get("Content-Type", ""))
            return web.Response(body=ExportMetricsServiceResponse().SerializeToString(), content_type="application/x-protobuf")

        async def start() -> None:
            app = web.Application()
            app.router.add_post("/v1/metrics", handle)
            self.runner = web.AppRunner(app)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
            ready.set()

        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(start(), self.loop)
        assert ready.wait(10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)

    def points(self) -> dict[str, list[tuple[dict[str, Any], float, Any]]]:
        """metric name → (attributes, value, the metric) of every point received."""
        out: dict[str, list[tuple[dict[str, Any], float, Any]]] = {}
        for req in self.requests:
            for rm in req.resource_metrics:
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        data = m.gauge if m.HasField("gauge") else m.sum
                        for p in data.data_points:
                            attrs = {a.key: getattr(a.value, a.value.WhichOneof("value") or "string_value") for a in p.attributes}
                            value = p.as_double if p.HasField("as_double") else p.as_int
                            out.setdefault(m.name, []).append((attrs, value, m))
        return out

    def resource(self) -> dict[str, str]:
        rm = self.requests[-1].resource_metrics[0]
        return {a.key: a.value.string_value for a in rm.resource.attributes}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _agent(tmp_path: Path, otlp: str, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vgpumon", "agent", "--replay", str(H200_CAPTURE), "--db", f"sqlite:///{tmp_path / 'v.db'}",
         "--spool", str(tmp_path / "spool"), "--listen", "off", "--no-vllm", "--hostname", "otlp-host", "--otlp", otlp, *more],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )


def test_the_agent_pushes_its_gpu_fields_under_the_hardware_conventions(tmp_path, receiver):
    run = _agent(tmp_path, f"http://127.0.0.1:{receiver.port}")
    assert run.returncode == 0, run.stderr
    assert receiver.requests, "nothing was pushed"
    assert all(ct == "application/x-protobuf" for ct in receiver.content_types)
    assert receiver.resource()["host.name"] == "otlp-host" and receiver.resource()["service.name"] == "vgpumon"
    points = receiver.points()

    engine = make_engine(f"sqlite:///{tmp_path / 'v.db'}")
    with engine.connect() as conn:
        uuid = conn.scalar(text("SELECT uuid FROM gpus"))
        rows = conn.execute(text("SELECT ts, memory_used_bytes, memory_total_bytes, pcie_tx_bytes_per_second, "
                                 "pcie_rx_bytes_per_second FROM gpu_samples ORDER BY ts")).all()
    engine.dispose()
    last = rows[-1]

    def newest(name: str, **attrs: str) -> float:
        (value,) = [v for a, v, _ in points[name][-1:] if all(a.get(k) == x for k, x in attrs.items())] or [None]
        assert value is not None, f"{name}{attrs}: no point in {points.get(name)}"
        return float(value)

    # identity on every point: the GPU's UUID as hw.id, hw.type gpu
    for name, pts in points.items():
        for attrs, _, _ in pts:
            assert attrs["hw.id"] == uuid and attrs["hw.type"] == "gpu", (name, attrs)
    assert newest("hw.gpu.memory.usage") == last[1]  # bytes, as stored (the store keeps whole bytes)
    assert newest("hw.gpu.memory.limit") == last[2]
    (_, _, usage_metric) = points["hw.gpu.memory.usage"][-1]
    assert usage_metric.unit == "By" and usage_metric.HasField("sum") and not usage_metric.sum.is_monotonic
    util = [a for a, _, _ in points["hw.gpu.utilization"]]
    assert util and all(a["hw.gpu.task"] == "general" for a in util)
    assert {"hw.power", "hw.energy", "vgpumon.gpu.sm_active", "vgpumon.gpu.temperature"} <= set(points)
    assert points["vgpumon.gpu.temperature"][-1][2].unit == "Cel"

    # hw.gpu.io: bytes, cumulative and monotonic, the integral of the stored 1-s throughput
    io = [p for p in points["hw.gpu.io"] if p[0]["network.io.direction"] == "receive"]
    metric = io[-1][2]
    assert metric.unit == "By" and metric.sum.is_monotonic and metric.sum.aggregation_temporality == 2  # cumulative
    expected = sum(b[4] * (b[0] - a[0]) / 1000 for a, b in zip(rows, rows[1:]) if b[4] is not None and 0 < b[0] - a[0] <= 3000)
    assert expected > 0 and io[-1][1] == pytest.approx(expected, rel=0.01)


def test_a_bad_otlp_url_is_one_line_and_a_collector_that_is_away_loses_no_tick(tmp_path):
    bad = _agent(tmp_path, "otel-collector:4318")  # no scheme
    assert bad.returncode == 64 and "otlp" in bad.stderr.lower() and "Traceback" not in bad.stderr
    away = _agent(tmp_path, f"http://127.0.0.1:{free_port()}", "--otlp-interval", "1s")  # nothing listens there
    assert away.returncode == 0, away.stderr
    assert "Traceback" not in away.stderr
    engine = make_engine(f"sqlite:///{tmp_path / 'v.db'}")
    with engine.connect() as conn:
        assert conn.scalar(text("SELECT count(*) FROM gpu_samples")) > 0
    engine.dispose()


def _server_samples() -> list:
    """The vLLM source's samples of a fake server serving the recorded vLLM 0.32 idle, then busy
    scrape (two polls 10 s apart: rates and SLO figures over the interval)."""
    real = shared_dir("fixtures", "vllm-real")

    async def go():
        clock = FakeClock()
        srv = FakeVllmServer(port=free_port(), version="0.32.0", models=["tiny"], metrics=(real / "vllm-0.32.0-cpu__idle.txt").read_text())
        await srv.start(srv.port)
        src = source(clock, static_urls=[srv.url], processes=FakeProcessTable([]))
        try:
            first = await src.poll()
            clock.advance(10)
            srv.metrics = (real / "vllm-0.32.0-cpu__busy.txt").read_text()
            return first + await src.poll()
        finally:
            await src.close()
            await srv.stop()

    return asyncio.run(go())


def test_the_host_and_each_vllm_servers_fields_are_pushed_too(receiver):
    """Not only the GPUs: the host sample of this machine (psutil) and the vLLM server's newest
    poll, pushed by the pusher the agent runs, as the local receiver decodes them."""
    from vgpumon.exporter.otlp import OtlpPusher
    from vgpumon.model import Snapshot, VllmServers
    from vgpumon.sources.host import HostSource

    *_, busy = _server_samples()
    host = HostSource().sample(busy.ts)
    pusher = OtlpPusher(f"http://127.0.0.1:{receiver.port}", "otlp-host", interval=3600.0)
    pusher.observe(Snapshot(ts=busy.ts, hostname="otlp-host", gpus=(), samples=(), host=host,
                            vllm=VllmServers(samples=(busy,), interval=2.0, read_at=busy.ts)))
    pusher.shutdown()  # the last push
    points = receiver.points()
    assert receiver.resource()["host.name"] == "otlp-host"

    (mem,) = points["vgpumon.host.memory_used"]
    assert mem[1] == host.memory_used_bytes and mem[2].unit == "By" and mem[0] == {}
    assert points["vgpumon.host.memory_total"][0][1] == host.memory_total_bytes
    assert points["vgpumon.host.load1"][0][1] == pytest.approx(host.load1)

    def server(name: str):
        (point,) = points[name]
        attrs, value, metric = point
        assert attrs == {"server.address": "127.0.0.1", "server.port": busy.instance.port, "url.full": busy.instance.url,
                         "vgpumon.vllm.model": "tiny"}, attrs
        return value, metric

    assert server("vgpumon.vllm.running")[0] == busy.running
    assert server("vgpumon.vllm.state")[0] == busy.state.code
    value, metric = server("vgpumon.vllm.ttft_slo_attainment")
    assert value == pytest.approx(busy.ttft_slo_attainment_ratio) and metric.unit == "1"
    assert server("vgpumon.vllm.generation_tokens_per_second")[0] == pytest.approx(busy.generation_tokens_per_second)
    # the recorded busy scrape's queue-time histogram cannot be true: its percentiles are not sent
    assert "queue" in busy.latency_unreliable and "vgpumon.vllm.queue_p50" not in points
    assert server("vgpumon.vllm.ttft_p50")[1].unit == "s"
