"""The store on SQLite and Postgres: migrations, readers beside the writer, rollups and retention,
the queries reports use, and the backlog that keeps ticks while the store is away."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from conftest import H200_CAPTURE, count, replay_into, run_locked_sqlite
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.model import GpuIdentity, GpuSample
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.store import open_store
from vgpumon.store.codec import encode_gpu_sample
from vgpumon.store.engine import make_engine
from vgpumon.store.migrate import at_head, current_revision, head_revision, packaged_head, upgrade
from vgpumon.store.retention import Retention
from vgpumon.store.rollup import percentile
from vgpumon.store.schema import TIME_TABLES, metadata
from vgpumon.store.spool import Backlog
from vgpumon.testing import scenarios

_count = count


# -- migrations --------------------------------------------------------------------------------


def test_the_head_read_without_alembic_is_alembics_head(db_url):
    # the agent skips Alembic for a store at the packaged head: that head must be Alembic's own
    assert packaged_head() == head_revision()
    engine = make_engine(db_url)
    assert not at_head(engine)  # empty: upgrade decides
    upgrade(engine, "0010")
    assert not at_head(engine)  # behind: upgrade runs
    upgrade(engine)
    assert at_head(engine)


def test_opening_a_store_at_head_imports_no_migration_machinery(tmp_path):
    code = (
        "import sys\n"
        "from vgpumon.store import open_store\n"
        f"open_store({str(tmp_path / 'a.db')!r}).close()\n"  # creates and migrates: Alembic loaded
        "print('alembic' in sys.modules)\n"
    )
    import subprocess
    import sys

    first = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert first.stdout.split() == ["True"] and again.stdout.split() == ["False"]


def test_migrations_build_the_models_schema_and_rerun_is_a_noop(db_url):
    engine = make_engine(db_url)
    assert upgrade(engine) == (None, head_revision())
    assert upgrade(engine) == (head_revision(), head_revision())
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
        if engine.dialect.name == "postgresql":
            partitioned = set(conn.scalars(text("SELECT c.relname FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid")))
            assert partitioned == set(TIME_TABLES)
    engine.dispose()
    assert diff == [], "the models and the newest revision disagree: write a revision (docs/store.md)"


def test_store_made_before_migrations_is_stamped_and_keeps_its_rows(tmp_path):
    """A store created by the pre-migration `create_all` (revision 0001's tables, no history)."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)
    upgrade(engine, "0001")  # revision 0001's tables, then the history forgotten
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE alembic_version"))
    engine.dispose()
    agent = replay_into(url)  # open_store upgrades
    assert current_revision(make_engine(url)) == head_revision()
    assert _count(url, "SELECT count(*) FROM gpu_samples") == agent.stats.ticks


def test_many_agents_upgrading_one_postgres_at_once_migrate_it_once(db_url):
    if not db_url.startswith("postgresql"):
        pytest.skip("advisory lock: Postgres only")
    errors: list[BaseException] = []
    results: list[tuple] = []

    def run() -> None:
        engine = make_engine(db_url)
        try:
            results.append(upgrade(engine))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=run) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r[0] is None for r in results).count(True) == 1  # exactly one found it empty
    assert {r[1] for r in results} == {head_revision()}


# -- SQLite: readers never block the writer --------------------------------------------------------


def test_open_read_transaction_does_not_block_the_agent(tmp_path):
    """`diagnose` (or any reader) holding a read transaction open while the agent writes: the
    agent stores every tick without waiting, the reader keeps its consistent snapshot."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    first = replay_into(url)
    reader = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    reader.execute("BEGIN")
    assert reader.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == first.stats.ticks
    # GPUs 1 and 2 of a derived 3-GPU host are new: the agent adds 2 rows per tick
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 3)
    second = replay_into(url, scenarios.backend(header, ticks))  # a blocked writer would fail (busy_timeout)
    assert second.stats.rows_pending == 0 and second.stats.outages == 0
    assert reader.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == first.stats.ticks  # snapshot kept
    reader.execute("COMMIT")
    assert reader.execute("SELECT count(*) FROM gpu_samples").fetchone()[0] == first.stats.ticks * 3
    reader.close()


# -- queries ---------------------------------------------------------------------------------------


def test_percentiles_latest_and_window_agree_with_the_raw_values(db_url, store_of):
    replay_into(db_url)
    store = store_of(db_url)
    (gpu,) = store.gpus_of("h200-replay")
    rows = store.series(gpu.id, 0, 2e9, ("pcie_rx_bytes_per_second", "power_watts"))
    rx = sorted(r["pcie_rx_bytes_per_second"] for r in rows if r["pcie_rx_bytes_per_second"] is not None)
    got = store.window_percentiles(gpu.id, 0, 2e9, ("pcie_rx_bytes_per_second", "power_watts"))
    for q in (0.5, 0.95, 0.99):
        assert got["pcie_rx_bytes_per_second"][q] == pytest.approx(percentile(rx, q), rel=1e-9)
    assert got["power_watts"][0.99] <= max(r["power_watts"] for r in rows if r["power_watts"] is not None)
    latest = store.latest([gpu.id], ("power_watts",))
    assert latest[gpu.id]["ts"] == rows[-1]["ts"] and latest[gpu.id]["power_watts"] == rows[-1]["power_watts"]
    empty = store.window_percentiles(gpu.id, 0, 1, ("power_watts",))
    assert empty["power_watts"][0.5] is None


# -- retention and rollups -------------------------------------------------------------------------


def test_rollups_summarise_each_minute_then_raw_rows_expire(db_url, store_of):
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 2)
    agent = replay_into(db_url, scenarios.backend(header, ticks))
    store = store_of(db_url)
    gpus = store.gpus_of("h200-replay")
    newest = store.newest_ts([g.id for g in gpus])
    raw = store.series(gpus[0].id, 0, 2e9, ("pcie_rx_bytes_per_second", "memory_used_bytes"))
    minute = int(raw[len(raw) // 2]["ts"] // 60) * 60
    in_minute = [r for r in raw if minute <= r["ts"] < minute + 60]

    # 4 days later, with a 72 h raw window: everything is rolled up, then the raw rows expire
    clock = lambda: newest + 4 * 86400  # noqa: E731
    res = Retention(store, clock=clock).run()
    assert res.minutes_rolled_up >= 2 * 2
    (roll,) = [
        r for r in store.rollup_series(gpus[0].id, minute, minute, ("pcie_rx_bytes_per_second_max", "pcie_rx_bytes_per_second_p95", "memory_used_bytes_mean"))
    ]
    assert roll["samples"] == len(in_minute) and roll["folded_samples"] == 0
    rx = sorted(r["pcie_rx_bytes_per_second"] for r in in_minute)
    assert roll["pcie_rx_bytes_per_second_max"] == rx[-1]
    assert roll["pcie_rx_bytes_per_second_p95"] == pytest.approx(percentile(rx, 0.95), abs=1)
    assert roll["memory_used_bytes_mean"] == pytest.approx(sum(r["memory_used_bytes"] for r in in_minute) / len(in_minute), abs=1)
    assert _count(db_url, "SELECT count(*) FROM gpu_samples") == 0
    assert _count(db_url, "SELECT sum(samples) FROM gpu_samples_1m") == agent.stats.ticks * 2
    # 91 days later the rollups go too
    Retention(store, clock=lambda: newest + 91 * 86400).run()
    assert _count(db_url, "SELECT count(*) FROM gpu_samples_1m") == 0


def test_resolved_alerts_expire_with_the_rollups_and_open_ones_stay(db_url, store_of):
    """The alerts table used to grow for ever: every resolved episode of every rule was kept."""
    from vgpumon.model import Alert
    from vgpumon.store.alerts import AlertRepository

    store = open_store(db_url)  # the schema, no rows
    now, day = 2_000_000_000.0, 86400.0

    def episode(gpu: str, since: float, resolved: float | None) -> Alert:
        return Alert(name="GpuThermalSlowdown", severity="warning", labels={"hostname": "h", "gpu": gpu}, active_since=since,
                     last_eval=resolved or now, state="resolved" if resolved else "firing", fired_at=since, resolved_at=resolved)

    AlertRepository(store.engine).save("h", [
        episode("0", now - 120 * day, now - 100 * day),  # resolved 100 days ago: past the 90-day rollups
        episode("1", now - 20 * day, now - 10 * day),  # resolved 10 days ago: kept
        episode("2", now - 200 * day, None),  # firing for 200 days: open, kept
    ])
    Retention(store, clock=lambda: now).run()
    store.close()
    assert sorted(_count_rows(db_url, "SELECT labels FROM alerts")) == ['{"gpu": "1", "hostname": "h"}', '{"gpu": "2", "hostname": "h"}']


def _count_rows(url: str, sql: str) -> list:
    engine = make_engine(url)
    with engine.connect() as conn:
        rows = list(conn.scalars(text(sql)))
    engine.dispose()
    return rows


def test_raw_rows_are_not_pruned_before_they_are_rolled_up(db_url, store_of):
    agent = replay_into(db_url)
    store = store_of(db_url)
    newest = store.newest_ts([g.id for g in store.gpus_of("h200-replay")])
    step = Retention(store, max_minutes=1, clock=lambda: newest + 4 * 86400).step()  # one minute only
    assert step.minutes_rolled_up == 1 and step.more
    kept = _count(db_url, "SELECT count(*) FROM gpu_samples")
    rolled = _count(db_url, "SELECT sum(samples) FROM gpu_samples_1m")
    assert 0 < rolled < agent.stats.ticks
    # every tick is still there raw or rolled up; SQLite deleted exactly the rolled-up rows,
    # Postgres keeps the whole day partition until all of it is rolled up
    assert kept == (agent.stats.ticks - rolled if db_url.startswith("sqlite") else agent.stats.ticks)


# -- nothing lost ------------------------------------------------------------------------------------


def _run_agent(url, backend, spool, *, hold_lock_until_tick=None, stop_at_tick=None, max_memory_rows=8 * 3600, host=None):
    """Replay through an agent writing to SQLite ``url`` while another connection holds the write
    lock from the first tick until ``hold_lock_until_tick`` (None: for the whole run).
    Returns (agent, backlog)."""
    backlog = Backlog(spool, max_memory_rows=max_memory_rows)
    agent = run_locked_sqlite(
        url,
        lambda store, tick: Agent(
            NvmlSource(backend), store, hostname="h", interval=0.01, paced=True, flush_interval=0.03, backlog=backlog,
            on_tick=tick, host=host,
        ),
        unlock_at_tick=hold_lock_until_tick, stop_at_tick=stop_at_tick,
    )
    return agent, backlog


def test_locked_sqlite_outage_is_spooled_replayed_in_order_and_logged_once(tmp_path, caplog):
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with caplog.at_level(logging.WARNING, logger="vgpumon.agent"):
        agent, backlog = _run_agent(url, scenarios.backend(header, ticks), tmp_path / "spool", hold_lock_until_tick=40)
    assert agent.stats.outages == 1 and agent.stats.rows_spooled == 0 and agent.stats.rows_pending == 0
    per_tick = _count(url, "SELECT count(*) FROM (SELECT ts FROM gpu_samples GROUP BY ts HAVING count(*) = 8)")
    assert per_tick == agent.stats.ticks == len(ticks) - 1  # the init block is not a tick
    assert _count(url, "SELECT count(*) FROM gpu_samples") == agent.stats.ticks * 8
    messages = [r.getMessage() for r in caplog.records]
    assert sum("holding ticks in the spool" in m for m in messages) == 1, messages
    assert sum("store reachable again" in m for m in messages) == 1, messages
    assert list((tmp_path / "spool").glob("*.json")) == []


def test_spool_survives_agent_restart_and_replays_once(tmp_path):
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    spool = tmp_path / "spool"
    first, _ = _run_agent(url, scenarios.backend(header, ticks), spool)  # locked throughout
    assert first.stats.rows_written == 0 and first.stats.rows_spooled == first.stats.ticks * 8
    assert _count(url, "SELECT count(*) FROM gpu_samples") == 0
    # the next run samples only five ticks (the same ones again), yet every tick of the first run lands
    second, _ = _run_agent(url, scenarios.backend(header, ticks), spool, hold_lock_until_tick=1, stop_at_tick=5)
    assert second.stats.rows_spooled == 0
    assert _count(url, "SELECT count(*) FROM gpu_samples") == first.stats.ticks * 8
    assert _count(url, "SELECT count(DISTINCT ts) FROM gpu_samples") == first.stats.ticks


def test_a_ticks_host_process_and_xid_rows_ride_the_spool_too(tmp_path):
    """Host samples, GPU processes and XID events wait in the spool with the GPU rows and land
    once the store is back, also across an agent restart."""
    from vgpumon.sources.host import HostSource

    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 2)
    header, ticks = scenarios.set_call(header, ticks, "sys", "xid_poll", {"v": [{"index": 1, "xid": 79, "ts": ticks[11]["ts"]}]}, at=[10])
    url = f"sqlite:///{tmp_path / 'x.db'}"
    spool = tmp_path / "spool"
    first, _ = _run_agent(url, scenarios.backend(header, ticks), spool, host=HostSource())  # locked throughout
    assert _count(url, "SELECT count(*) FROM host_samples") == 0
    assert any(p.name.endswith(".extra.json") for p in spool.iterdir())
    _run_agent(url, scenarios.backend(header, ticks), spool, hold_lock_until_tick=1, stop_at_tick=3)
    assert _count(url, "SELECT count(DISTINCT ts) FROM host_samples") == len(range(0, first.stats.ticks, 5))  # host_every=5
    assert _count(url, "SELECT count(*) FROM xid_events WHERE xid = 79") == 1
    # the capture's torch process, on both GPUs, every tick it held memory
    assert _count(url, "SELECT count(*) FROM gpu_process_samples") > 0
    assert list(spool.glob("*.json")) == []


def test_full_buffer_folds_oldest_ticks_into_rollups_and_counts_them(tmp_path):
    """Spool unwritable (its path is a file) and a small memory bound: the oldest raw ticks are
    folded into 1-minute rollups, never dropped; every tick is in the store raw or folded."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    not_a_dir = tmp_path / "spool-is-a-file"
    not_a_dir.write_text("")
    agent, backlog = _run_agent(url, scenarios.backend(header, ticks), not_a_dir, hold_lock_until_tick=70, max_memory_rows=8 * 20)
    assert agent.stats.rows_pending == 0 and agent.stats.rows_folded > 0
    raw = _count(url, "SELECT count(*) FROM gpu_samples")
    folded = _count(url, "SELECT coalesce(sum(folded_samples), 0) FROM gpu_samples_1m")
    assert folded == agent.stats.rows_folded
    assert raw + folded == agent.stats.ticks * 8
    assert raw < agent.stats.ticks * 8


def test_a_batch_written_twice_or_overlapping_is_stored_once(db_url, store_of):
    """A spool file replayed after a crash between commit and delete, or a capture replayed
    again: the write path skips stored rows (Postgres falls back from COPY to ON CONFLICT)."""
    agent = replay_into(db_url)
    store = store_of(db_url)
    (gpu,) = store.gpus_of("h200-replay")
    rows = store.series(gpu.id, 0, 2e9, ("power_watts",))
    other = store.register_gpus("h200-replay", [GpuIdentity(index=1, uuid="GPU-other")])["GPU-other"]
    again = [encode_gpu_sample(gpu.id, GpuSample(ts=r["ts"], uuid="x", index=0, power_watts=1.0)) for r in rows[:10]]
    fresh = [encode_gpu_sample(other, GpuSample(ts=r["ts"], uuid="GPU-other", index=1, power_watts=2.0)) for r in rows[:10]]
    store.write_gpu_rows(again + fresh)
    store.write_gpu_rows(fresh)
    assert _count(db_url, "SELECT count(*) FROM gpu_samples") == agent.stats.ticks + 10
    assert store.series(gpu.id, 0, 2e9, ("power_watts",)) == rows  # stored values untouched


def test_a_gpu_registered_after_start_is_listed_at_once(db_url, store_of):
    """The rules read the host's GPU list every cycle from a kept copy: a GPU the agent finds
    later (hot-plug, a re-initialisation) must be in the very next list, not a minute later."""
    replay_into(db_url)
    store = store_of(db_url)
    assert [g.identity.uuid for g in store.gpus_of("h200-replay")] != ["GPU-later"]
    first = [g.identity.index for g in store.gpus_of("h200-replay")]
    store.register_gpus("h200-replay", [GpuIdentity(index=7, uuid="GPU-later")])
    assert [g.identity.index for g in store.gpus_of("h200-replay")] == [*first, 7]


def test_window_aggregates_for_many_gpus_equal_the_per_gpu_ones(db_url, store_of):
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 3)
    replay_into(db_url, scenarios.backend(header, ticks))
    store = store_of(db_url)
    ids = [g.id for g in store.gpus_of("h200-replay")]
    cols = ("sm_active_ratio", "power_watts", "memory_used_bytes")
    many = store.window_aggregates_many(ids + [999], 0, 2e9, cols)
    for g in ids:
        assert many[g] == store.window_aggregates(g, 0, 2e9, cols)
    assert many[999]["samples"] == 0 and many[999]["power_watts_mean"] is None


def test_agent_rolls_up_and_prunes_while_sampling_without_losing_a_tick(db_url):
    """Retention steps run on the agent's store thread between batches (here after every batch,
    with a clock 4 days past the capture): the agent still takes every tick, and each minute
    ends up either rolled up whole or still raw."""
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    store = open_store(db_url)
    body = [t for t in ticks if t["tick"] >= 0]  # the init block is not a tick
    newest = max(t["ts"] for t in body)
    retention = Retention(store, max_minutes=1, clock=lambda: newest + 4 * 86400)
    agent = Agent(
        NvmlSource(scenarios.backend(header, ticks)), store, hostname="h", interval=0.01, paced=True,
        flush_interval=0.05, retention=retention, maintenance_every=0.0,
    )
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    assert agent.stats.ticks == len(body)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        raw = dict(conn.execute(text("SELECT ts / 60000, count(*) FROM gpu_samples GROUP BY ts / 60000")).all())
        rolled = dict(conn.execute(text("SELECT ts / 60000, sum(samples) FROM gpu_samples_1m GROUP BY ts / 60000")).all())
    engine.dispose()
    assert rolled, "no retention step ran during the run"
    expected: dict[int, int] = {}
    for t in body:
        m = int(round(t["ts"] * 1000)) // 60000
        expected[m] = expected.get(m, 0) + 8
    for m, n in expected.items():
        assert rolled.get(m, 0) in (0, n), f"minute {m} rolled up partially"
        assert rolled.get(m) == n or raw.get(m) == n, f"minute {m} lost ticks"
    if db_url.startswith("sqlite"):
        assert sum(raw.values()) < agent.stats.ticks * 8, "rolled-up raw rows were not pruned"


# -- an agent maintains its own host ---------------------------------------------------------------


def _add_hosts(store, url: str, copy_of: int, hosts: range, gpus_each: int = 8) -> None:
    """Other hosts of a fleet: ``gpus_each`` GPUs each, every one holding a copy of GPU
    ``copy_of``'s raw rows (as if its own agent had written them)."""
    from vgpumon.store.codec import GPU_ROW_COLUMNS

    cols = ", ".join(f'"{c}"' for c in GPU_ROW_COLUMNS[1:])
    for h in hosts:
        ids = store.register_gpus(f"fleet-{h}", [GpuIdentity(index=i, uuid=f"GPU-fleet-{h}-{i}") for i in range(gpus_each)])
        with store.engine.begin() as conn:
            for gpu_id in ids.values():
                conn.execute(text(f'INSERT INTO gpu_samples ("gpu_id", {cols}) SELECT :g, {cols} FROM gpu_samples WHERE gpu_id = :src'),
                             {"g": gpu_id, "src": copy_of})


def _statements_of(store, fn) -> tuple[object, list[str]]:
    """``fn()``'s result and every SQL statement it sent to the store."""
    from sqlalchemy import event

    sent: list[str] = []

    def record(conn, cursor, statement, *args) -> None:
        sent.append(statement)

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        return fn(), sent
    finally:
        event.remove(store.engine, "before_cursor_execute", record)


def _upkeep_of(store, hostname: str, clock, *, writing: bool = True) -> Retention:
    """The retention job of ``hostname``'s agent, still writing its GPUs' rows or stopped."""
    gpus = store.gpus_of(hostname) if writing else []
    return Retention(store, clock=clock, host_id=store.host_id(hostname), active_gpus={g.id for g in gpus})


def test_an_agents_upkeep_costs_the_same_in_a_fleet_of_2_hosts_as_of_50(db_url, store_of):
    """Each agent's retention step used to walk every GPU of the shared store (two to three
    statements per GPU), so the database's load grew with the square of the fleet."""
    for host in "abc":
        replay_into(db_url, hostname=host)
    store = store_of(db_url)
    newest = store.newest_ts([g.id for g in store.gpus_of("a")])
    soon = lambda: newest + 30  # noqa: E731  the agent's steady state: nothing has expired yet
    _upkeep_of(store, "c", soon).run()  # the first step of a day creates the day partitions ahead (Postgres)
    small, sent_small = _statements_of(store, _upkeep_of(store, "a", soon).run)
    _add_hosts(store, db_url, store.gpus_of("a")[0].id, range(48))  # 384 more GPUs
    large, sent_large = _statements_of(store, _upkeep_of(store, "b", soon).run)
    assert small.minutes_rolled_up == large.minutes_rolled_up > 0
    assert len(sent_large) == len(sent_small), "\n".join(sent_large)
    assert _count(db_url, "SELECT count(*) FROM rollup_watermarks") == 3  # a's, b's and c's GPU only


def test_an_agent_rolls_up_and_prunes_only_its_own_host_and_db_prune_does_every_host(db_url, store_of):
    a = replay_into(db_url, hostname="a")
    replay_into(db_url, hostname="b")
    store = store_of(db_url)
    (ga,), (gb,) = store.gpus_of("a"), store.gpus_of("b")
    newest = store.newest_ts([ga.id, gb.id])
    later = lambda: newest + 4 * 86400  # noqa: E731  past the 72-h raw window
    _upkeep_of(store, "a", later, writing=False).run()

    def rolled(gpu_id: int) -> int:
        return _count(db_url, f"SELECT coalesce(sum(samples), 0) FROM gpu_samples_1m WHERE gpu_id = {gpu_id}")  # noqa: S608

    def raw(gpu_id: int) -> int:
        return _count(db_url, f"SELECT count(*) FROM gpu_samples WHERE gpu_id = {gpu_id}")  # noqa: S608

    assert rolled(ga.id) == a.stats.ticks and raw(ga.id) == 0
    if db_url.startswith("sqlite"):
        # b's rows are b's agent's to maintain: untouched until it or `db prune` runs
        assert rolled(gb.id) == 0 and raw(gb.id) == a.stats.ticks
        Retention(store, clock=later).run()
    # On Postgres the expired day partition is the whole store's: b, silent for days (a host gone
    # for good), held it back, so a rolled b's rows up before dropping it; nothing is lost.
    assert rolled(gb.id) == a.stats.ticks and raw(gb.id) == 0


@pytest.mark.parametrize("data_time", [True, False])
def test_a_replay_of_a_capture_days_old_keeps_its_raw_rows_while_it_runs(db_url, store_of, data_time):
    """The recorded capture is days older than the 72-h raw window. Measured from today, the
    agent's own retention pruned every raw row it had rolled up, in the middle of the replay;
    measured in the capture's time (what ``vgpumon agent --replay`` does), none is past it."""
    store = open_store(db_url)
    agent = Agent(NvmlSource(scenarios.backend(*read_capture(H200_CAPTURE))), store, hostname="old", paced=False,
                  flush_interval=0.0, retention=Retention(store, max_minutes=100), maintenance_every=0.0, data_time=data_time)
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    raw = _count(db_url, "SELECT count(*) FROM gpu_samples")
    if data_time:
        assert raw == agent.stats.ticks == 76
    else:  # the wall clock's view: the rolled-up minutes are gone (whole days on Postgres: none of them)
        assert raw < agent.stats.ticks or db_url.startswith("postgresql")
