"""What a catalogue entry is: ``Field`` and its ``Encoding``, with the defaults derived from a
field's kind and unit. Pure data: nothing here imports SQLAlchemy, a source or the network, so
every part of vgpumon (sources, store, reports, exporter, rules, dashboards) can read it cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

#: Kinds of field. ``gauge``: a reading that goes up and down; ``counter``: only grows (resets
#: at a driver reload or process restart); ``flag``: a boolean state; ``enum``: one of a decoding
#: table's codes; ``bitmask``: OR of a decoding table's bits; ``state``: the source's own status
#: (up, activity source); ``info``: a static fact of a device (an identity attribute);
#: ``event``: stored one row per event; ``derived``: computed by the source from other fields
#: and not stored (the store keeps what it derives from).
KINDS = frozenset({"gauge", "counter", "flag", "enum", "bitmask", "state", "info", "event", "derived"})

#: Base units. The field name ends with the unit's suffix (``_total`` may follow for counters),
#: as Prometheus' naming guide asks; ``""`` means the unit has no name suffix (a count of
#: requests, a P-state, a link generation).
UNIT_SUFFIXES: dict[str, str] = {
    "bytes": "_bytes",
    "bytes_per_second": "_bytes_per_second",
    "ratio": "_ratio",
    "celsius": "_celsius",
    "watts": "_watts",
    "joules": "_joules",
    "hertz": "_hertz",
    "seconds": "_seconds",
    "per_second": "_per_second",
    "count": "",
    "tokens": "",
    "generation": "",
    "lanes": "",
    "load": "",
    "cores": "",
    "code": "",
    "bool": "",
    "text": "",
}

#: Rollup aggregates a ``gpu_samples_1m`` column may keep (see ``vgpumon.store.rollup``).
AGGREGATES = frozenset({"min", "mean", "max", "p50", "p95", "p99", "last", "any", "or"})


@dataclass(frozen=True, slots=True)
class Encoding:
    """How a field is stored.

    Attributes:
        kind: ``fixed`` (a float stored as ``round(value × scale)`` in an integer column),
            ``int`` (an integer as is), ``bool``, ``code`` (a string enum stored as a small
            integer through ``codes``) or ``text``.
        scale: ``fixed``: stored units per base unit (10 000 for a ratio in 1e-4).
        coarse: ``fixed``: ``scale`` base units make one stored unit instead (hertz in MHz).
        bits: width of the signed integer column (16, 32 or 64).
        codes: ``code``: value → stored integer.
        length: ``text``: the column's maximum length.
    """

    kind: str
    scale: int = 1
    coarse: bool = False
    bits: int = 64
    codes: Mapping[str, int] | None = None
    length: int | None = None

    @property
    def max_stored(self) -> int:
        """Largest integer the column holds (``2**(bits-1) - 1``)."""
        return (1 << (self.bits - 1)) - 1

    def stored(self, value: float) -> int:
        """The integer stored for a base-unit value (``fixed`` and ``int`` encodings).

        Raises:
            OverflowError: the value does not fit the column (or is infinite).
            ValueError: the value is NaN.
            TypeError: the value is not a number.
        """
        if self.kind == "fixed":
            x = round(value / self.scale) if self.coarse else round(value * self.scale)
        else:
            x = int(value)
        if not -self.max_stored - 1 <= x <= self.max_stored:
            raise OverflowError(f"{value!r} does not fit a {self.bits}-bit column")
        return x

    def base(self, stored: float) -> float:
        """The base-unit value of a stored integer (inverse of ``stored``)."""
        if self.kind != "fixed":
            return stored
        return stored * self.scale if self.coarse else stored / self.scale


# Encodings in use. Fixed-point keeps history ~3× smaller than REAL columns on SQLite (FACTS §6:
# 2.8 vs 9.7 bytes per value on replayed H200 data) at a resolution below what NVML reports.
RATIO = Encoding("fixed", 10_000)  # 1e-4, as DCGM reports profiling ratios
WATTS = Encoding("fixed", 1_000)  # NVML reports milliwatts
JOULES = Encoding("fixed", 1_000)  # NVML reports millijoules
HERTZ = Encoding("fixed", 1_000_000, coarse=True)  # NVML reports whole MHz
CELSIUS = Encoding("fixed", 10)  # 0.1 °C
BYTES_PER_SECOND = Encoding("fixed", 1)
SECONDS_MS = Encoding("fixed", 1_000)  # counters of seconds in ms
SECONDS_US = Encoding("fixed", 1_000_000)  # latencies and prewarm in µs
PER_SECOND = Encoding("fixed", 1_000)  # rates in 0.001 per second
MILLI = Encoding("fixed", 1_000)  # counts vLLM exposes as floats, CPU cores in milli-cores
LOAD = Encoding("fixed", 100)  # load average in 1/100
INT64 = Encoding("int", bits=64)
INT32 = Encoding("int", bits=32)
INT16 = Encoding("int", bits=16)
BOOL = Encoding("bool")


def text(length: int) -> Encoding:
    """A string column of at most ``length`` characters."""
    return Encoding("text", length=length)


#: Largest integer a double represents exactly: counts above it have lost their last digits, and
#: every counter NVML or vLLM reports stays far below it in a board's life (FACTS §2).
COUNT_MAX = float(2**53)


@dataclass(frozen=True, slots=True)
class Field:
    """One field: everything vgpumon knows about it, in one place.

    Attributes:
        name: the field's name with its base unit; the column, the typed-record attribute and
            the key of ``missing`` reasons.
        table: the table that stores it (``gpu_samples``, ``gpus``, ``host_samples``,
            ``gpu_process_samples``, ``vllm_samples``, ``vllm_engine_samples``,
            ``vllm_instances``, ``xid_events``), ``None`` for a field the NVML source derives
            and does not store; for fields only ``/metrics`` carries, their group:
            ``exporter`` (derived at scrape time) or ``agent`` (the agent's own health).
        kind: one of ``KINDS``.
        unit: base unit, a key of ``UNIT_SUFFIXES``.
        help: one sentence; the Prometheus HELP text and the docs' description.
        source: where the value comes from: the NVML call (with its raw unit), the vLLM metric
            names and versions, or the psutil call.
        cadence: ``fast`` (every tick), ``slow`` (every ``slow_every`` ticks), ``minute`` (the first
            slow tick a minute after the last read, ``MINUTE_SECONDS``; calls that cost the
            driver a millisecond or more of CPU, on counters or rarely changing facts), ``static`` (at
            start and after a re-initialisation), ``event``, ``host`` (every ``host_every``
            ticks), ``poll`` (every vLLM poll), ``start`` (once per server start),
            ``scrape`` (computed at each scrape of ``/metrics``), ``rules`` (each rules run),
            ``kubelet`` (each refresh of the kubelet's pod resources, 30 s).
        encoding: how the store keeps it.
        lo, hi: the valid range in base units, both inclusive; a value outside (or NaN, ±Inf,
            a blank sentinel, a non-number) is rejected at the door. ``None``: no bound
            (strings).
        limit: a bound that depends on the device, checked beside ``hi``: ``"pcie_link"`` =
            at most 1.25 × the max link's capacity (FACTS §3: counters read 94–96 % of it
            under a full copy); ``"memory_total"`` = at most the GPU's memory total.
        rollup: aggregates kept per minute in ``gpu_samples_1m`` (``gpu_samples`` fields only).
        prometheus: the exported metric name, written out; ``None`` when not exported as a
            series of its own (identity attributes are labels of an ``_info`` metric, see
            ``prom_label``).
        prom_type: ``gauge`` or ``counter``; identity is a ``*_info`` gauge set to 1 (STYLE §5).
        prom_labels: constant labels that tell this field apart within its metric family
            (latency percentiles share one family: ``{"percentile": "95"}``).
        prom_label: for identity attributes, the label of the ``_info`` metric that carries it.
        smi: the ``nvidia-smi --query-gpu`` field (or ``-q`` section) with the same meaning.
        dcgm: the DCGM field id name with the same meaning.
        display: how a report shows it (``vgpumon.catalogue.fmt``).
        label: a short human label for reports.
        decode: enums and bitmasks: code or bit → name.
        required: the column is NOT NULL: the source always knows the value (``up``, a server's
            ``state``); every other field may be ``None``.
        diagnose: what ``diagnose`` reads of it: ``window`` (mean and max over the report's
            window), ``last`` (newest value in the window), ``cumulative`` (newest value at or
            before the window's end: counters and latched flags the slow set reads every few
            ticks); empty when the report does not read it.
        note: anything a reader of ``docs/metrics.md`` should know.
        otel: the OpenTelemetry semantic-convention metric that carries it (``hw.gpu.*``,
            ``hw.power``, ...), pushed by ``--otlp`` with ``otel_attrs`` on each point; ``None``:
            pushed as ``vgpumon.gpu.<name>`` (``vgpumon.exporter.otlp``).
        otel_attrs: the attributes that tell this field apart within ``otel`` (the direction of
            ``hw.gpu.io``, the task of ``hw.gpu.utilization``).
    """

    name: str
    table: str | None
    kind: str
    unit: str
    help: str
    source: str
    cadence: str
    encoding: Encoding
    lo: float | None = None
    hi: float | None = None
    limit: str | None = None
    rollup: tuple[str, ...] | None = None
    prometheus: str | None = None
    prom_type: str | None = None
    prom_labels: Mapping[str, str] = field(default_factory=dict)
    prom_label: str | None = None
    smi: str | None = None
    dcgm: str | None = None
    display: str | None = None
    label: str | None = None
    decode: Mapping[int, str] | None = None
    diagnose: tuple[str, ...] = ()
    required: bool = False
    note: str = ""
    otel: str | None = None
    otel_attrs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Defaults derived from kind and unit, so that each entry states only what is its own.
        set_ = object.__setattr__
        if self.rollup is None:
            set_(self, "rollup", _default_rollup(self) if self.table == "gpu_samples" else ())
        if self.prom_type is None and self.prometheus is not None:
            set_(self, "prom_type", "counter" if self.kind == "counter" else "gauge")
        if self.display is None:
            set_(self, "display", _DEFAULT_DISPLAY.get(self.unit, "number"))
        if self.label is None:
            set_(self, "label", self.name.replace("_", " "))

    @property
    def integral(self) -> bool:
        """True when the value is an integer (a count, a code, a bitmask), not a measurement."""
        return self.encoding.kind in ("int", "code") or self.kind in ("enum", "bitmask")

    @property
    def key(self) -> tuple[str | None, str]:
        """``(table, name)``: unique in the catalogue (one name may be in two tables, e.g.
        ``memory_total_bytes`` of ``gpus`` and of ``gpu_samples``)."""
        return (self.table, self.name)


def _default_rollup(f: Field) -> tuple[str, ...]:
    if f.kind == "gauge":
        return ("min", "mean", "max")
    if f.kind == "flag":
        return ("any",)
    if f.kind == "bitmask":
        return ("or",)
    return ("last",)  # counters, enums, states: the minute's last value


_DEFAULT_DISPLAY = {
    "bytes": "bytes",
    "bytes_per_second": "bytes_per_second",
    "ratio": "percent",
    "celsius": "celsius",
    "watts": "watts",
    "joules": "joules",
    "hertz": "megahertz",
    "seconds": "seconds",
    "per_second": "per_second",
    "generation": "generation",
    "lanes": "lanes",
    "bool": "yes_no",
    "code": "code",
    "text": "text",
}
