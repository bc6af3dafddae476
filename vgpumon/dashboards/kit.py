"""The few rules every generated panel follows, written once over grafana-foundation-sdk.

* **Units come from the catalogue.** ``unit(metric)`` maps a family's base unit to Grafana's unit
  id: bytes in IEC ``bytes`` (NVML's MiB are IEC; Grafana's SI ``decmbytes`` reads 4.9 % low,
  FACTS §7), PCIe bytes/s in SI ``Bps`` (link capacities are quoted in GB/s), ratios as
  ``percentunit``.
* **Counters through ``rate()``/``increase()`` over ``$__rate_interval``** (``rate`` and
  ``increase`` below): the window follows the scrape interval, so a panel is never empty or
  jagged because the window holds fewer than two scrapes.
* **Ratios as ``num / (den > 0)``** (``ratio``): a zero denominator gives no point, not ±Inf.
* **Stat panels reduce to the last value** (``stat``), never a sum over the range.
* **Enums and bitmasks show their names**: value mappings from the catalogue's decode tables.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from grafana_foundation_sdk.builders import bargauge, prometheus, statetimeline, timeseries
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import stat as statb
from grafana_foundation_sdk.builders import table as tableb
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

from vgpumon import catalogue

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE_WINDOW = "$__rate_interval"

#: Catalogue unit → Grafana unit id.
GRAFANA_UNITS: dict[str, str] = {
    "bytes": "bytes",  # IEC (KiB, MiB, GiB): what NVML and nvidia-smi mean by MiB
    "bytes_per_second": "Bps",  # SI (kB/s, MB/s, GB/s): how PCIe capacity is quoted (FACTS §3)
    "ratio": "percentunit",
    "celsius": "celsius",
    "watts": "watt",
    "joules": "joule",
    "hertz": "hertz",
    "seconds": "s",
    "per_second": "ops",
    "count": "short",
    "tokens": "short",
    "generation": "none",
    "lanes": "none",
    "load": "short",
    "cores": "short",
    "code": "none",
    "bool": "none",
    "text": "none",
}
#: Unit of ``rate()`` of a counter of this unit: joules per second are watts, seconds per second
#: a share of time, counts per second ``cps``.
RATE_UNITS: dict[str, str] = {"joules": "watt", "seconds": "percentunit", "count": "cps"}
#: Families whose unit is not their catalogue unit's default: a memory growth rate is IEC like
#: the memory it grows (the default for bytes/s is SI, for PCIe); rates say what they count.
UNIT_OVERRIDES: dict[str, str] = {
    "vgpumon_gpu_memory_used_slope_bytes_per_second": "binBps",
    "vgpumon_vllm_prompt_tokens_per_second": "suffix: tok/s",
    "vgpumon_vllm_generation_tokens_per_second": "suffix: tok/s",
    "vgpumon_vllm_requests_finished_per_second": "reqps",
    "vgpumon_vllm_preemptions_per_second": "reqps",
}
_UNITS = {f.prometheus: f.unit for f in catalogue.FIELDS if f.prometheus}
_DECODE = {f.prometheus: f.decode for f in catalogue.FIELDS if f.prometheus and f.decode}
_YES_NO = {0: "no", 1: "yes"}


def unit(metric: str) -> str:
    """Grafana unit of a catalogue family (``KeyError`` for a name the catalogue lacks)."""
    return UNIT_OVERRIDES.get(metric) or GRAFANA_UNITS[_UNITS[metric]]


def rate_unit(metric: str) -> str:
    """Grafana unit of ``rate()`` of a catalogue counter."""
    return RATE_UNITS[_UNITS[metric]]


def sel(*matchers: str) -> str:
    """A label selector: ``sel('hostname=~"$host"')`` → ``{hostname=~"$host"}``."""
    return "{" + ", ".join(matchers) + "}"


def rate(metric: str, selector: str) -> str:
    return f"rate({metric}{selector}[{RATE_WINDOW}])"


def increase(metric: str, selector: str) -> str:
    return f"increase({metric}{selector}[{RATE_WINDOW}])"


def ratio(num: str, den: str, on: str | None = None) -> str:
    """``num / (den > 0)``: no point where the denominator is 0 (vLLM's own dashboards do so);
    ``on``: the labels to match on (``num / on (a, b) (den > 0)``)."""
    return f"{num} / {f'on ({on}) ' if on else ''}({den} > 0)"


class Q:
    """One Prometheus query of a panel."""

    def __init__(self, expr: str, legend: str = "", *, instant: bool = False, fmt: str | None = None) -> None:
        self.expr, self.legend, self.instant, self.fmt = expr, legend, instant, fmt

    def build(self, ref: str) -> prometheus.Dataquery:
        q = prometheus.Dataquery().expr(self.expr).ref_id(ref).datasource(DS)
        if self.legend:
            q = q.legend_format(self.legend)
        q = q.instant() if self.instant else q.range()
        if self.fmt is not None:
            q = q.format(pm.PromQueryFormat(self.fmt))
        return q


def _targets(panel, queries: Sequence[Q]):
    for i, q in enumerate(queries):
        panel = panel.with_target(q.build(chr(ord("A") + i)))
    return panel


def mappings(table: Mapping[int, str]) -> list[dm.ValueMap]:
    return [dm.ValueMap(options={str(k): dm.ValueMappingResult(text=v, index=i) for i, (k, v) in enumerate(sorted(table.items()))})]


def decode(metric: str) -> list[dm.ValueMap]:
    """Value mappings of an enum family from its catalogue decode table (P0…P15, modes)."""
    return mappings(_DECODE[metric])


def yes_no() -> list[dm.ValueMap]:
    return mappings(_YES_NO)


def _common(panel, title: str, description: str, queries: Sequence[Q], unit_id: str, w: int, h: int):
    return _targets(panel.title(title).description(description).datasource(DS).unit(unit_id).span(w).height(h), queries)


def ts(
    title: str, description: str, *queries: Q, unit: str, w: int = 12, h: int = 8, min_: float | None = 0,
    max_: float | None = None, maps: list[dm.ValueMap] | None = None, bars: bool = False, no_value: str | None = None,
    dashed: str | None = None,
) -> timeseries.Panel:
    """A time series panel. ``dashed``: a regexp of series names drawn as dashed lines
    (capacities beside the rates they bound)."""
    p = _common(timeseries.Panel(), title, description, queries, unit, w, h)
    p = p.legend(cb.VizLegendOptions().show_legend(True).display_mode(cm.LegendDisplayMode.TABLE).placement(cm.LegendPlacement.BOTTOM).calcs(["lastNotNull", "max"]))
    if min_ is not None:
        p = p.min(min_)
    if max_ is not None:
        p = p.max(max_)
    if maps:
        p = p.mappings(maps)
    if bars:
        p = p.draw_style(cm.GraphDrawStyle.BARS).fill_opacity(80)
    if no_value is not None:
        p = p.no_value(no_value)
    if dashed is not None:
        p = p.override_by_regexp(dashed, [
            dm.DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
            dm.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
        ])
    return p


def stat(
    title: str, description: str, *queries: Q, unit: str, w: int = 6, h: int = 4, maps: list[dm.ValueMap] | None = None,
    thresholds: Iterable[tuple[float | None, str]] | None = None, no_value: str | None = None,
) -> statb.Panel:
    """A stat panel reducing each series to its **last** value (a "now" figure must never be a
    sum of the samples in the range, FACTS §7)."""
    p = _common(statb.Panel(), title, description, queries, unit, w, h)
    p = p.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)).graph_mode(cm.BigValueGraphMode.NONE)
    if maps:
        p = p.mappings(maps)
    if thresholds is not None:
        p = p.thresholds(_thresholds(thresholds)).color_mode(cm.BigValueColorMode.BACKGROUND)
    if no_value is not None:
        p = p.no_value(no_value)
    return p


def bar(title: str, description: str, *queries: Q, unit: str, w: int = 12, h: int = 8, max_: float | None = None) -> bargauge.Panel:
    """Bars of instant values (one per series), each reduced to its last value."""
    p = _common(bargauge.Panel(), title, description, queries, unit, w, h)
    p = p.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)).min(0)
    p = p.display_mode(cm.BarGaugeDisplayMode.GRADIENT).orientation(cm.VizOrientation.HORIZONTAL)
    if max_ is not None:
        p = p.max(max_)
    return p


def table(
    title: str, description: str, *queries: Q, unit: str, w: int = 24, h: int = 8, hide: Sequence[str] = ("Time", "__name__"),
    rename: Mapping[str, str] | None = None, maps: list[dm.ValueMap] | None = None,
) -> tableb.Panel:
    """A table of instant queries (``format: table``), merged on their labels; one row per series."""
    queries = tuple(Q(q.expr, q.legend, instant=True, fmt="table") for q in queries)
    p = _common(tableb.Panel(), title, description, queries, unit, w, h)
    if len(queries) > 1:
        p = p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
    p = p.with_transformation(
        dm.DataTransformerConfig(id_val="organize", options={"excludeByName": {k: True for k in hide}, "renameByName": dict(rename or {})})
    )
    if maps:
        p = p.mappings(maps)
    return p


def states(title: str, description: str, *queries: Q, w: int = 24, h: int = 8, maps: list[dm.ValueMap] | None = None) -> statetimeline.Panel:
    """A state timeline (one row per series, coloured by value)."""
    p = _common(statetimeline.Panel(), title, description, queries, "none", w, h)
    if maps:
        p = p.mappings(maps)
    return p


def _thresholds(steps: Iterable[tuple[float | None, str]]) -> db.ThresholdsConfig:
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps([dm.Threshold(value=v, color=c) for v, c in steps])


def variables(model_source: str, model_label: str, model_title: str, gpu_source: str) -> list:
    """Data source, model, host and GPU variables, chained: the model narrows the hosts, the hosts
    the GPUs. Every ``All`` is the regexp ``.*``, which also matches a missing label (a vLLM server
    whose model is not known yet)."""

    def query(name: str, label: str, expr: str) -> db.QueryVariable:
        return (
            db.QueryVariable(name).label(label).datasource(DS).query(expr).multi(True).include_all(True).all_value(".*")
            .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.NATURAL_ASC)
        )

    return [
        db.DatasourceVariable("datasource").label("Data source").type("prometheus"),
        query("model", model_title, f"label_values({model_source}, {model_label})"),
        query("host", "Host", f'label_values({model_source}{{{model_label}=~"$model"}}, hostname)'),
        query("gpu", "GPU", f'label_values({gpu_source}{{hostname=~"$host"}}, gpu)'),
    ]


def dashboard(uid: str, title: str, description: str, tags: Sequence[str], vars_: list, rows: Sequence[tuple[str, Sequence]]) -> db.Dashboard:
    """A dashboard of rows of panels; panel ids are assigned in order, so regenerating gives the
    same file."""
    d = (
        db.Dashboard(title).uid(uid).description(description).tags(["vgpumon", *tags]).editable().refresh("30s")
        .time("now-1h", "now").timezone("browser").tooltip(dm.DashboardCursorSync.CROSSHAIR)
    )
    for v in vars_:
        d = d.with_variable(v)
    next_id = 1
    for title_, panels in rows:
        d = d.with_row(db.Row(title_).id(next_id))
        next_id += 1
        for p in panels:
            d = d.with_panel(p.id(next_id))
            next_id += 1
    return d
