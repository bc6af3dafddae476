"""The field catalogue: every GPU, host and vLLM field vgpumon reads, stores, reports and exports.

A field's facts live here and only here — name and base unit, kind, valid range, storage encoding,
rollup aggregates, source (NVML call or vLLM metric and versions, cadence), the ``nvidia-smi`` and
DCGM names, the Prometheus name, type and help, how reports display it, and the decoding table of
enums and bitmasks. What derives from it:

* the columns of ``gpu_samples``, ``host_samples``, ``gpu_process_samples``, ``vllm_samples``,
  ``vllm_engine_samples`` and the measured columns of ``gpus`` and ``vllm_instances``
  (``vgpumon.store.schema``; a test keeps the Alembic head equal to them);
* the stored encoding of each value (``vgpumon.store.codec``) and the 1-minute rollups;
* validation at the door (``Door``): every value from outside is checked against its entry;
* the columns ``diagnose`` reads and how reports print them (``fmt``);
* ``docs/metrics.md`` (``python -m vgpumon.catalogue > docs/metrics.md``; a test keeps it equal);
* and, next, ``/metrics``, the rules and the dashboards.

Adding a GPU gauge takes its entry here, its read in ``vgpumon.sources.nvml``, its attribute in
``vgpumon.model.GpuSample`` and an Alembic revision (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

from vgpumon.catalogue import exporter, gpu, host, vllm
from vgpumon.catalogue.core import AGGREGATES, KINDS, UNIT_SUFFIXES, Encoding, Field
from vgpumon.catalogue.door import Door, Rejected, is_rejection, sentinel

__all__ = [
    "AGGREGATES",
    "FIELDS",
    "INFO_METRICS",
    "KINDS",
    "TABLES",
    "UNIT_SUFFIXES",
    "Door",
    "Encoding",
    "Field",
    "Rejected",
    "families",
    "fields_of",
    "fmt",
    "get",
    "is_rejection",
    "render_markdown",
    "sentinel",
]

#: Every field, grouped by table in a stable order (the order of their columns).
FIELDS: tuple[Field, ...] = (
    *gpu.IDENTITY,
    *gpu.SAMPLES,
    *gpu.DERIVED,
    *gpu.PROCESSES,
    *gpu.EVENTS,
    *host.HOST,
    *vllm.SAMPLES,
    *vllm.ENGINES,
    *vllm.INSTANCES,
    *exporter.DERIVED,
    *exporter.AGENT,
)

#: Tables whose value columns come from the catalogue, in the order docs list them.
TABLES: tuple[str, ...] = (
    "gpus",
    "gpu_samples",
    "gpu_process_samples",
    "xid_events",
    "host_samples",
    "vllm_samples",
    "vllm_engine_samples",
    "vllm_instances",
)

#: The ``_info`` metric whose labels carry the identity attributes (``prom_label``) of a group.
INFO_METRICS: dict[str, str] = {
    "gpus": "vgpumon_gpu_info",
    "vllm_instances": "vgpumon_vllm_server_info",
    "agent": "vgpumon_agent_build_info",
}
_INFO_HELP = {
    "gpus": "GPU identity (value 1): product name, serial, PCI bus id, GPM support.",
    "vllm_instances": "vLLM server identity (value 1): served model and version.",
    "agent": "The agent's build (value 1).",
}

_BY_KEY: dict[tuple[str | None, str], Field] = {f.key: f for f in FIELDS}
assert len(_BY_KEY) == len(FIELDS), "a (table, name) pair is in the catalogue twice"


def get(table: str | None, name: str) -> Field:
    """The entry of ``name`` in ``table`` (``None`` for derived, unstored fields).

    Raises:
        KeyError: no such field.
    """
    return _BY_KEY[(table, name)]


def fields_of(table: str | None) -> tuple[Field, ...]:
    """The fields of one table, in column order."""
    return tuple(f for f in FIELDS if f.table == table)


def families() -> dict[str, tuple[str, str]]:
    """Every metric family ``/metrics`` can serve: name → ``(type, help)``, in catalogue order.

    The ``prometheus`` names of the entries (fields told apart by ``prom_labels`` share one
    family), and the ``_info`` gauges that carry identity attributes (``INFO_METRICS``). A
    dashboard or rule may query only these names.
    """
    out: dict[str, tuple[str, str]] = {}
    for f in FIELDS:
        if f.prometheus is not None:
            help_ = f.help
            if f.prom_labels:  # one family for several fields: say what tells them apart
                help_ = f.help.split(" of the ", 1)[-1].rstrip(".").capitalize() if " of the " in f.help else f.help
                help_ = f"{help_}, by {', '.join(f.prom_labels)}."
            out.setdefault(f.prometheus, (f.prom_type or "gauge", help_))
        elif f.prom_label and f.table in INFO_METRICS:
            out.setdefault(INFO_METRICS[f.table], ("gauge", _INFO_HELP[f.table]))
    return out


# -- display -------------------------------------------------------------------------------------


def _na(reason: str | None) -> str:
    return f"N/A ({reason})" if reason else "N/A"


def _bits(f: Field, v: int) -> str:
    names = [name for bit, name in sorted((f.decode or {}).items()) if v & bit]
    unknown = v & ~sum(f.decode or {})
    if unknown:
        names.append(f"0x{unknown:x}")
    return ", ".join(names) if names else "none"


_FORMATS: dict[str, Any] = {
    "bytes": lambda f, v: f"{v / 2**30:.2f} GiB",  # IEC: what nvidia-smi's MiB mean
    "bytes_per_second": lambda f, v: f"{v / 1e9:.2f} GB/s",  # SI: how PCIe capacity is quoted
    "percent": lambda f, v: f"{v * 100:.1f} %",
    "celsius": lambda f, v: f"{v:.0f} °C" if float(v).is_integer() else f"{v:.1f} °C",
    "watts": lambda f, v: f"{v:.1f} W",
    "joules": lambda f, v: f"{v / 3.6e6:.2f} kWh",
    "megahertz": lambda f, v: f"{v / 1e6:.0f} MHz",
    "seconds": lambda f, v: f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s",
    "per_second": lambda f, v: f"{v:.1f}/s",
    "generation": lambda f, v: f"Gen{v}",
    "lanes": lambda f, v: f"x{v}",
    "yes_no": lambda f, v: "yes" if v else "no",
    "up_down": lambda f, v: "up" if v else "down",
    "count": lambda f, v: f"{int(v):,}",
    "number": lambda f, v: f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}",
    "code": lambda f, v: str(v),
    "text": lambda f, v: str(v),
    "decoded": lambda f, v: (f.decode or {}).get(int(v), str(v)),
    "bits": _bits,
}


def fmt(f: Field | tuple[str | None, str], value: Any, reason: str | None = None) -> str:
    """A value as reports print it, by the field's ``display``; ``N/A (reason)`` for ``None``.

    Args:
        f: the field, or its ``(table, name)``.
        value: in base units; ``None`` when unknown.
        reason: why it is unknown (shown only when ``value`` is ``None``).
    """
    field = f if isinstance(f, Field) else get(*f)
    if value is None:
        return _na(reason)
    text: str = _FORMATS[str(field.display)](field, value)
    return text


# -- docs/metrics.md -----------------------------------------------------------------------------

_TABLE_TITLES = {
    "gpus": "GPU identity (`gpus`, read at start and after a re-initialisation)",
    "gpu_samples": "GPU samples (`gpu_samples`, one row per GPU per tick)",
    None: "Derived, not stored (by the source, or by the exporter at each scrape: cadence export)",
    "gpu_process_samples": "GPU processes (`gpu_process_samples`, every host sample)",
    "xid_events": "XID events (`xid_events`, one row per event)",
    "host_samples": "Host (`host_samples`, every host sample)",
    "vllm_samples": "vLLM servers (`vllm_samples`, one row per server per poll)",
    "vllm_engine_samples": "vLLM data-parallel engines (`vllm_engine_samples`)",
    "vllm_instances": "vLLM server starts (`vllm_instances`)",
    "exporter": "Derived by the exporter at each scrape of `/metrics`, not stored",
    "agent": "The agent's own health (`/metrics` only)",
}


def _range(f: Field) -> str:
    if f.lo is None and f.hi is None:
        return "—"
    text = f"{f.lo:g} … {f.hi:g}"
    if f.limit == "pcie_link":
        text += ", ≤ 1.25 × max link capacity"
    elif f.limit == "memory_total":
        text += ", ≤ memory total"
    return text


def _prom(f: Field) -> str:
    if f.prometheus:
        labels = "".join(f'{{{k}="{v}"}}' for k, v in f.prom_labels.items())
        return f"`{f.prometheus}{labels}` ({f.prom_type})"
    if f.prom_label and f.table in INFO_METRICS:
        return f"label `{f.prom_label}` of `{INFO_METRICS[f.table]}`"
    return "—"


def _otel(f: Field) -> str:
    """Where ``--otlp`` pushes a field under an OpenTelemetry convention's name."""
    if not f.otel:
        return ""
    attrs = ", ".join(f'{k}="{v}"' for k, v in f.otel_attrs.items())
    return f" OTLP: `{f.otel}{{{attrs}}}`." if attrs else f" OTLP: `{f.otel}`."


def render_markdown() -> str:
    """The metrics reference as Markdown (the content of ``docs/metrics.md``)."""
    lines = [
        "# Metrics reference",
        "",
        "Generated from the field catalogue (`vgpumon/catalogue/`) by",
        "`python -m vgpumon.catalogue > docs/metrics.md`; do not edit by hand (a test keeps the two equal).",
        "",
        "Units are base units. `None` (NULL in the store, no sample in `/metrics`, `N/A (reason)` on",
        "screen) means not known. A value outside its valid range — or NaN, ±Inf, a blank sentinel",
        "(2^32−1, 2^64−1, DCGM's 32-bit, 64-bit and FP64 blanks) or a non-number — is rejected at the",
        "door: stored as NULL, counted per field and recorded with its reason in `rejected_values`.",
        "Cadence: fast = every tick (default 1 s), slow = every `--slow-every` ticks (default 10),",
        "minute = the first slow tick a minute after the last read (the calls that cost the driver most CPU),",
        "static = at start and after a re-initialisation, host = every `--host-every` ticks, poll = every",
        "vLLM poll, start = once per server start, export = derived by the exporter at each scrape.",
    ]
    for table in _TABLE_TITLES:
        rows = fields_of(table)
        if not rows:
            continue
        lines += ["", f"## {_TABLE_TITLES[table]}", ""]
        lines.append("| field | kind | unit | valid range | source | cadence | Prometheus | nvidia-smi / DCGM | rollup | note |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        for f in rows:
            names = " / ".join(f"`{n}`" for n in (f.smi, f.dcgm) if n) or "—"
            decode = ""
            if f.decode:
                shown = list(f.decode.items())
                decode = "; ".join(f"{hex(k) if f.kind == 'bitmask' else k} {v}" for k, v in shown[:9])
                decode = f" Codes: {decode}{' …' if len(shown) > 9 else ''}."
            lines.append(
                f"| `{f.name}` | {f.kind} | {f.unit} | {_range(f)} | {f.source} | {f.cadence} | {_prom(f)} | "
                f"{names} | {', '.join(f.rollup or ()) or '—'} | {f.help}{decode}{' ' + f.note if f.note else ''}{_otel(f)} |"
            )
    return "\n".join(lines) + "\n"
