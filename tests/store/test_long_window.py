"""A long ``diagnose`` window reads its whole minutes from the rollups and raw rows only at its
edges (``vgpumon.diagnose.windows``): the per-GPU figures a user reads equal those of the raw rows.

The store: 40 minutes of the H200 capture's real samples at 1 s on two GPUs, starting 17 s into a
minute; the first 30 minutes rolled up by the store's own rollup job, the last 10 left raw (as an
agent's newest minutes are); GPU 1 unreadable (``up`` false, every value NULL) for 90 s across
two minutes.
"""

from __future__ import annotations

import math

import pytest
from conftest import H200_CAPTURE, read_all

from vgpumon.diagnose.gpus import WINDOW_COLUMNS
from vgpumon.diagnose.windows import window_aggregates
from vgpumon.model import GpuIdentity
from vgpumon.sources.nvml.capture import ReplayBackend
from vgpumon.store import open_store
from vgpumon.store.codec import TS, UP, encode_gpu_sample
from vgpumon.store.retention import Retention
from vgpumon.store.schema import GpuSampleRow

T0 = 1_800_000_017.0  # 17 s into a minute
GPUS = [GpuIdentity(index=i, uuid=f"GPU-long-{i}", name="NVIDIA H200", memory_total_bytes=150_754_820_096) for i in (0, 1)]
REL_TOL = 0.005  # the stated error of a long window's means (docs/diagnose.md, "Long windows")
DOWN = (T0 + 12 * 60 + 30, T0 + 14 * 60)  # GPU 1 unreadable


def _rows(gpu_id: int, samples: list, seconds: range, down: bool) -> list[tuple]:
    rows = []
    for t in seconds:
        row = list(encode_gpu_sample(gpu_id, samples[t % len(samples)]))
        ts = T0 + t
        row[TS] = int(ts * 1000)
        if down and DOWN[0] <= ts < DOWN[1]:
            row = [v if i in (0, TS) else None for i, v in enumerate(row)]
            row[UP] = False
        rows.append(tuple(row))
    return rows


@pytest.fixture
def store(db_url):
    _, ticks = read_all(ReplayBackend(H200_CAPTURE))
    samples = [t.samples[0] for t in ticks]
    s = open_store(db_url)
    ids = s.register_gpus("long", GPUS)
    gids = [ids[g.uuid] for g in GPUS]
    for n, g in enumerate(gids):
        s.write_gpu_rows(_rows(g, samples, range(30 * 60), down=n == 1))
    rolled = Retention(s, raw_retention_s=30 * 86400, rollup_retention_s=90 * 86400, clock=lambda: T0 + 30 * 60 + 1).run()
    # (the job rolls up to ten minutes a GPU per step; how many of the 30 it reached is the merge's
    # middle, whatever its length: the test needs some rolled minutes and a raw tail after them)
    assert rolled.minutes_rolled_up >= 2 * 10 and s.rollup_watermark(gids) is not None
    for n, g in enumerate(gids):
        s.write_gpu_rows(_rows(g, samples, range(30 * 60, 40 * 60), down=n == 1))
    yield s, gids
    s.close()


def _unit(column: str) -> float:
    """One stored unit of the column, in base units (a minute's mean is kept to it)."""
    kind = GpuSampleRow.__table__.c[column].type
    scale = getattr(kind, "scale", 1)
    return scale if getattr(kind, "coarse", False) else 1 / scale


@pytest.mark.parametrize("start_s", [5.5, 61.0, 0.0], ids=["mid-minute", "whole-minute", "first-tick"])
def test_a_long_window_from_rollups_gives_the_raw_rows_figures(store, start_s):
    s, gids = store
    start, end = T0 + start_s, T0 + 40 * 60 - 1
    assert s.rollup_watermark(gids) is not None and s.rollup_watermark(gids) < end - 60  # a raw tail
    raw = s.window_aggregates_many(gids, start, end, WINDOW_COLUMNS)
    merged = window_aggregates(s, gids, start, end, WINDOW_COLUMNS, long_window_s=0)
    assert raw[gids[1]]["up_samples"] == raw[gids[1]]["samples"] - 90  # the outage is in the window
    diffs = []
    for g in gids:
        assert set(merged[g]) == set(raw[g])
        for key, want in raw[g].items():
            got = merged[g][key]
            if key.endswith("_mean") and want is not None and got is not None:
                # each minute's mean is stored to the column's unit and weighed by its answered
                # samples (a GPM ratio is missing on some answered ticks): within one unit or 0.5 %
                if not math.isclose(got, want, rel_tol=REL_TOL, abs_tol=_unit(key[: -len("_mean")])):
                    diffs.append((g, key, want, got))
            elif got != want:
                diffs.append((g, key, want, got))
    assert not diffs, diffs


def test_a_short_window_stays_on_raw_rows(store):
    s, gids = store
    end = T0 + 40 * 60 - 1
    assert window_aggregates(s, gids, end - 900, end, WINDOW_COLUMNS) == s.window_aggregates_many(gids, end - 900, end, WINDOW_COLUMNS)
