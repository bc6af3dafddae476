"""Helpers of the exporter tests: an exporter fed a recorded capture tick by tick, and a scrape
read back the way Prometheus reads it (the text format, parsed)."""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from conftest import read_all
from prometheus_client.parser import text_string_to_metric_families

from vgpumon.exporter.collector import MetricsExporter
from vgpumon.model import Snapshot
from vgpumon.testing.vllm import FakeClock


def snapshots(backend: Any, hostname: str = "h200-replay") -> list[Snapshot]:
    """One snapshot per tick of a replay, as the agent builds them. The NVML source's collect
    time (a wall-clock measurement) is set to 0 so that expositions are reproducible."""
    src, readings = read_all(backend)
    return [
        Snapshot(
            ts=r.ts, hostname=hostname, gpus=src.gpus, samples=r.samples, xid_events=r.xid_events,
            sources=(dataclasses.replace(r.status, collect_seconds=0.0),) if r.status else (),
        )
        for r in readings
    ]


def fed(snaps: Iterable[Snapshot], *, clock: FakeClock | None = None, hostname: str = "h200-replay", **kw: Any) -> MetricsExporter:
    """An exporter that observed ``snaps``, on a clock that stands still unless told."""
    ex = MetricsExporter(hostname=hostname, monotonic=clock or FakeClock(0.0), **kw)
    for s in snaps:
        ex.observe(s)
    return ex


class Scrape:
    """A rendered ``/metrics`` parsed back: ``value(name, **labels)`` is the sample's value, or
    ``None`` when no sample has exactly those labels (client_python's ``get_sample_value``)."""

    def __init__(self, text: bytes | str) -> None:
        self.text = text.decode() if isinstance(text, bytes) else text
        self.types: dict[str, str] = {}
        self.samples: list[tuple[str, dict[str, str], float]] = []
        for fam in text_string_to_metric_families(self.text):
            for s in fam.samples:
                self.types[s.name] = fam.type
                self.samples.append((s.name, s.labels, s.value))

    def value(self, metric: str, /, **labels: str) -> float | None:
        for n, lab, v in self.samples:
            if n == metric and lab == labels:
                return v
        return None

    def series(self, name: str) -> list[tuple[dict[str, str], float]]:
        return [(lab, v) for n, lab, v in self.samples if n == name]

    def names(self) -> set[str]:
        return {n for n, _, _ in self.samples}


def scrape(ex: MetricsExporter) -> Scrape:
    return Scrape(ex.render())
