"""The field catalogue is the one place a field's facts live: every table column, typed-record
attribute, rollup, display and docs row has an entry, and every entry has each of them."""

from __future__ import annotations

import ast
import math
import re
from dataclasses import fields
from pathlib import Path

import pytest

from vgpumon import catalogue
from vgpumon.catalogue import AGGREGATES, FIELDS, KINDS, UNIT_SUFFIXES, Door, Rejected, fields_of, fmt, render_markdown
from vgpumon.catalogue.exporter import SHARE_OF_LINK_MAX
from vgpumon.model import GpuIdentity, GpuSample, HostSample, ServerSample
from vgpumon.store.schema import FixedPoint, column_type, gpu_samples_1m, metadata, rollup_column_name

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "metrics.md"

#: Columns that are keys or identity, not fields (they carry no reading).
STRUCTURAL = {
    "gpus": {"id", "host_id", "index", "first_seen", "last_seen"},
    "gpu_samples": {"gpu_id", "ts"},
    "gpu_process_samples": {"gpu_id", "ts", "process_id"},
    "xid_events": {"id", "gpu_id", "ts", "seq"},
    "host_samples": {"host_id", "ts"},
    "vllm_samples": {"instance_id", "ts"},
    "vllm_engine_samples": {"instance_id", "ts", "model_name", "engine"},
    "vllm_instances": {
        "id", "host_id", "address", "port", "url", "origin", "pid", "process_start", "first_seen", "last_seen",
        "first_connect", "ready", "ended",
    },
}
#: Typed-record attributes that are not fields: identity, the reasons map, collections that have
#: tables of their own (processes, XID events).
NOT_FIELDS = {"ts", "uuid", "index", "missing", "processes", "xid_counts", "xid_last_seen"}


def _type_signature(t):
    if isinstance(t, FixedPoint):
        return ("fixed", t.scale, t.coarse)
    return (type(t).__name__, getattr(t, "length", None))


@pytest.mark.parametrize("table", catalogue.TABLES)
def test_every_column_has_an_entry_and_every_entry_a_column_of_its_type(table):
    tbl = metadata.tables[table]
    columns = {c.name: c for c in tbl.columns if c.name not in STRUCTURAL[table]}
    entries = {f.name: f for f in fields_of(table)}
    assert sorted(set(columns) - set(entries)) == [], "columns without a catalogue entry"
    assert sorted(set(entries) - set(columns)) == [], "catalogue fields without a column"
    for name, col in columns.items():
        f = entries[name]
        assert _type_signature(col.type) == _type_signature(column_type(f.encoding)), name
        assert col.nullable == (not f.required), name


def test_typed_records_carry_exactly_the_catalogue_fields():
    def attrs(cls):
        return {f.name for f in fields(cls)} - NOT_FIELDS

    derived = {f.name for f in fields_of(None) if f.cadence != "export"}  # the exporter's own are no sample's
    gpu = {f.name for f in fields_of("gpu_samples")} | derived
    assert attrs(GpuSample) == gpu
    assert attrs(GpuIdentity) | {"uuid"} == {f.name for f in fields_of("gpus")}
    assert attrs(HostSample) == {f.name for f in fields_of("host_samples")}
    # a server sample has more (state reason, identity, the parsed scrape); the stored ones are fields
    stored_elsewhere = {"telemetry_up": "telemetry", "latency_unreliable_reason": "latency_unreliable"}
    for f in fields_of("vllm_samples"):
        assert stored_elsewhere.get(f.name, f.name) in {a.name for a in fields(ServerSample)}, f.name


def test_every_gpu_sample_field_has_a_rollup_rule_and_every_rollup_column_a_field():
    for f in fields_of("gpu_samples"):
        assert set(f.rollup) <= AGGREGATES, f.name
        if f.name not in {"up", "activity_source"}:  # counted as samples / up_samples instead
            assert f.rollup, f"{f.name} has no rollup rule: it would silently roll up as nothing"
    wanted = {rollup_column_name(f.name, a) for f in fields_of("gpu_samples") for a in f.rollup}
    have = {c.name for c in gpu_samples_1m.columns} - {"gpu_id", "ts", "samples", "up_samples", "folded_samples"}
    assert have == wanted


def test_every_field_displays_its_range_and_unknown():
    for f in FIELDS:
        assert f.kind in KINDS and f.unit in UNIT_SUFFIXES, f.name
        assert f.label and f.help.endswith("."), f.name
        assert fmt(f, None, "not supported") == "N/A (not supported)"
        if f.encoding.kind in ("text", "code"):
            assert fmt(f, "x") == "x"
            continue
        for v in (f.lo, f.hi):
            if f.integral or f.encoding.kind == "bool":
                v = int(v)
            assert fmt(f, v), f.name


def test_docs_metrics_md_is_generated_from_the_catalogue_and_has_a_row_per_field():
    text = DOC.read_text()
    assert text == render_markdown(), "run: python -m vgpumon.catalogue > docs/metrics.md"
    for f in FIELDS:
        assert f"| `{f.name}` |" in text, f.name


def test_names_carry_base_units_and_prometheus_conventions():
    exported = {}
    for f in FIELDS:
        suffix = UNIT_SUFFIXES[f.unit]
        base = f.name[: -len("_total")] if f.name.endswith("_total") else f.name
        assert base.endswith(suffix), f"{f.name} does not end in its unit {suffix}"
        assert not re.search(r"_(percent|milliwatts|mib|mb|mhz|kb|ms)(_|$)", f.name), f.name
        if f.kind == "counter":
            assert f.name.endswith("_total"), f.name
        if f.prometheus is None:
            continue
        assert re.fullmatch(r"vgpumon_[a-z0-9_]+", f.prometheus), f.prometheus
        assert f.prom_type in {"gauge", "counter"}
        if f.prom_type == "counter":
            assert f.prometheus.endswith("_total"), f.prometheus
        else:
            assert not f.prometheus.endswith("_total"), f"gauge {f.prometheus} must not end in _total"
        pbase = f.prometheus[: -len("_total")] if f.prometheus.endswith("_total") else f.prometheus
        assert pbase.endswith(suffix), f"{f.prometheus}: unit suffix {suffix!r} missing"
        key = (f.prometheus, tuple(sorted(f.prom_labels.items())))
        assert key not in exported, f"{f.prometheus} {f.prom_labels} exported by {exported.get(key)} and {f.name}"
        exported[key] = f.name


def test_each_range_is_physical_and_fits_its_column():
    for f in FIELDS:
        if f.encoding.kind == "text":
            assert f.encoding.length, f.name
            continue
        if f.encoding.kind == "code":  # set by the source from its own table, never from outside
            assert f.encoding.codes and f.lo is None and f.hi is None, f.name
            continue
        assert f.lo is not None and f.hi is not None and math.isfinite(f.lo) and math.isfinite(f.hi), f.name
        assert f.lo <= f.hi, f.name
        if f.encoding.kind in ("fixed", "int"):
            for v in (f.lo, f.hi):
                assert abs(f.encoding.stored(v)) <= f.encoding.max_stored, f.name
        if f.kind == "counter":
            assert f.lo == 0, f.name
        if f.unit == "ratio":
            # a share of PCIe link capacity reads up to the door's 1.25 × capacity (the counters
            # include protocol overhead); every other ratio is a share of a whole
            hi = SHARE_OF_LINK_MAX if f.name.endswith("_link_share_ratio") else 1
            assert (f.lo, f.hi) == (0, hi), f.name
        if f.decode:
            assert f.kind in {"enum", "bitmask"}, f.name


@pytest.mark.parametrize(
    "raw, why",
    [
        (float("nan"), "NaN"),
        (float("inf"), "infinite"),
        (float("-inf"), "infinite"),
        ("[N/A]", "not a number"),
        (4294967295, "2^32-1"),
        (18446744073709551615, "2^64-1"),
        (2147483632, "DCGM 32-bit blank"),
        (9223372036854775794, "DCGM 64-bit blank"),
        (140737488355328.0, "DCGM FP64 blank"),
    ],
)
def test_the_door_rejects_what_no_field_may_hold(raw, why):
    door = Door(FIELDS)
    numeric = {f.name for f in FIELDS if f.encoding.kind not in ("text", "code")}
    for name in numeric:
        with pytest.raises(Rejected) as exc:
            door.value(name, raw)
        assert why in exc.value.reason and exc.value.reason.startswith("rejected: "), (name, exc.value.reason)
    assert door.rejected == {name: 1 for name in numeric}


def test_the_door_admits_the_range_converts_units_and_applies_device_bounds():
    door = Door(fields_of("gpu_samples"))
    assert door.value("utilization_gpu_ratio", 99, 0.01) == pytest.approx(0.99)
    assert door.value("sm_active_ratio", 100.0000001, 0.01) == 1.0  # GPM float arithmetic, clamped
    assert door.value("power_watts", 123456, 1e-3) == pytest.approx(123.456)
    assert door.value("performance_state", 0) == 0 and isinstance(door.value("performance_state", 0), int)
    assert door.value("remapped_rows_pending", 1) is True
    with pytest.raises(Rejected, match="outside 0..1 ratio"):
        door.value("utilization_gpu_ratio", 150, 0.01)
    with pytest.raises(Rejected, match="above the device's bound"):  # 4.4 TB/s on a 63 GB/s link
        door.value("pcie_rx_bytes_per_second", 4.4e12, 1.0, limit=1.25 * 63.0e9)
    assert door.value("pcie_rx_bytes_per_second", 59.2e9, 1.0, limit=1.25 * 63.0e9) == 59.2e9
    with pytest.raises(Rejected, match="not a whole number"):
        door.value("pcie_link_gen_current", 4.5)
    assert door.rejected == {"utilization_gpu_ratio": 1, "pcie_rx_bytes_per_second": 1, "pcie_link_gen_current": 1}


def test_the_store_imports_no_source():
    """History must not depend on the code that reads hardware: what crosses from a source to the
    store is model (``vgpumon.model``). Checked on the source text, so a lazy import counts too."""
    offenders = []
    for path in sorted((ROOT / "vgpumon" / "store").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("vgpumon.sources")]
    assert offenders == []
