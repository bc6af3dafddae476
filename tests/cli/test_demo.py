"""The README's demo as a newcomer runs it: one command shows the 8-GPU incident's CRITICAL first
screen with evidence and next step, a healthy host and the shared-switch review; and a replay
shifted to end now keeps working with the default retention of `db prune` whatever the
capture's age (the recorded captures are from November 2026, older than the 72 h raw retention
on any later day)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from conftest import DATA, H200_CAPTURE, stored_ticks, vgpumon

from vgpumon.sources.nvml.capture import ReplayBackend, capture_end

pytestmark = pytest.mark.slow  # starts processes: not in the quick subset (docs/testing.md)


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return vgpumon(*args, env=env, clean=True, timeout=300)


def _replay_prune_diagnose(tmp_path: Path, *shift: str) -> tuple[subprocess.CompletedProcess[str], int]:
    db = tmp_path / "s.db"
    out = run("agent", "--replay", str(H200_CAPTURE), "--hostname", "h", "--db", str(db), "--listen", "off",
              "--spool", str(tmp_path / "spool"), *shift)
    assert out.returncode == 0, out.stderr
    # the retention of the README's demo, stated here so that the test does not depend on the default
    out = run("db", "prune", "--db", str(db), "--raw-retention", "72h", "--rollup-retention", "90d")
    assert out.returncode == 0, out.stderr
    return run("diagnose", "h", "--db", str(db)), stored_ticks(db)


def test_a_replay_older_than_the_raw_retention_keeps_raw_rows_only_when_shifted_to_now(tmp_path):
    """Without --shift-to-now, a capture older than the raw retention loses its raw rows to
    `db prune`; shifted, the same capture keeps all 76 rows and diagnose reports it as fresh."""
    import time

    assert time.time() - capture_end(H200_CAPTURE) > 72 * 3600, "the recorded capture is older than the raw retention"
    _, old_rows = _replay_prune_diagnose(tmp_path / "as-recorded")
    assert old_rows == 0
    new, new_rows = _replay_prune_diagnose(tmp_path / "shifted", "--shift-to-now")
    assert new.returncode == 0, new.stdout + new.stderr
    assert new.stdout.startswith("OK h — nothing to act on; data as of"), new.stdout.splitlines()[0]
    assert new_rows == 76
    # the verdict's age is the time since the replay, not since November
    assert " days ago" not in new.stdout.splitlines()[0]


def test_diagnose_reads_the_rollups_where_the_raw_rows_have_expired(tmp_path):
    """The capture, older than the raw retention, pruned: its raw rows are gone, the 1-minute
    rollups stay, and diagnose reports from them — not UNKNOWN "no samples" — with the same
    maxima as the report from the raw rows before the prune, and says where its figures come from."""
    db = tmp_path / "s.db"
    out = run("agent", "--replay", str(H200_CAPTURE), "--hostname", "h", "--db", str(db), "--listen", "off", "--spool", str(tmp_path / "spool"))
    assert out.returncode == 0, out.stderr
    before = run("diagnose", "h", "--db", str(db), "--json")
    assert run("db", "prune", "--db", str(db), "--raw-retention", "72h", "--rollup-retention", "90d").returncode == 0
    assert stored_ticks(db) == 0
    after = run("diagnose", "h", "--db", str(db), "--json")
    text = run("diagnose", "h", "--db", str(db))
    assert after.returncode == 0 and text.stdout.startswith("OK h — nothing to act on"), text.stdout[:300]
    import json

    raw, rolled = json.loads(before.stdout)["gpus"][0], json.loads(after.stdout)["gpus"][0]
    for area, key in (("sm_active", "max_ratio"), ("utilization", "max_ratio"), ("power", "max_watts"), ("temperature", "max_celsius")):
        assert rolled[area][key] == pytest.approx(raw[area][key]), (area, rolled[area], raw[area])
    assert rolled["pcie"]["rx"]["max_bytes_per_second"] == pytest.approx(raw["pcie"]["rx"]["max_bytes_per_second"])
    assert "59.24 GB/s (94.0 %)" in text.stdout  # RX max, as the raw report showed it
    assert "its figures are from the 1-minute rollups" in " ".join(text.stdout.split())


def test_shift_to_now_without_a_replay_is_a_usage_error(tmp_path):
    out = run("agent", "--shift-to-now", "--db", str(tmp_path / "s.db"), "--listen", "off")
    assert out.returncode == 64
    assert out.stderr.strip() == "vgpumon: --shift-to-now moves a replay in time: give --replay CAPTURE"
    assert not (tmp_path / "s.db").exists()


@pytest.mark.parametrize("clock", ["wall", "capture", None])
def test_a_recorded_pace_replay_is_stamped_on_the_clock_asked_for(tmp_path, clock):
    """``--replay-clock``: at the recorded pace the default is the wall clock; ``capture`` keeps the
    capture's own times, which an agent restarted on the rest of a capture needs for the ticks it
    sends twice to be stored once (bench/fault_run.py)."""
    db = tmp_path / "s.db"
    started = time.time()
    out = run("agent", "--replay", str(H200_CAPTURE), "--pace", "recorded", *(["--replay-clock", clock] if clock else []),
              "--duration", "2s", "--db", str(db), "--listen", "off", "--no-rules", "--spool", str(tmp_path / "spool"))
    assert out.returncode == 0, out.stderr
    with sqlite3.connect(db) as conn:
        first = conn.execute("SELECT min(ts) FROM gpu_samples").fetchone()[0]
    assert first is not None, "the replay stored no tick"
    if clock == "capture":
        assert first / 1000.0 == pytest.approx(ReplayBackend(H200_CAPTURE).first_ts, abs=0.001)  # the capture's own first tick
    else:  # the default at the recorded pace: the first tick lands when it is replayed
        assert started - 1 <= first / 1000.0 <= time.time()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--replay-clock", "capture"], "vgpumon: --replay-clock stamps a replay: give --replay CAPTURE (a live agent reads the wall clock)"),
        (["--replay", str(H200_CAPTURE), "--replay-clock", "wall"],
         "vgpumon: --replay-clock wall needs --pace recorded: a replay as fast as possible runs ahead of the wall clock"),
    ],
)
def test_a_replay_clock_that_cannot_apply_is_a_usage_error(tmp_path, args, said):
    out = run("agent", *args, "--db", str(tmp_path / "s.db"), "--listen", "off")
    assert out.returncode == 64
    assert out.stderr.strip() == said
    assert not (tmp_path / "s.db").exists()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    d = tmp_path_factory.mktemp("demo") / "work"
    return run("demo", "--data", str(DATA), "--dir", str(d), "--lines", "24", COLUMNS="80"), d


def test_the_demo_opens_on_the_incidents_critical_screen_with_evidence_and_next_step(demo):
    out, _ = demo
    assert out.returncode == 0, out.stderr
    text = out.stdout
    sick = text[text.index("$ vgpumon diagnose gpu-incident"):text.index("$ vgpumon diagnose h200-healthy")]
    lines = sick.splitlines()[1:]
    assert lines[0].startswith("CRITICAL gpu-incident — 3 critical, 2 warning; data as of"), lines[0]
    first_screen = " ".join(" ".join(lines[:24]).split())
    # the three critical reasons, each with its evidence and what to do
    assert "CRITICAL GPU 3: 2 volatile uncorrectable ECC errors" in first_screen
    assert "→ Drain the GPU (stop scheduling work on it), then reset it (`nvidia-smi -r -i 3`) or reboot." in first_screen
    assert "CRITICAL GPU 5: Unreadable for" in first_screen and "(NVML: GPU is lost)" in first_screen
    assert "CRITICAL GPU 5: XID 79 (GPU has fallen off the bus)" in first_screen
    assert "more lines: findings in full" in sick
    assert max(len(line) for line in lines[1:]) <= 80


def test_the_demo_shows_a_healthy_host_and_the_shared_switch_review(demo):
    out, work = demo
    text = out.stdout
    healthy = text[text.index("$ vgpumon diagnose h200-healthy"):text.index("$ vgpumon capacity")]
    assert healthy.splitlines()[1].startswith("OK h200-healthy — nothing to act on; data as of"), healthy.splitlines()[1]
    review = " ".join(text[text.index("$ vgpumon capacity gpu-incident"):].split())
    # the demo's incident has the four cards behind each Gen5 x16 switch share its link (each gets a
    # quarter of the recorded copy's rate): near but not over the link, SATURATED, and two more
    # cards projected over it. IMPOSSIBLE is for loads no link carries (docs/capacity.md), which a
    # demo must not show as what a real host looks like
    assert "IMPOSSIBLE" not in review, review
    assert "SATURATED: 0000:00:01.0, 0000:00:03.0, 0000:10:00.0, 0000:20:00.0" in review, review
    shares = [float(x) for x in re.findall(r"p95 of link (\d+\.\d) % SATURATED", review)]
    assert len(shares) == 4 and all(80 <= x < 100 for x in shares), shares
    assert re.search(r"bridge 0000:10:00\.0: adding 2 cards with the current per-card load brings the shared link to 1[0-9]{2}\.\d % "
                     r"at p95 \(saturated from 80\.0 %; no headroom\)", review), review
    # the store stays for the reader, with both hosts, and the demo says where
    assert f"The store stays in {work}" in " ".join(text.split())
    again = run("diagnose", "gpu-incident", "--db", str(work / "demo.db"))
    assert again.returncode == 2


def test_the_demo_without_its_captures_is_one_line_and_exit_65(tmp_path):
    out = run("demo", "--data", str(tmp_path), "--dir", str(tmp_path / "w"))
    assert out.returncode == 65
    assert out.stderr.count("\n") == 1 and "h200-workload.jsonl.gz is not there" in out.stderr
