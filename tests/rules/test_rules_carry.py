"""The agent's rules runner carries the slow-set counters' newest values from one evaluation to
the next (``CarriedValues``) and reads only the rows stored since: what the rules see must be what
the store holds (the newest stored value of each column) at every evaluation time."""

from __future__ import annotations

import pytest
from conftest import H200_CAPTURE
from rules_support import replay
from sqlalchemy import event

from vgpumon.rules.view import LAST_READ, CarriedValues
from vgpumon.store import Store
from vgpumon.testing import scenarios

#: nvmlDeviceGetTotalEccErrors(NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC)
ECC_UNCORRECTED_VOLATILE = ("nvmlDeviceGetTotalEccErrors", [1, 0])


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """The recorded H200 workload repeated to 15 minutes, as 2 GPUs (slow set every 10 ticks,
    minute set each minute), its volatile uncorrectable ECC counter rising by one at each slow
    tick: a counter that moves only every 10 s, between evaluations every 15 s."""
    url = f"sqlite:///{tmp_path_factory.mktemp('carry') / 'c.db'}"
    header, ticks = scenarios.repeat(*scenarios.load(str(H200_CAPTURE)), 12)
    fn, args = ECC_UNCORRECTED_VOLATILE
    slow = [t["tick"] for t in ticks if t["tick"] >= 0 and t["tick"] % int(header.get("slow_every", 10)) == 0]
    for n, tick in enumerate(slow):
        header, ticks = scenarios.set_call(header, ticks, 0, fn, {"v": n}, at=[tick], args=args)
    replay(url, *scenarios.replicate_devices(header, ticks, 2))
    return url


def _reads_of_raw_rows(store: Store) -> list[tuple]:
    """The parameters of each query of raw rows the store makes from now on."""
    seen: list[tuple] = []

    @event.listens_for(store.engine, "after_cursor_execute")
    def record(conn, cursor, statement, params, context, executemany):  # noqa: ARG001
        if "FROM gpu_samples" in statement:
            seen.append(tuple(params))

    return seen


def _truth(store: Store, ids: list[int], at: float) -> dict[int, dict[str, tuple[float, object] | None]]:
    """The newest non-NULL value of each column at or before ``at``, from every raw row."""
    out: dict[int, dict[str, tuple[float, object] | None]] = {}
    for gid in ids:
        rows = store.series(gid, 0.0, at, LAST_READ)
        out[gid] = {c: next(((r["ts"], r[c]) for r in reversed(rows) if r[c] is not None), None) for c in LAST_READ}
    return out


def _open(url: str) -> tuple[Store, list[int], float]:
    """The store, its host's GPU ids and the newest tick's time."""
    store = Store(url)
    ids = [g.id for g in store.gpus_of("h")]
    return store, ids, store.newest_ts(ids)


def test_carried_values_are_the_newest_stored_at_every_evaluation(stored):
    store, ids, newest = _open(stored)
    try:
        carry = CarriedValues()
        at = newest - 14 * 60.0
        compared, moved = 0, {c: 0 for c in LAST_READ}
        previous = None
        while at <= newest:
            got = carry.read(store, ids, at, LAST_READ)
            assert got == _truth(store, ids, at), at
            if previous is not None:
                for c in LAST_READ:
                    moved[c] += any(got[g][c] != previous[g][c] for g in ids)
            previous, at, compared = got, at + 15.0, compared + 1
        # 57 evaluations, a whole read among them after 10 minutes; the counter moved at each
        assert compared == 57
        assert moved["ecc_uncorrected_volatile_total"] == compared - 1
        assert moved["memory_used_bytes"] > 0
        assert all(got[g]["ecc_uncorrected_volatile_total"][1] >= 80 for g in ids)
    finally:
        store.close()


def test_a_row_stored_after_the_read_is_found_and_time_going_back_reads_again(stored):
    store, ids, newest = _open(stored)
    try:
        carry = CarriedValues()
        first = carry.read(store, ids, newest - 60.0, ("memory_used_bytes",))
        # a later evaluation reads rows since the previous one only (and its overlap)
        reads = _reads_of_raw_rows(store)
        later = carry.read(store, ids, newest, ("memory_used_bytes",))
        # one query, not a seek per GPU; from the previous evaluation (less its overlap) on
        assert len(reads) == 1
        gids, start_ms, end_ms = reads[0][:-2], reads[0][-2], reads[0][-1]  # ts bound in epoch ms
        assert sorted(gids) == sorted(ids) and end_ms == round(newest * 1000)
        assert start_ms == round((newest - 60.0 - CarriedValues.OVERLAP_SECONDS) * 1000)
        assert later == {g: {"memory_used_bytes": v["memory_used_bytes"]} for g, v in _truth(store, ids, newest).items()}
        assert later != first
        # back in time (a store restored, a clock stepped): a whole read, not a stale answer
        back = carry.read(store, ids, newest - 60.0, ("memory_used_bytes",))
        assert back == first
    finally:
        store.close()


# -- what a whole read would no longer say, or says from the rollups ---------------------------


def _bare_store(tmp_path, n: int):
    from vgpumon.model.gpu import GpuIdentity
    from vgpumon.store import open_store

    store = open_store(f"sqlite:///{tmp_path / 's.db'}")
    ids = store.register_gpus("h", [GpuIdentity(index=i, uuid=f"GPU-{i}") for i in range(n)])
    return store, [ids[f"GPU-{i}"] for i in range(n)]


def _put(store: Store, table, rows: list[dict]) -> None:
    from sqlalchemy import insert

    with store.engine.begin() as conn:
        conn.execute(insert(table), rows)


def test_a_gpu_that_stopped_reporting_has_its_counts_dropped_after_the_whole_reads_horizon(tmp_path):
    """A GPU taken out (its rows stop, another reports on): after ``LAST_RAW_SECONDS +
    LAST_ROLLUP_SECONDS`` its ECC count is no longer "the current count" to a whole read
    (``diagnose``'s); the carried value must go too, or its latched alert fires for ever."""
    from vgpumon.store.schema import GpuSampleRow, gpu_samples_1m

    store, (g0, g1) = _bare_store(tmp_path, 2)
    t0 = 1_700_000_040.0
    col = ("ecc_uncorrected_volatile_total",)
    _put(store, GpuSampleRow.__table__, [{"gpu_id": g0, "ts": t0, "up": True, col[0]: 3},
                                         {"gpu_id": g1, "ts": t0, "up": True, col[0]: 0}])
    _put(store, gpu_samples_1m, [{"gpu_id": g0, "ts": t0 - 40, "samples": 1, "up_samples": 1, "folded_samples": 0, f"{col[0]}_last": 3}])
    carry, at = CarriedValues(), t0
    seen_until = None
    while at < t0 + 8 * 86400:
        at += 100.0  # within the whole read's raw window of the previous time, as every 15 s would be
        if int(at) % 3600 < 100:  # GPU 1 reports on (a row an hour is enough here)
            _put(store, GpuSampleRow.__table__, [{"gpu_id": g1, "ts": at, "up": True, col[0]: 0}])
        got = carry.read(store, [g0, g1], at, col)[g0][col[0]]
        whole = store.last_values_many([g0, g1], at, col)[g0][col[0]]
        # the same count while a whole read has one (it dates it by the rollup's minute), none after
        assert (got is None) == (whole is None) and (got is None or got[1] == whole[1]), at - t0
        if got is not None:
            seen_until = at
    assert seen_until is not None and 6.9 * 86400 < seen_until - t0 <= 7.01 * 86400
    store.close()


def test_rules_catching_up_after_an_outage_see_the_counts_folded_into_rollups(tmp_path):
    """The store was away long enough for the agent to fold its oldest held ticks into 1-minute
    rollups; when it is back the runner walks through those minutes every 15 s of data time. The
    ECC count they hold (2) must be what the rules see there, not the count from before the outage
    (0) carried on: the alert would start minutes late."""
    from vgpumon.alerts.runner import RuleRunner
    from vgpumon.store.schema import GpuSampleRow, gpu_samples_1m

    store, (g0,) = _bare_store(tmp_path, 1)
    t0 = 1_700_000_020.0
    col = "ecc_uncorrected_volatile_total"
    _put(store, GpuSampleRow.__table__, [{"gpu_id": g0, "ts": t0 - 600 + 10 * k, "up": True, col: 0} for k in range(61)])
    runner = RuleRunner(wall=None)
    runner._store, runner._hostname = store, "h"
    runner._evaluate()  # the last cycle before the outage: it carries 0 on
    minute0 = t0 - t0 % 60
    _put(store, gpu_samples_1m, [{"gpu_id": g0, "ts": minute0 + 60 * m, "samples": 60, "up_samples": 60,
                                   "folded_samples": 60, f"{col}_last": 2} for m in range(1, 11)])
    _put(store, GpuSampleRow.__table__, [{"gpu_id": g0, "ts": minute0 + 660 + 10 * k, "up": True, col: 2} for k in range(60)])
    seen: list[tuple[float, object]] = []
    evaluate = runner.engine.evaluate

    def spy(view, due, newest=None):
        seen.append((view.at, view.last_values(g0, (col,))[col]))
        return evaluate(view, due, newest)

    runner.engine.evaluate = spy  # type: ignore[method-assign]
    runner._evaluate()
    # past the pre-outage rows' 2 minutes (a whole read prefers a raw value within them)
    folded = [(at, v) for at, v in seen if t0 + Store.LAST_RAW_SECONDS < at <= minute0 + 600]
    assert len(folded) >= 25
    assert all(v is not None and v[1] == 2 for _, v in folded), folded[:3]
    store.close()


def test_a_level_step_just_before_the_evaluation_is_never_a_negative_duration():
    """A live report once read "GpuMemoryLeak (GPU 0): only -473 s since a level step or a
    break": a step's settling span (10 min) reached past the evaluation. It says how long the
    step still settles; a time ahead of the clock is never printed as a negative duration."""
    from vgpumon.base.fmt import duration
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.rules.leak import assess

    th, at = Thresholds(), 1_796_000_000.0
    start = at - 7 * 3600
    points = [(start + 60 * i, 10e9 if start + 60 * i < at - 120 else 12e9) for i in range(7 * 60 + 1)]
    state, trend, reason = assess(points, [], at, th, active=False)
    assert (state, trend) == ("unknown", None)
    assert reason.startswith("a level step or a break settles for another 9 min"), reason
    assert "-" not in reason.split(";")[0]
    assert duration(-47) == "47 s ahead (a clock step?)"
