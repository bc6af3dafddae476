"""Writes that fail for a reason other than "store unavailable", and spool writes that fail:
nothing is dropped without a word, and nothing half-written is left behind."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import count, replay_into
from exporter_support import scrape

from vgpumon.exporter.collector import MetricsExporter

# A spool write on a full disk, for real: the child process may write at most 4 KiB per file
# (RLIMIT_FSIZE; SIGXFSZ ignored, so write() fails with EFBIG like it fails with ENOSPC on a full
# disk), then appends a batch of 8 GPU rows × 20 ticks (about 40 kB of JSON) to a spool.
_FULL_DISK_CHILD = textwrap.dedent(
    """
    import resource, signal, sys
    from pathlib import Path
    from vgpumon.store.codec import GPU_ROW_COLUMNS
    from vgpumon.store.spool import RAW, Backlog

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    spool = Path(sys.argv[1])
    spool.mkdir()
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    backlog = Backlog(spool)
    rows = [tuple(i * 1000 + j for j in range(len(GPU_ROW_COLUMNS))) for i in range(160)]
    print(backlog.append(RAW, rows), len(backlog), backlog.memory_rows)
    """
)


def test_a_failed_spool_write_leaves_no_tmp_file_behind(tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(spool)], capture_output=True, text=True, timeout=60, check=True
    )
    # the batch is kept in memory (the spool cannot take it) ...
    assert out.stdout.split() == ["memory", "1", "160"], out.stderr
    # ... and the half-written file is gone: a full disk is not made fuller by our leftovers
    assert sorted(p.name for p in spool.iterdir()) == []


def test_a_tmp_file_left_by_a_crash_is_removed_at_start(tmp_path: Path) -> None:
    from vgpumon.store.spool import Backlog

    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "0000000000000003.raw.tmp").write_text('{"v":1,"kind":"raw","col')  # power cut mid-write
    backlog = Backlog(spool)
    assert len(backlog) == 0
    assert list(spool.iterdir()) == []


# -- a batch the store refuses for what it holds ---------------------------------------------------


def test_a_row_the_store_refuses_is_set_aside_and_every_other_row_stored(db_url, tmp_path, caplog):
    """The store was replaced while the spool held rows of the old one: one spooled row names a
    GPU id the new store does not have (a foreign key the store refuses however long it waits).
    That row goes to the dead-letter file beside the spool and is counted; the other rows of its
    batch and every tick of the run are stored, and no outage is declared."""
    import json
    import logging

    from vgpumon.model import GpuSample
    from vgpumon.store.codec import encode_gpu_sample
    from vgpumon.store.spool import RAW, Backlog

    spool = tmp_path / "spool"
    t0 = 1_700_000_000.0  # long before the capture: these rows are the old store's
    old = [encode_gpu_sample(1, GpuSample(ts=t0 + i, uuid="GPU-x", index=0, power_watts=100.0 + i)) for i in range(20)]
    gone = encode_gpu_sample(99, GpuSample(ts=t0 + 7.5, uuid="GPU-gone", index=1, power_watts=5.0))
    Backlog(spool).append(RAW, old[:7] + [gone] + old[7:])

    backlog = Backlog(spool)
    with caplog.at_level(logging.WARNING):
        agent = replay_into(db_url, hostname="h", agent_kw={"backlog": backlog})
    stats = agent.stats

    assert stats.dead_letters == 1 and stats.outages == 0 and stats.rows_spooled == 0
    served = scrape(MetricsExporter.for_agent(agent))  # what an SRE's dashboard sees
    assert served.value("vgpumon_agent_dead_letters_total", hostname="h") == 1.0
    assert served.value("vgpumon_agent_store_outages_total", hostname="h") == 0.0
    assert count(db_url, "SELECT count(*) FROM gpu_samples") == stats.ticks + 20
    assert count(db_url, f"SELECT count(*) FROM gpu_samples WHERE ts < {int((t0 + 100) * 1000)}") == 20
    letters = [json.loads(line) for line in backlog.dead_letter_path.read_text().splitlines()]
    assert len(letters) == 1
    (letter,) = letters
    assert letter["kind"] == "raw" and dict(zip(letter["columns"], letter["row"]))["gpu_id"] == 99
    assert "foreign key" in letter["error"].lower()
    assert backlog.dead_letter_path.parent == spool.parent  # beside the spool, not in it
    assert not any("unavailable" in r.getMessage() for r in caplog.records)


def test_vllm_samples_in_a_full_spool_fold_in_order_and_keep_every_change_of_state(tmp_path: Path) -> None:
    """A spool over its bound holding only vLLM samples (a poll every 2 s for 20 minutes, the
    server going dead at minute 12): the oldest fold to the last sample per minute plus each
    change of state, the files still replay oldest first, and the count says how many went."""
    from vgpumon.model import InstanceIdentity, ServerSample, ServerState
    from vgpumon.store.spool import VLLM, Backlog
    from vgpumon.store.vllm_repository import VllmRepository

    t0 = 1_800_000_000.0
    ident = InstanceIdentity(host="127.0.0.1", port=8000, url="http://127.0.0.1:8000", origin="static", pid=None,
                             process_start=None, first_seen=t0)

    def state(i: int) -> ServerState:
        return ServerState.IDLE if i < 360 else ServerState.DEAD

    polls = [ServerSample(instance=ident, ts=t0 + 2 * i, state=state(i), reason=state(i).value) for i in range(600)]
    backlog = Backlog(tmp_path / "spool", max_spool_bytes=200_000)
    for k in range(0, 600, 15):  # a batch every 30 s
        backlog.append(VLLM, [VllmRepository.encode_sample(1, s) for s in polls[k : k + 15]])
    assert backlog.folded_vllm_rows > 0
    assert backlog.spool_bytes <= 200_000 * 1.25
    kept = []
    reloaded = Backlog(tmp_path / "spool")  # what a restarted agent replays
    while (entry := reloaded.peek()) is not None:
        kept += entry.rows
        reloaded.ack(entry)
    assert len(kept) + backlog.folded_vllm_rows == 600
    stamps = [r["sample"]["ts"] for r in kept]
    assert stamps == sorted(stamps)
    assert [r["sample"]["state"] for r in kept].count(ServerState.DEAD.code) >= 1
    first_dead = next(r for r in kept if r["sample"]["state"] == ServerState.DEAD.code)
    assert first_dead["sample"]["ts"] == t0 + 2 * 360  # the moment it died survives folding


# -- which store failures pass by themselves (exit 75, the agent restarted) and which need a person (69)


@pytest.mark.parametrize(("message", "passes"), [
    # libpq's own words (Postgres 15 server, psycopg 3), as the CLI saw them
    ('connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused', True),
    ("connection timeout expired", True),
    ("consuming input failed: server closed the connection unexpectedly", True),
    ('connection failed: could not translate host name "db.invalid-zone" to address: Name or service not known', True),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  the database system is shutting down', True),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  sorry, too many clients already', True),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  too many connections for role "vg"', True),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  remaining connection slots are reserved '
     'for roles with the SUPERUSER attribute', True),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  role "nobody" does not exist', False),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  database "x" does not exist', False),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  password authentication failed for user "vg"',
     False),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: fe_sendauth: no password supplied', False),
    ('connection failed: connection to server at "127.0.0.1", port 5432 failed: server does not support SSL, but SSL was required',
     False),
    ('connection is bad: invalid sslmode value: "bogus"', False),
    ('connection is bad: invalid port number: "99999"', False),
])
def test_a_postgres_failure_is_transient_only_when_waiting_cures_it(message, passes):
    """75 makes systemd restart the agent every 5 s; 69 stops it for good. A wrong 75 restarts a
    misconfigured agent for ever, a wrong 69 leaves a host unmonitored after a passing outage."""
    psycopg = pytest.importorskip("psycopg")
    from vgpumon.store.engine import transient

    assert transient(psycopg.OperationalError(message)) is passes


@pytest.mark.parametrize(("message", "passes"), [
    ("database is locked", True),
    ("database or disk is full", True),
    ("attempt to write a readonly database", False),
    ("unable to open database file", False),
])
def test_a_sqlite_failure_is_transient_when_locked_or_full(message, passes):
    import sqlite3

    from vgpumon.store.engine import transient

    assert transient(sqlite3.OperationalError(message)) is passes


def test_a_spool_that_cannot_be_written_is_reported_at_start_not_first_during_an_outage(db_url, tmp_path, caplog):
    """``--spool`` below a file (a typo, a path on a read-only mount): the agent says so as it
    starts, while the store is fine, so the operator learns that an outage would hold ticks in
    memory only; it still stores every tick. A usable spool path draws no such line, and nothing
    is created for it while the store answers."""
    import logging

    from vgpumon.store.spool import Backlog

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="vgpumon.agent"):
        agent = replay_into(db_url, hostname="h", agent_kw={"backlog": Backlog(blocker / "spool")})
    lines = [r.getMessage() for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(lines) == 1 and f"{blocker} is not a directory" in lines[0] and "memory only" in lines[0], lines
    assert count(db_url, "SELECT count(DISTINCT ts) FROM gpu_samples") == agent.stats.ticks > 0

    caplog.clear()
    fine = tmp_path / "deep" / "spool"
    with caplog.at_level(logging.WARNING, logger="vgpumon.agent"):
        replay_into(db_url, hostname="h2", agent_kw={"backlog": Backlog(fine)})
    assert not [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert not (tmp_path / "deep").exists()
