"""Nothing lost across Postgres restarts: a private Postgres server, started with initdb/pg_ctl,
is stopped and started ten times while an agent replays an 8-GPU capture into it."""

from __future__ import annotations

import asyncio
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import H200_CAPTURE
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml_backend import read_capture
from vgpumon.store import open_store
from vgpumon.store.engine import make_engine
from vgpumon.store.retention import Retention
from vgpumon.store.spool import Backlog
from vgpumon.testing import scenarios

RESTARTS = 10


def _pg_bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        if (Path(out) / "initdb").exists():
            return Path(out)
    except (OSError, subprocess.CalledProcessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A throwaway Postgres cluster in a temporary directory, on a free port. Postgres refuses to
    run as root, so as root (CI) every command runs as the ``postgres`` OS user."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="vgpumon-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(self.as_user + [str(self.bindir / tool), *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_postgres():
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no Postgres server binaries (initdb, pg_ctl) on this machine")
    pg = PrivatePostgres(bindir)
    pg.start()
    yield pg
    pg.destroy()


def test_every_tick_stored_exactly_once_across_ten_postgres_restarts(private_postgres, tmp_path):
    pg = private_postgres
    header, ticks = scenarios.replicate_devices(*read_capture(H200_CAPTURE), 8)
    header, ticks = scenarios.repeat(header, ticks, 4)  # 304 ticks: enough run time for 10 restarts
    store = open_store(pg.url)
    backlog = Backlog(tmp_path / "spool")
    agent = Agent(
        NvmlSource(scenarios.backend(header, ticks)), store, hostname="gpu-host-17",
        interval=0.1, paced=True, flush_every=0.2, backlog=backlog,
        retention=Retention(store), maintenance_every=1.0,
    )
    stop = asyncio.Event()
    restarts: list[str] = []
    failure: list[BaseException] = []

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def restart_loop() -> None:
            try:
                for i in range(RESTARTS):
                    time.sleep(0.8)
                    pg.stop("immediate" if i % 2 else "fast")  # crash-like stops too
                    time.sleep(0.4)  # the agent keeps sampling while the server is away
                    pg.start()
                    restarts.append("immediate" if i % 2 else "fast")
                time.sleep(1.0)
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failure.append(exc)
            finally:
                loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=restart_loop, daemon=True).start()
        await agent.run(stop)

    try:
        asyncio.run(run())
    finally:
        store.close()
    assert failure == []
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
