"""OTLP push: the catalogue's GPU, host and vLLM fields of the newest snapshot, sent over OTLP/HTTP (protobuf)
through the OpenTelemetry SDK, for fleets whose metrics pipeline is OpenTelemetry's
(``vgpumon agent --otlp URL``; docs/exporter.md, "OTLP").

Names follow OpenTelemetry's semantic conventions for hardware where a field has one (the
catalogue's ``Field.otel``: ``hw.gpu.utilization``, ``hw.gpu.memory.usage``/``limit``,
``hw.gpu.io``, ``hw.power``, ``hw.energy``, ``hw.errors``), with ``hw.type = "gpu"`` and
``hw.id`` the GPU's UUID on every point; every other GPU field is ``vgpumon.gpu.<name>`` with the
unit in the instrument's unit, not in its name. The host's fields are ``vgpumon.host.<name>`` (the
conventions' ``system.*`` metrics split CPU by mode and memory by state, which the agent does not
read), on the resource's ``host.name``; each vLLM server's are ``vgpumon.vllm.<name>`` with
``server.address``, ``server.port``, ``url.full`` and ``vgpumon.vllm.model`` (its first served
model) on every point, the state as its code. What the exporter's rules say holds here too:
absent is absent (a ``None`` reading gives no point), data older than three tick intervals is not
sent, slow fields keep their newest value between reads.

``hw.gpu.io`` is a counter of bytes in the conventions; NVML gives throughput. The pusher
integrates each tick's TX and RX rate over the tick's interval into a cumulative count (bytes
moved as far as the 1-s samples see them, not a hardware counter) and says so in the
instrument's description.

The SDK is imported only when ``--otlp`` is given (``pip install 'vgpumon[otlp]'``). Endpoint
headers (an API key) come from ``OTEL_EXPORTER_OTLP_HEADERS``, as the SDK reads them: never from
the command line, where ``ps`` would show them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vgpumon import __version__
from vgpumon.base.errors import ExitCode, VgpumonError
from vgpumon.catalogue import FIELDS, Field
from vgpumon.exporter.plans import LATENCY_FIELDS

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider

    from vgpumon.model import Snapshot

#: Units of OpenTelemetry (UCUM) for the catalogue's base units.
UNITS = {
    "bytes": "By", "bytes_per_second": "By/s", "ratio": "1", "celsius": "Cel", "watts": "W", "joules": "J",
    "hertz": "Hz", "seconds": "s", "per_second": "1/s",
}
#: The conventions' instrument for each of their metrics the catalogue maps to.
UP_DOWN = frozenset({"hw.gpu.memory.usage", "hw.gpu.memory.limit"})
INTEGRATED = "hw.gpu.io"
_KINDS = frozenset({"gauge", "counter", "flag", "enum", "bitmask"})


class OtlpUnavailableError(VgpumonError):
    """``--otlp`` without the OpenTelemetry SDK installed (69: installing it is the fix, not a restart)."""

    exit_code = ExitCode.UNAVAILABLE


def exported_fields() -> list[Field]:
    """The GPU fields pushed: every ``gpu_samples`` reading of a kind a metric can carry."""
    return [f for f in FIELDS if f.table == "gpu_samples" and f.kind in _KINDS]


def host_fields() -> list[Field]:
    """The host fields pushed (``host_samples``: CPU, memory, load averages)."""
    return [f for f in FIELDS if f.table == "host_samples" and f.kind in _KINDS]


def vllm_fields() -> list[Field]:
    """The vLLM fields pushed: every numeric ``vllm_samples`` reading of a server's poll (the
    state as its code; text fields such as the reason are not metrics)."""
    return [f for f in FIELDS if f.table == "vllm_samples" and f.kind in _KINDS and f.kind != "bitmask"]


#: Metric-name namespace of each table's fields without a convention of their own.
_NAMESPACE = {"gpu_samples": "vgpumon.gpu.", "host_samples": "vgpumon.host.", "vllm_samples": "vgpumon.vllm."}


def otel_name(f: Field) -> str:
    """The field's metric name: its convention's, else ``vgpumon.<gpu|host|vllm>.<name without unit>``."""
    if f.otel:
        return f.otel
    base = f.name.removesuffix("_total")
    suffix = {"bytes": "_bytes", "bytes_per_second": "_bytes_per_second", "ratio": "_ratio", "celsius": "_celsius",
              "watts": "_watts", "joules": "_joules", "hertz": "_hertz", "seconds": "_seconds"}.get(f.unit, "")
    return _NAMESPACE.get(f.table or "", "vgpumon.gpu.") + (base.removesuffix(suffix) if suffix else base)


def _number(value: object) -> float | None:
    """A reading as a metric value: numbers and flags; a state as its code; else ``None``."""
    code = getattr(value, "code", None)
    if isinstance(code, int):
        return float(code)
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    return float(value) if isinstance(value, (int, float)) else None


@dataclass
class _Gpu:
    attributes: dict[str, str]
    values: dict[str, float] = field(default_factory=dict)  # field name → newest value
    io: dict[str, float] = field(default_factory=lambda: {"transmit": 0.0, "receive": 0.0})
    last_ts: float | None = None


@dataclass
class _Server:
    attributes: dict[str, str | int]
    values: dict[str, float]


class OtlpPusher:
    """Keeps what the newest snapshots said (``observe``, on the sampling thread) and serves it to
    the SDK's observable instruments, which its periodic reader pushes every ``interval``."""

    def __init__(self, url: str, hostname: str, *, interval: float = 15.0, tick_interval: float = 1.0,
                 timeout: float = 10.0, provider: MeterProvider | None = None) -> None:
        self._lock = threading.Lock()
        self._gpus: dict[str, _Gpu] = {}
        self._host: dict[str, float] = {}  # the newest host sample's (taken every few ticks)
        self._servers: dict[str, _Server] = {}  # vLLM server URL → its newest poll's values
        self._newest: float | None = None
        self._received: float | None = None  # monotonic time of the newest snapshot
        self._stale_after = 3 * tick_interval
        self.provider = provider if provider is not None else _provider(url, hostname, interval, timeout)
        meter = self.provider.get_meter("vgpumon", __version__)
        groups: dict[str, list[Field]] = {}
        for f in exported_fields():
            groups.setdefault(otel_name(f), []).append(f)
        for name, fields in groups.items():
            f = fields[0]
            unit = "By" if name == INTEGRATED else UNITS.get(f.unit, "1")
            if name == INTEGRATED:
                description = "Bytes over the GPU's PCIe link, integrated from NVML's throughput samples (not a hardware counter)."
                meter.create_observable_counter(name, [self._io_callback()], unit=unit, description=description)
            elif name in UP_DOWN:
                meter.create_observable_up_down_counter(name, [self._callback(fields)], unit=unit, description=f.help)
            elif f.kind == "counter":
                meter.create_observable_counter(name, [self._callback(fields)], unit=unit, description=f.help)
            else:
                meter.create_observable_gauge(name, [self._callback(fields)], unit=unit, description=f.help)
        for f in host_fields():
            meter.create_observable_gauge(otel_name(f), [self._host_callback(f)], unit=UNITS.get(f.unit, "1"), description=f.help)
        for f in vllm_fields():
            meter.create_observable_gauge(otel_name(f), [self._server_callback(f)], unit=UNITS.get(f.unit, "1"), description=f.help)

    # -- the agent's side ---------------------------------------------------------------------

    def observe(self, snap: Snapshot) -> None:
        """Take one tick in (an ``Agent.observers`` callback: it only copies numbers)."""
        with self._lock:
            for ident, sample in zip(snap.gpus, snap.samples):
                gpu = self._gpus.get(ident.uuid)
                if gpu is None:
                    attrs = {"hw.id": ident.uuid, "hw.type": "gpu", "hw.name": f"gpu{ident.index}"}
                    if ident.name:
                        attrs["hw.model"] = ident.name
                    attrs["hw.vendor"] = "NVIDIA"
                    gpu = self._gpus[ident.uuid] = _Gpu(attrs)
                if not sample.up:
                    gpu.values.clear()
                    gpu.last_ts = None
                    continue
                for f in exported_fields():
                    v = getattr(sample, f.name, None)
                    if isinstance(v, bool):
                        gpu.values[f.name] = 1.0 if v else 0.0
                    elif isinstance(v, (int, float)):
                        gpu.values[f.name] = float(v)
                    elif f.cadence == "fast":
                        gpu.values.pop(f.name, None)  # absent this tick: no point (slow fields keep theirs)
                dt = snap.ts - gpu.last_ts if gpu.last_ts is not None else 0.0
                if 0 < dt <= self._stale_after:  # a gap, a clock step: no bytes made up for it
                    for direction, name in (("transmit", "pcie_tx_bytes_per_second"), ("receive", "pcie_rx_bytes_per_second")):
                        rate = getattr(sample, name, None)
                        if isinstance(rate, (int, float)) and not isinstance(rate, bool):
                            gpu.io[direction] += float(rate) * dt
                gpu.last_ts = snap.ts
            if snap.host is not None:
                self._host = {f.name: v for f in host_fields() if (v := _number(getattr(snap.host, f.name, None))) is not None}
            if snap.vllm is not None:
                self._servers = self._server_values(snap)
            self._newest = snap.ts
            self._received = time.monotonic()

    @staticmethod
    def _server_values(snap: Snapshot) -> dict[str, _Server]:
        """Each vLLM server's newest poll, by URL; a poll older than three poll intervals is not
        sent (as on ``/metrics``)."""
        assert snap.vllm is not None
        out = {}
        for smp in snap.vllm.samples:
            if snap.vllm.read_at - smp.ts > 3 * snap.vllm.interval:
                continue
            inst = smp.instance
            attrs: dict[str, str | int] = {"server.address": inst.host, "server.port": inst.port, "url.full": inst.url}
            if smp.model_names:
                attrs["vgpumon.vllm.model"] = smp.model_names[0]
            # percentiles of a histogram flagged unreliable are not sent (nor served on /metrics)
            hidden = frozenset().union(*(LATENCY_FIELDS.get(h, ()) for h in smp.latency_unreliable or {}))
            values = {f.name: v for f in vllm_fields()
                      if f.name not in hidden and (v := _number(getattr(smp, f.name, None))) is not None}
            out[inst.url] = _Server(attrs, values)
        return out

    def shutdown(self) -> None:
        """Push what is kept one last time and stop the reader (at the agent's stop)."""
        self.provider.shutdown()

    # -- the SDK's side -----------------------------------------------------------------------

    def _fresh(self) -> list[_Gpu]:
        with self._lock:
            if self._received is None or time.monotonic() - self._received > self._stale_after:
                return []  # not fresh is not sent
            return [_Gpu(dict(g.attributes), dict(g.values), dict(g.io), g.last_ts) for g in self._gpus.values()]

    def _fresh_host_and_servers(self) -> tuple[dict[str, float], list[_Server]]:
        with self._lock:
            if self._received is None or time.monotonic() - self._received > self._stale_after:
                return {}, []
            return dict(self._host), [_Server(dict(s.attributes), dict(s.values)) for s in self._servers.values()]

    def _host_callback(self, f: Field) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            host, _ = self._fresh_host_and_servers()
            return [Observation(host[f.name])] if f.name in host else []

        return observe

    def _server_callback(self, f: Field) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            _, servers = self._fresh_host_and_servers()
            return [Observation(s.values[f.name], s.attributes) for s in servers if f.name in s.values]

        return observe

    def _callback(self, fields: Sequence[Field]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            out = []
            for gpu in self._fresh():
                for f in fields:
                    if f.name in gpu.values:
                        out.append(Observation(gpu.values[f.name], {**gpu.attributes, **f.otel_attrs}))
            return out

        return observe

    def _io_callback(self) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(total, {**gpu.attributes, "network.io.direction": direction})
                    for gpu in self._fresh() for direction, total in gpu.io.items() if gpu.last_ts is not None]

        return observe


class _OncePer(logging.Filter):
    """The SDK logs each failed push and each retry; a collector that is away says so once per
    ``seconds`` (the agent's habit for an outage), not four lines every push."""

    def __init__(self, seconds: float = 300.0) -> None:
        super().__init__()
        self.seconds = seconds
        self._last: float | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        now = time.monotonic()
        if self._last is not None and now - self._last < self.seconds:
            return False
        self._last = now
        record.msg = f"OTLP push: {record.getMessage()} (said once per {self.seconds:.0f} s while it lasts)"
        record.args = ()
        return True


def _provider(url: str, hostname: str, interval: float, timeout: float) -> MeterProvider:
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
    except ImportError:
        raise OtlpUnavailableError(
            "--otlp needs the OpenTelemetry SDK: pip install 'vgpumon[otlp]'"
        ) from None
    endpoint = url.rstrip("/")
    if not endpoint.endswith("/v1/metrics"):
        endpoint += "/v1/metrics"  # a collector's base URL, as OTEL_EXPORTER_OTLP_ENDPOINT takes it
    logging.getLogger("opentelemetry.exporter.otlp.proto.http.metric_exporter").addFilter(_OncePer())
    exporter = OTLPMetricExporter(endpoint=endpoint, timeout=timeout)
    reader = PeriodicExportingMetricReader(exporter, export_interval_millis=interval * 1000, export_timeout_millis=timeout * 1000)
    resource = Resource.create({"service.name": "vgpumon", "service.version": __version__, "host.name": hostname})
    return MeterProvider(metric_readers=[reader], resource=resource)
