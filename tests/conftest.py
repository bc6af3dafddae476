"""Shared fixtures: recorded real captures, and a store on real SQLite and (when configured)
real Postgres. Set VGPUMON_TEST_POSTGRES_URL (``.ci/run`` does) to run every store test on both.

The suite runs in parallel (pytest-xdist, ``-n`` in pyproject.toml): each worker gets a database
of its own beside the configured one (``test`` → ``test_gw0``, ``test_gw1``…), created on first
use, since the store tests empty their schema."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import pytest
from sqlalchemy import text

from vgpumon.agent import Agent
from vgpumon.sources.nvml import NvmlSource
from vgpumon.sources.nvml.capture import ReplayBackend
from vgpumon.store import Store, open_store
from vgpumon.store.engine import make_engine

#: the repository's root, and the tests' recorded data and golden outputs
ROOT = Path(__file__).resolve().parents[1]
DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"
H200_CAPTURE = DATA / "h200-workload.jsonl.gz"
H200_PHASES = json.loads((DATA / "h200-workload.phases.json").read_text())
POSTGRES_ENV = "VGPUMON_TEST_POSTGRES_URL"
#: The command line as a user types it, in this interpreter.
VGPUMON = [sys.executable, "-m", "vgpumon"]


def vgpumon(*args: str, env: dict[str, str] | None = None, clean: bool = False, timeout: float = 120,
            prefix: list[str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``vgpumon ARGS`` in a new process, its output captured as text. ``env`` is added to this
    process's environment; ``clean`` first drops every ``VGPUMON_*`` setting of it (the test's
    Postgres URL stays), as on a machine where none is set; ``prefix`` goes before the command
    (``runuser -u nobody --``)."""
    base = {k: v for k, v in os.environ.items() if not (clean and k.startswith("VGPUMON_") and k != POSTGRES_ENV)}
    return subprocess.run([*(prefix or []), *VGPUMON, *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, timeout=timeout, cwd=cwd)

# GNU readline, which pytest loads, exports COLUMNS=80 and LINES into this process's own
# environment (not os.environ), and every child inherits them: reports piped from a child would
# wrap at 80 columns (``vgpumon.diagnose.render.pipe_width``). A test that wants a width says so.
os.unsetenv("COLUMNS")
os.unsetenv("LINES")


def _worker_database(url: str, worker: str) -> str:
    """``url`` with its database name suffixed by the xdist worker's id, created when missing."""
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = f"{base.database}_{worker}"
    engine = make_engine(url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first() is None:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        engine.dispose()
    return base.set(database=name).render_as_string(hide_password=False)


if os.environ.get(POSTGRES_ENV) and os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ[POSTGRES_ENV] = _worker_database(os.environ[POSTGRES_ENV], os.environ["PYTEST_XDIST_WORKER"])
#: ``db prune`` options that roll every minute up and delete nothing: the recorded captures are
#: from the past, and the default retentions (3 d raw, 90 d of rollups) count back from today
KEEP_ALL = ("--raw-retention", "3650d", "--rollup-retention", "3650d")


def phase(name: str) -> dict[str, Any]:
    """Wall-clock bounds of a workload phase of the H200 capture."""
    return next(p for p in H200_PHASES["phases"] if p["name"] == name)


def _reset_postgres(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store URL: a SQLite file, or the test Postgres with an empty schema."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vgpumon.db'}"
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.skip(f"Postgres store tests need {POSTGRES_ENV} (e.g. postgresql+psycopg://postgres@127.0.0.1/test)")
    _reset_postgres(url)
    return url


def read_all(backend, **kw: Any) -> tuple[NvmlSource, list]:
    """Run an ``NvmlSource`` over a whole replay; returns the source and every tick's reading."""
    from vgpumon.sources.nvml.backend import EndOfCapture

    src = NvmlSource(backend, **kw)
    src.start()
    out = []
    while True:
        try:
            out.append(src.sample())
        except EndOfCapture:
            return src, out


def replay_into(
    url: str, backend: ReplayBackend | None = None, *, hostname: str = "h200-replay", agent_kw: dict[str, Any] | None = None,
    **kw: Any,
) -> Agent:
    """Replay a capture (the H200 one by default) through agent → store; returns the agent.
    ``agent_kw`` go to ``Agent`` (default: as fast as possible), ``kw`` to ``NvmlSource``."""
    source = NvmlSource(backend or ReplayBackend(H200_CAPTURE), **kw)
    store = open_store(url)
    agent = Agent(source, store, hostname=hostname, **{"paced": False, **(agent_kw or {})})
    try:
        asyncio.run(agent.run())
    finally:
        store.close()
    return agent


def count(url: str, sql: str) -> int:
    """One integer from the store at ``url`` (a ``SELECT count(*) …``)."""
    engine = make_engine(url)
    with engine.connect() as conn:
        n = conn.scalar(text(sql))
    engine.dispose()
    return int(n)


def run_locked_sqlite(
    url: str, make_agent: Callable[[Store, Callable[[Any], None]], Agent], *, unlock_at_tick: int | None = None,
    stop_at_tick: int | None = None, on_tick: Callable[[int], None] | None = None,
) -> Agent:
    """Run the agent that ``make_agent(store, tick_callback)`` builds on the SQLite store ``url``
    while another connection holds the write lock from its GPUs' registration until ``unlock_at_tick``
    (None: for the whole run); stop after ``stop_at_tick`` ticks; ``on_tick(n)`` after tick n.
    The store waits at most 20 ms for the lock, so every batch meets an outage."""
    store = open_store(url, busy_timeout_ms=20)
    locker = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, check_same_thread=False)
    stop = asyncio.Event()
    state = {"n": 0, "locked": False}
    register = store.register_gpus

    def register_then_lock(*args: Any, **kw: Any) -> Any:
        # the agent has registered its GPUs: now another writer takes the lock, before the first
        # tick (which the agent writes at once, so a lock taken at that tick could come too late)
        ids = register(*args, **kw)
        if not state["locked"] and state["n"] == 0:
            locker.execute("BEGIN IMMEDIATE")
            state["locked"] = True
        return ids

    store.register_gpus = register_then_lock  # type: ignore[method-assign]

    def tick(_snap: Any) -> None:
        state["n"] += 1
        if state["locked"] and unlock_at_tick is not None and state["n"] >= unlock_at_tick:
            locker.execute("COMMIT")
            state["locked"] = False
        if stop_at_tick is not None and state["n"] >= stop_at_tick:
            stop.set()
        if on_tick is not None:
            on_tick(state["n"])

    agent = make_agent(store, tick)
    try:
        asyncio.run(agent.run(stop))
    finally:
        if state["locked"]:
            locker.execute("COMMIT")
        locker.close()
        store.close()
    return agent


@pytest.fixture
def store_of():
    """Open stores for reading, closed after the test."""
    opened: list[Store] = []

    def _open(url: str) -> Store:
        s = Store(url)
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


def wait_for(pred: Callable[[], Any], timeout: float = 60.0, what: str = "the condition") -> None:
    """Poll ``pred`` until it is true; fail after ``timeout`` seconds (a generous bound for a
    loaded machine, never a wait the test relies on)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stored_ticks(db: Path) -> int:
    """GPU rows a reader of the SQLite store ``db`` sees now (0 before it exists or is migrated)."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    except sqlite3.Error:
        return 0


def has_vgpumon_handlers(pid: int) -> bool:
    """True once the ``vgpumon`` process ``pid`` has its own signal handlers (it takes SIGALRM
    over first, ``vgpumon.base.signals``). A signal before that lands in the interpreter's own
    start-up, where no program can handle it."""
    import signal

    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGALRM - 1)))


def nvml_present() -> bool:
    """This host has an NVIDIA driver (``libnvidia-ml.so.1`` loads): the no-driver paths cannot
    be shown here."""
    import ctypes

    try:
        ctypes.CDLL("libnvidia-ml.so.1")
        return True
    except OSError:
        return False
