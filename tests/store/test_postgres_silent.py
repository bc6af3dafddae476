"""A Postgres server that stops answering without closing anything (every process of a private
server SIGSTOPped: a paused VM, stalled storage, a hung proxy). The kernel still acknowledges
every packet, so no timeout of the network or of libpq ends a query in flight: the agent must
notice that its store went silent, keep every tick, count the outage, and still stop on request.
"""

from __future__ import annotations

import time

import pytest
from conftest import H200_CAPTURE, wait_for
from exporter_support import scrape
from postgres_support import private_postgres, run_beside  # noqa: F401 - the fixture
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.alerts.runner import RuleRunner
from vgpumon.exporter.collector import MetricsExporter
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.store import open_store
from vgpumon.store.engine import make_engine
from vgpumon.store.spool import Backlog
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

DEADLINE = 1.0  # seconds without an answer before the store counts as silent (75 s by default)


def _agent(pg_url: str, spool, ticks_x: int = 4, deadline: float = DEADLINE) -> tuple[Agent, object]:
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 2)
    header, ticks = scenarios.repeat(header, ticks, ticks_x)
    store = open_store(pg_url, connect_timeout_s=2)
    agent = Agent(
        NvmlSource(scenarios.backend(header, ticks)), store, hostname="gpu-host-silent",
        interval=0.1, paced=True, flush_interval=0.2, backlog=Backlog(spool), store_deadline=deadline,
        rules=RuleRunner(sinks=[], wall=None),
    )
    return agent, store


def _stored(pg_url: str) -> tuple[int, int, set[int]]:
    engine = make_engine(pg_url)
    with engine.connect() as conn:
        total, distinct = conn.execute(text("SELECT count(*), count(DISTINCT ts) FROM gpu_samples")).one()
        per_tick = set(conn.scalars(text("SELECT count(*) FROM gpu_samples GROUP BY ts")))
    engine.dispose()
    return total, distinct, per_tick


def test_a_store_gone_silent_mid_run_is_cut_loose_and_every_tick_stored_once(private_postgres, tmp_path):
    pg = private_postgres
    agent, store = _agent(pg.url, tmp_path / "spool")

    def script() -> None:
        time.sleep(2.0)  # rows and a rules cycle stored while it answers
        pg.freeze()
        time.sleep(4.0)  # the agent samples on; its store calls hang until it cuts them
        pg.thaw()
        time.sleep(3.0)  # the held rows are replayed

    try:
        run_beside(agent, script)
    finally:
        store.close()
    s = agent.stats
    # (an outage is counted when a write was the call cut or its retry timed out; a write that
    # only waited in a connection attempt the thaw let through is not one)
    assert s.store_stalls >= 1, "the silent store was never noticed"
    assert scrape(MetricsExporter.for_agent(agent)).value("vgpumon_agent_store_stalls_total", hostname="gpu-host-silent") == s.store_stalls
    assert s.rows_spooled == 0 and s.rows_pending == 0 and s.dead_letters == 0
    total, distinct, per_tick = _stored(pg.url)
    assert distinct == s.ticks, "a tick taken while the store was silent is missing (or stored twice)"
    assert per_tick == {2}
    assert total == s.ticks * 2
    assert agent.rules is not None and agent.rules.evaluations >= 1


def test_a_stop_while_the_store_is_silent_ends_the_run_and_spools_every_tick(private_postgres, tmp_path):
    pg = private_postgres
    spool = tmp_path / "spool"
    agent, store = _agent(pg.url, spool)

    def script() -> None:
        time.sleep(1.5)
        pg.freeze()
        time.sleep(0.5)  # SIGTERM now: a write is (or soon will be) stuck on the silent server

    try:
        run_beside(agent, script)
    finally:
        pg.thaw()
        store.close()
    first = agent.stats
    assert first.rows_pending == 0, "ticks were lost at exit"
    assert first.rows_spooled > 0, "the ticks taken while the store was silent were not spooled"
    assert first.store_stalls >= 1

    # the next run replays the spool: every tick of the first run is stored, once
    again, store = _agent(pg.url, spool, ticks_x=1)
    try:
        run_beside(again, lambda: time.sleep(1.5))
    finally:
        store.close()
    assert again.stats.rows_spooled == 0 and again.stats.rows_pending == 0
    total, distinct, per_tick = _stored(pg.url)
    assert per_tick == {2} and total == distinct * 2
    assert distinct >= first.ticks  # the second run's ticks repeat the first's times: stored once


def test_one_connection_gone_silent_is_cut_while_another_still_answers(private_postgres, tmp_path):
    """One backend stops (a NAT dropping one flow, a backend stuck on storage) while the server
    and the other connections answer. The thread stuck on it must be found although the other
    thread keeps using the pool: silence used to be judged on the whole pool, so the rules' reads
    every 1.5 s hid a write stuck for ever (no outage, ticks piling up in memory)."""
    import os
    import signal

    pg = private_postgres
    agent, store = _agent(pg.url, tmp_path / "spool", deadline=2.0)  # longer than the rules' 1.5-s cycle
    seen: dict[str, int] = {}

    def writer() -> int | None:  # the backend that last committed (the writer; a read ends in ROLLBACK)
        engine = make_engine(pg.url)
        try:
            with engine.connect() as conn:
                return conn.scalar(text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                    "AND query = 'COMMIT' ORDER BY state_change DESC LIMIT 1"
                ))
        finally:
            engine.dispose()

    def script() -> None:
        # registered and writing ticks: the backend to freeze is the writer's, not registration's
        wait_for(lambda: agent.stats.rows_written > 0, what="the first rows written")
        found: list[int] = []
        wait_for(lambda: found.append(w) is None if (w := writer()) is not None else False,
                 what="a backend that has written")
        pid = found[0]
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(lambda: agent.stats.store_stalls > 0, what="the stuck write to be found")
            seen["stalls"] = agent.stats.store_stalls
        finally:
            os.kill(pid, signal.SIGCONT)
        ticks = agent.stats.ticks
        wait_for(lambda: agent.stats.ticks >= ticks + 3, what="ticks after the backend came back")

    try:
        run_beside(agent, script)
    finally:
        store.close()
    assert seen["stalls"] >= 1, "a thread stuck on one silent connection was never found"
    s = agent.stats
    assert s.rows_spooled == 0 and s.rows_pending == 0
    total, distinct, per_tick = _stored(pg.url)
    assert distinct == s.ticks and per_tick == {2} and total == s.ticks * 2
