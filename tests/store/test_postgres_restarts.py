"""Nothing lost across Postgres restarts: a private Postgres server, started with initdb/pg_ctl,
is stopped and started ten times while an agent replays an 8-GPU capture into it."""

from __future__ import annotations

import time

import pytest
from conftest import H200_CAPTURE
from postgres_support import private_postgres, run_beside  # noqa: F401 - the fixture
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.store import open_store
from vgpumon.store.engine import make_engine
from vgpumon.store.retention import Retention
from vgpumon.store.spool import Backlog
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

RESTARTS = 10


def test_every_tick_stored_exactly_once_across_ten_postgres_restarts(private_postgres, tmp_path):
    pg = private_postgres
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    header, ticks = scenarios.repeat(header, ticks, 4)  # 304 ticks: enough run time for 10 restarts
    store = open_store(pg.url)
    backlog = Backlog(tmp_path / "spool")
    agent = Agent(
        NvmlSource(scenarios.backend(header, ticks)), store, hostname="gpu-host-17",
        interval=0.1, paced=True, flush_interval=0.2, backlog=backlog,
        retention=Retention(store), maintenance_every=1.0,
    )
    restarts: list[str] = []

    def restart_loop() -> None:
        for i in range(RESTARTS):
            time.sleep(0.8)
            pg.stop("immediate" if i % 2 else "fast")  # crash-like stops too
            time.sleep(0.4)  # the agent keeps sampling while the server is away
            pg.start()
            restarts.append("immediate" if i % 2 else "fast")
        time.sleep(1.0)

    try:
        run_beside(agent, restart_loop)
    finally:
        store.close()
    assert len(restarts) == RESTARTS
    assert agent.stats.ticks < len(ticks) - 1, "the capture ended before the restarts did"
    assert agent.stats.outages >= 1 and agent.stats.rows_spooled == 0 and agent.stats.rows_pending == 0

    engine = make_engine(pg.url)
    with engine.connect() as conn:
        total, distinct_ticks = conn.execute(text("SELECT count(*), count(DISTINCT ts) FROM gpu_samples")).one()
        per_tick = set(conn.scalars(text("SELECT count(*) FROM gpu_samples GROUP BY ts")))
    engine.dispose()
    assert distinct_ticks == agent.stats.ticks
    assert per_tick == {8}
    assert total == agent.stats.ticks * 8
