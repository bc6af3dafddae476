"""The combined fault run: everything that goes wrong on a GPU host at once, and every tick
accounted for (docs/reliability.md, "Faults").

An agent process replays an 8-GPU capture (the recorded H200 one, replicated and repeated, ten
ticks a second at its recorded pace) into a private Postgres server, with its spool on a tmpfs
of 256 KiB, and scrapes a vLLM server (the fake one, serving a real vLLM 0.32 exposition). While
it runs:

* Postgres stops three times: a fast stop of 3 s; a crash of 12 s (every Postgres process
  SIGKILLed: no shutdown checkpoint, WAL recovery at the restart), long
  enough for the spool's disk to fill (the agent then holds the rows in memory; past its bound it
  would fold the oldest whole minutes into rollups, which ticks ten a second over one minute of
  capture time never reach); and a fast stop during which the agent is killed (below);
* the vLLM server hangs on ``/metrics``, then answers garbage, then a value that overflows a
  float, then recovers;
* the agent is SIGKILLed while Postgres is down and its spool holds ticks, and started again on
  the rest of the capture (from 2 s before the kill, so that estimating the kill's position in
  the capture costs nothing: rows sent twice are stored once). While Postgres is still down the
  new agent exits 75 at start, and is started again, as systemd does; the ticks that only the
  spool held must reach the store.

Then, per GPU, every tick of the capture must be stored once, raw or inside a rollup's
``folded_samples``; the agent must have ended with exit 0; and it must have read the vLLM server
again after the faults. A second part SIGKILLs an agent writing to SQLite three times (each time
started again on the rest of the capture from 2 s before its newest stored tick: the ticks it
had read but not yet written, at most one flush interval, are what a live agent loses) and checks
``PRAGMA integrity_check``. Prints the accounting; exits 1 on any loss, duplicate or failure.

    python bench/fault_run.py [--json FILE]

Needs Postgres' server binaries (initdb, pg_ctl) and root for the tmpfs (without it the spool is
a plain directory and the disk-full part is skipped, said so). About a minute and a half.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from postgres_support import PrivatePostgres, _pg_bindir  # noqa: E402
from sqlalchemy import text  # noqa: E402

from vgpumon.sources.nvml.capture import read_capture  # noqa: E402
from vgpumon.store.engine import make_engine  # noqa: E402
from vgpumon.testing import scenarios  # noqa: E402
from vgpumon.testing.vllm import FakeVllmServer  # noqa: E402

CAPTURE = ROOT / "tests" / "data" / "h200-workload.jsonl.gz"
VLLM_BODY = ROOT / "tests" / "data" / "vllm-real" / "vllm-0.32.0-cpu__busy.txt"
GPUS = 8
SPEED = 0.1  # capture seconds per tick after retiming: ten ticks a second
OVERLAP_S = 2.0


def capture(tmp: Path, repeat: int) -> tuple[Path, Any, list[Any]]:
    header, ticks = scenarios.replicate_devices(*read_capture(CAPTURE), GPUS)
    header, ticks = scenarios.repeat(header, ticks, repeat)
    header, ticks = scenarios.retime(header, ticks, SPEED)
    ticks = list(ticks)
    path = tmp / "fault-8gpu.jsonl.gz"
    scenarios.write(path, header, ticks)
    return path, header, ticks


def tick_times(ticks: list[Any]) -> list[float]:
    return [t["ts"] for t in ticks if t["tick"] >= 0 and t["ts"] is not None]


# the capture's clock, not the wall's (the default at the recorded pace): a restarted agent
# replays the rest of the capture from before its newest stored tick, and the ticks sent twice
# must carry the times they were first stored under to be stored once
def agent(cap: Path, db: str, spool: Path, host: str, vllm: str | None, log: Path, *more: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "vgpumon", "agent", "--replay", str(cap), "--pace", "recorded", "--replay-clock", "capture", "--db", db,
           "--spool", str(spool), "--hostname", host, "--listen", "off", "--flush-interval", "1s", *more]
    cmd += ["--vllm-url", vllm] if vllm else ["--no-vllm"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("ab"), cwd=ROOT)


def rest_of(header: Any, ticks: list[Any], from_ts: float, tmp: Path, name: str) -> Path:
    h, t = scenarios.between(header, ticks, from_ts, float("inf"))
    path = tmp / name
    scenarios.write(path, h, t)
    return path


class VllmFaults:
    """The fake vLLM server on a thread of its own, its faults switched by ``at(phase)``."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.body = VLLM_BODY.read_text()
        self.server = FakeVllmServer(metrics=self.body, version="0.32.0", models=["tiny"])
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        self.phases: list[str] = []

    def at(self, phase: str) -> None:
        def switch() -> None:
            s = self.server
            s.hang = {"/metrics"} if phase == "hang" else set()
            if phase != "hang":
                s._release.set()  # answer (503) the requests left hanging
                s._release = asyncio.Event()
            s.metrics = {
                "garbage": os.urandom(4096),
                "overflow": self.body.replace("vllm:num_requests_running{", "vllm:num_requests_running_x{")
                + 'vllm:num_requests_running{engine="0",model_name="tiny"} ' + "9" * 400 + "\n",
            }.get(phase, self.body)
        self.loop.call_soon_threadsafe(switch)
        self.phases.append(phase)

    def requests_since(self, n: int) -> int:
        return sum(1 for p in self.server.requests[n:] if p == "/metrics")

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def wait_rows(url: str, at_least: int, timeout: float = 60.0) -> None:
    """Until the store holds ``at_least`` raw rows (the agent is writing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            engine = make_engine(url)
            with engine.connect() as conn:
                n = conn.scalar(text("SELECT count(*) FROM gpu_samples"))
            engine.dispose()
            if n and n >= at_least:
                return
        except Exception:  # noqa: BLE001, S110 - the schema may not exist yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"the agent stored fewer than {at_least} rows in {timeout:.0f} s")


def newest_ts(url: str) -> float:
    engine = make_engine(url)
    with engine.connect() as conn:
        newest = conn.scalar(text("SELECT max(ts) FROM gpu_samples"))
    engine.dispose()
    return float(newest) / 1000.0


def accounting(url: str, times: list[float]) -> dict[str, Any]:
    """Per GPU: ticks stored raw, ticks kept only inside rollups, and what is missing or twice."""
    engine = make_engine(url)
    with engine.connect() as conn:
        raw = dict(conn.execute(text("SELECT gpu_id, count(*) FROM gpu_samples GROUP BY gpu_id")).all())
        distinct = dict(conn.execute(text("SELECT gpu_id, count(DISTINCT ts) FROM gpu_samples GROUP BY gpu_id")).all())
        folded = dict(conn.execute(text("SELECT gpu_id, coalesce(sum(folded_samples), 0) FROM gpu_samples_1m GROUP BY gpu_id")).all())
        gpus = list(conn.scalars(text("SELECT id FROM gpus ORDER BY id")))
        torn = conn.scalar(text("SELECT count(*) FROM (SELECT ts FROM gpu_samples GROUP BY ts HAVING count(*) <> :n) t"), {"n": len(gpus)})
    engine.dispose()
    per_gpu = {int(g): {"raw": int(raw.get(g, 0)), "folded": int(folded.get(g, 0))} for g in gpus}
    kept = [v["raw"] + v["folded"] for v in per_gpu.values()]
    return {
        "ticks": len(times), "gpus": len(gpus), "raw_rows": sum(int(v) for v in raw.values()),
        "folded_ticks": sum(int(v) for v in folded.values()),
        "lost": sum(max(len(times) - k, 0) for k in kept), "duplicated": sum(max(k - len(times), 0) for k in kept)
        + sum(int(raw.get(g, 0)) - int(distinct.get(g, 0)) for g in gpus),
        "torn_ticks": int(torn or 0),
    }


def postgres_part(tmp: Path, log: Path) -> dict[str, Any]:
    bindir = _pg_bindir()
    if bindir is None:
        raise SystemExit("the fault run needs Postgres' server binaries (initdb, pg_ctl)")
    cap, header, ticks = capture(tmp, repeat=8)
    times = tick_times(ticks)
    spool = tmp / "spool"
    spool.mkdir()
    tmpfs = False
    if os.geteuid() == 0:
        tmpfs = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(spool)], capture_output=True).returncode == 0
    pg = PrivatePostgres(bindir)
    pg.start()
    vllm = VllmFaults()
    events: list[tuple[float, str]] = []
    t0 = time.monotonic()

    def note(what: str) -> None:
        events.append((round(time.monotonic() - t0, 1), what))

    try:
        proc = agent(cap, pg.url, spool, "fault-8gpu", vllm.server.url, log)
        wait_rows(pg.url, GPUS)  # writing: the first flush is in
        first_row = time.monotonic()
        schedule = [
            (3, lambda: vllm.at("hang"), "vLLM /metrics hangs"),
            (6, lambda: pg.stop("fast"), "Postgres fast stop"),
            (9, pg.start, "Postgres started"),
            (12, lambda: vllm.at("garbage"), "vLLM answers garbage"),
            (14, pg.kill, "Postgres SIGKILLed, every process (12 s: the spool's disk fills, memory holds the rest)"),
            (20, lambda: vllm.at("overflow"), "vLLM sends an overflowing value"),
            (26, pg.start, "Postgres started"),
            (28, lambda: vllm.at("healthy"), "vLLM healthy again"),
            (34, lambda: pg.stop("fast"), "Postgres fast stop"),
        ]
        for at, action, name in schedule:
            time.sleep(max(0.0, first_row + at - time.monotonic()))
            action()
            note(name)
        scraped_before = len(vllm.server.requests)
        # SIGKILL with Postgres down and the spool holding ticks; start again on the rest
        time.sleep(max(0.0, first_row + 37 - time.monotonic()))
        kill_capture_ts = times[0] + (time.monotonic() - first_row) + 1.0  # the first row came ~1 s (a flush) after its tick
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        note("agent SIGKILLed (Postgres down, 3 s of ticks in the spool)")
        rest = rest_of(header, ticks, kill_capture_ts - OVERLAP_S, tmp, "rest.jsonl.gz")
        restarts = [0]

        def supervise() -> subprocess.Popen[bytes]:
            """What systemd does (Restart=on-failure): an agent that cannot reach its store at
            start exits 75 and is started again (RestartSec; 0.5 s here)."""
            while True:
                p = agent(rest, pg.url, spool, "fault-8gpu", vllm.server.url, log)
                restarts[0] += 1
                try:
                    if p.wait(timeout=3) != 75:
                        raise SystemExit(f"the restarted agent exited {p.returncode}")
                except subprocess.TimeoutExpired:
                    return p  # running: it reached the store
                time.sleep(0.5)

        runner: list[subprocess.Popen[bytes]] = []
        sup = threading.Thread(target=lambda: runner.append(supervise()), daemon=True)
        sup.start()
        note("agent started again on the rest of the capture (exits 75 while Postgres is down; restarted)")
        time.sleep(max(0.0, first_row + 40 - time.monotonic()))
        pg.start()
        note("Postgres started")
        sup.join(60)
        proc = runner[0]
        out, _ = proc.communicate(timeout=240)
        note(f"agent exited {proc.returncode} (started {restarts[0]} times after the kill)")
        acc = accounting(pg.url, times)
        acc["agent_exit"] = proc.returncode
        acc["agent_said"] = out.decode(errors="replace").strip().splitlines()[-1:] if out else []
        acc["vllm_scrapes_after_faults"] = vllm.requests_since(scraped_before)
        acc["spool_on_tmpfs_256k"] = tmpfs
        acc["events"] = events
        return acc
    finally:
        vllm.close()
        pg.destroy()
        if tmpfs:
            subprocess.run(["umount", "-l", str(spool)], capture_output=True)


def sqlite_part(tmp: Path, log: Path) -> dict[str, Any]:
    cap, header, ticks = capture(tmp, repeat=4)
    times = tick_times(ticks)
    db = tmp / "kill.db"
    url = f"sqlite:///{db}"
    spool = tmp / "spool-sqlite"
    proc = agent(cap, url, spool, "kill-8gpu", None, log)
    wait_rows(url, GPUS)
    first_row = time.monotonic()
    kills = 0
    for k in range(3):
        time.sleep(max(0.0, first_row + 5 * (k + 1) - time.monotonic()))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        kills += 1
        # the killed agent had read at most one flush interval past what it had written
        at = newest_ts(url)
        proc = agent(rest_of(header, ticks, at - OVERLAP_S, tmp, f"rest-{k}.jsonl.gz"), url, spool, "kill-8gpu", None, log)
    proc.communicate(timeout=240)
    acc = accounting(url, times)
    acc["agent_exit"] = proc.returncode
    acc["kills"] = kills
    with sqlite3.connect(db) as conn:
        acc["integrity_check"] = conn.execute("PRAGMA integrity_check").fetchone()[0]
    return acc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the accounting here too")
    args = ap.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vgpumon-fault-") as d:
        tmp = Path(d)
        log = tmp / "agent.log"
        if os.geteuid() == 0:
            os.chmod(tmp, 0o755)  # noqa: S103  the private Postgres runs as the postgres user and needs to reach its directory
        result = {"postgres": postgres_part(tmp, log), "sqlite": sqlite_part(tmp, log)}
        agent_log = [line.replace(d, "<tmp>") for line in log.read_text(errors="replace").splitlines()] if log.exists() else []
    result["seconds"] = round(time.monotonic() - started, 1)
    result["agent_tracebacks"] = sum(1 for line in agent_log if line.startswith("Traceback"))
    result["agent_log"] = [line for line in agent_log if "spool" in line or "store" in line or "vLLM" in line][:40]
    pg, lite = result["postgres"], result["sqlite"]
    for t, what in pg["events"]:
        print(f"  {t:6.1f} s  {what}")
    print(f"postgres: {pg['ticks']} ticks x {pg['gpus']} GPUs: {pg['raw_rows']} raw rows + {pg['folded_ticks']} ticks folded "
          f"into rollups; lost {pg['lost']}, duplicated {pg['duplicated']}, torn ticks {pg['torn_ticks']}; agent exit "
          f"{pg['agent_exit']}; vLLM scraped {pg['vllm_scrapes_after_faults']} times after the faults; spool on a full "
          f"tmpfs: {'yes' if pg['spool_on_tmpfs_256k'] else 'no (not root: skipped)'}")
    print(f"sqlite: {lite['ticks']} ticks x {lite['gpus']} GPUs, {lite['kills']} SIGKILLs: {lite['raw_rows']} raw rows; "
          f"lost {lite['lost']}, duplicated {lite['duplicated']}, torn ticks {lite['torn_ticks']}; integrity_check "
          f"{lite['integrity_check']}; agent exit {lite['agent_exit']}")
    print(f"agent tracebacks in its log: {result['agent_tracebacks']}; {result['seconds']} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    ok = (pg["lost"] == pg["duplicated"] == pg["torn_ticks"] == 0 and pg["agent_exit"] == 0
          and pg["vllm_scrapes_after_faults"] > 0 and lite["lost"] == lite["duplicated"] == lite["torn_ticks"] == 0
          and lite["integrity_check"] == "ok" and lite["agent_exit"] == 0 and result["agent_tracebacks"] == 0)
    print("fault run: " + ("every tick accounted for" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
