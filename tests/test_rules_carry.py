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


def test_carried_values_are_the_newest_stored_at_every_evaluation(stored):
    store = Store(stored)
    try:
        ids = [g.id for g in store.gpus_of("h")]
        newest = store.newest_ts(ids)
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
    store = Store(stored)
    try:
        ids = [g.id for g in store.gpus_of("h")]
        newest = store.newest_ts(ids)
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
