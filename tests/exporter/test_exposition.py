"""The exposition itself: a golden file per recorded capture, linted by the real ``promtool check
metrics``, and the label policy and naming rules a dashboard or rule depends on.

Golden files live in ``tests/golden/``; after a deliberate change, regenerate them with
``VGPUMON_UPDATE_GOLDEN=1 python -m pytest tests/exporter/test_exposition.py`` and review the diff.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess

import pytest
from conftest import DATA, GOLDEN
from exporter_support import Scrape, fed, snapshots
from prometheus_support import tool
from vllm_support import shared_dir

from vgpumon import catalogue
from vgpumon.catalogue import UNIT_SUFFIXES
from vgpumon.exporter.collector import LABEL_NAMES, MAX_LABELS, MetricsExporter
from vgpumon.model import Snapshot
from vgpumon.sources.nvml.capture import ReplayBackend
from vgpumon.sources.vllm import VllmSource
from vgpumon.sources.vllm.discovery import NoProcesses
from vgpumon.testing import incident, scenarios
from vgpumon.testing.vllm import FakeClock, FakeVllmServer, free_port

UPDATE = bool(os.environ.get("VGPUMON_UPDATE_GOLDEN"))
CAPTURES = ["h200-workload", "h200-idle-full", "h200-idle-hbm", "h200-nogpm-copy"]
#: the scripted server's port stands for the one a test gets; the golden file says 8000
VLLM_PORT = "127.0.0.1:8000"


def _gpu_exposition(name: str) -> bytes:
    if name == "eight-gpu-incident":
        backend = scenarios.backend(*incident.build(DATA))
    else:
        backend = ReplayBackend(DATA / f"{name}.jsonl.gz")
    return fed(snapshots(backend)).render()


def _vllm_exposition() -> bytes:
    """A real vLLM 0.32 server's recorded scrapes (busy, then scraped again while its engine was
    being killed: the counters and histograms moved in between), served by a real HTTP server
    and read by the vLLM source; the exporter serves what the source saw."""
    d = shared_dir("fixtures", "vllm-real")

    async def go() -> bytes:
        port = free_port()
        server = await FakeVllmServer(metrics=(d / "vllm-0.32.0-cpu__busy.txt").read_text(), version="0.32.0", models=["tiny"]).start(port)
        clock = FakeClock()
        src = VllmSource(static_urls=[server.url], processes=NoProcesses(), clock=clock, interval=2.0, request_timeout=1.0)
        try:
            await src.poll()
            clock.advance(2.0)
            server.metrics = (d / "vllm-0.32.0-cpu__engine-killed.txt").read_text()
            await src.poll()
        finally:
            await src.close()
            await server.stop()
        # the vLLM source's poll duration is a wall-clock measurement: left out of the golden file
        families = set(catalogue.families()) - {"vgpumon_agent_source_collect_duration_seconds"}
        ex = MetricsExporter(hostname="vllm-host", selection=frozenset(families), monotonic=FakeClock(0.0))
        # the exporter reads vLLM from the tick's snapshot only: a tick of a host with no GPU
        ex.observe(src.attach(Snapshot(ts=clock(), hostname="vllm-host", gpus=(), samples=())))
        return ex.render().replace(f"127.0.0.1:{port}".encode(), VLLM_PORT.encode())

    return asyncio.run(go())


EXPOSITIONS = {**{n: (lambda n=n: _gpu_exposition(n)) for n in [*CAPTURES, "eight-gpu-incident"]}, "vllm-0.32.0": _vllm_exposition}


class _Rendered(dict):
    """Each exposition rendered once, when a test first asks for it (the vLLM one skips alone
    where the shared captures are absent)."""

    def __missing__(self, name: str) -> bytes:
        self[name] = EXPOSITIONS[name]()
        return self[name]


@pytest.fixture(scope="module")
def rendered() -> dict[str, bytes]:
    return _Rendered()


@pytest.mark.parametrize("name", list(EXPOSITIONS))
def test_exposition_matches_its_golden_file(name, rendered):
    path = GOLDEN / f"{name}.prom"
    if UPDATE:
        path.write_bytes(rendered[name])
    assert path.read_bytes() == rendered[name], f"regenerate with VGPUMON_UPDATE_GOLDEN=1 and review: {path.name}"


@pytest.mark.parametrize("name", list(EXPOSITIONS))
def test_promtool_check_metrics_passes_every_golden_file(name):
    promtool = tool("promtool")
    text = (GOLDEN / f"{name}.prom").read_bytes()
    out = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True)
    assert (out.returncode, out.stdout + out.stderr) == (0, b"")


def test_golden_files_are_only_those_of_the_captures():
    assert {p.stem for p in GOLDEN.glob("*.prom")} == set(EXPOSITIONS)


@pytest.mark.parametrize("name", list(EXPOSITIONS))
def test_label_policy(name, rendered):
    """Label names are lower case, from the documented set (identity only), at most 8 per series
    so that Prometheus' job and instance keep it within 10; ``_info`` gauges are 1."""
    m = Scrape(rendered[name])
    assert m.samples
    for metric, labels, value in m.samples:
        for label in labels:
            assert re.fullmatch(r"[a-z_][a-z0-9_]*", label), (metric, label)
            assert label in LABEL_NAMES, f"{metric}: label {label!r} is not in the documented label set"
        assert len(labels) <= MAX_LABELS, (metric, labels)
        assert "hostname" in labels, metric
        if metric.endswith("_info"):
            assert value == 1.0, metric


@pytest.mark.parametrize("name", list(EXPOSITIONS))
def test_names_types_and_unit_suffixes_are_the_catalogues(name, rendered):
    """Our own check of what promtool misses (``_percent``, ``_milliwatts``): every family served
    is a catalogue family, with the catalogue's type; counters and only counters end in
    ``_total``; the name ends in the unit of the fields behind it."""
    families = catalogue.families()
    units = {f.prometheus: f.unit for f in catalogue.FIELDS if f.prometheus}
    m = Scrape(rendered[name])
    for metric, typ in m.types.items():
        assert metric in families, metric
        assert typ == families[metric][0], metric
        assert metric.endswith("_total") == (typ == "counter"), metric
        if metric in units:
            base = metric.removesuffix("_total")
            assert base.endswith(UNIT_SUFFIXES[units[metric]]), (metric, units[metric])
        assert not re.search(r"_(percent|milliwatts|mib|mb|mhz|kb|ms)(_|$)", metric), metric


def test_xids_are_a_counter_per_code_and_pcie_rates_are_gauges(rendered):
    m = Scrape(rendered["eight-gpu-incident"])
    assert m.types["vgpumon_gpu_xid_events_total"] == "counter"
    assert {lab["xid"] for lab, _ in m.series("vgpumon_gpu_xid_events_total")} >= {"13", "31", "79"}
    assert not [n for n in m.names() if "last_xid" in n or n.endswith("_xid")]
    for d in ("tx", "rx"):
        assert m.types[f"vgpumon_gpu_pcie_{d}_bytes_per_second"] == "gauge"  # never a counter: rate() of it is wrong


def test_series_are_the_same_set_from_tick_to_tick_while_readings_change():
    """Readings never become labels: the copy phase and the matmul phase of the H200 capture
    serve the same series (names and label sets), only their values differ."""
    snaps = snapshots(ReplayBackend(DATA / "h200-workload.jsonl.gz"))
    a, b = Scrape(fed(snaps[:20]).render()), Scrape(fed(snaps[:40]).render())
    key = lambda m: {(n, tuple(sorted(lab.items()))) for n, lab, _ in m.samples if n != "vgpumon_agent_source_last_success_timestamp_seconds"}  # noqa: E731
    assert key(a) == key(b)
    assert {n: v for n, _, v in a.samples} != {n: v for n, _, v in b.samples}
