"""A capture's ticks pass a door too: a tick with an impossible time, or values of the wrong type,
costs only itself; a capture that cannot be replayed at all is one line, exit 65. Before, one
tick stamped 1e300 s made every later tick of the replay a dead letter (ticks are stored in
order: each was stamped just after it, and refused), and a GPM answer of the wrong shape was a
traceback and exit 70. The agent replays the recorded H200 capture (76 ticks) edited one way."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import H200_CAPTURE

_LINES = gzip.open(H200_CAPTURE, "rt").read().splitlines()
_TICKS = sum(1 for ln in _LINES[1:] if json.loads(ln)["tick"] >= 0)


def _edited(tmp_path: Path, *, ts: float | None = None, fn: str | None = None, value: object = None, every: bool = False) -> Path:
    """The capture with its tick 4 (or every tick) edited: its time, or one call's answer."""
    out = list(_LINES)
    for i in range(1, len(out)):
        t = json.loads(out[i])
        if not every and t["tick"] != 4:
            continue
        if ts is not None:
            t["ts"] = ts
        for call in t["calls"]:
            if call[1] == fn:
                call[4] = {"v": value}
        out[i] = json.dumps(t)
    path = tmp_path / "edited.jsonl"
    path.write_text("\n".join(out) + "\n")
    return path


def _replay(tmp_path: Path, capture: Path) -> tuple[subprocess.CompletedProcess[str], int | None]:
    db = tmp_path / "store.db"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_STATE_HOME": str(tmp_path / "state")}
    out = subprocess.run([sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(capture),
                          "--db", str(db), "--hostname", "h"], capture_output=True, text=True, timeout=300, env=env)
    rows = None
    if db.exists():
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT count(*) FROM gpu_samples").fetchone()[0]
    return out, rows


@pytest.mark.parametrize("ts", [1e300, 1.7e12, -5.0, 1.0], ids=["1e300", "milliseconds", "negative", "1970"])
def test_one_tick_with_an_impossible_time_costs_only_that_tick(tmp_path, ts):
    out, rows = _replay(tmp_path, _edited(tmp_path, ts=ts))
    assert out.returncode == 0, out.stderr
    assert rows == _TICKS - 1  # every other tick stored, at its own time
    assert "Traceback" not in out.stderr and "dead-letter" not in out.stderr + out.stdout
    assert "capture tick 4 skipped: its time" in out.stderr and "not a plausible time" in out.stderr
    assert not list((tmp_path / "state").rglob("*.dead-letter.jsonl"))


@pytest.mark.parametrize(
    "fn, value",
    [
        ("gpm", [1, 2]),
        ("gpm", {"2": "busy", "x": 1, "5": {"e": "q"}}),
        ("nvmlDeviceGetPowerUsage", "78 W"),
        ("nvmlDeviceGetMemoryInfo", [1, 2]),
        ("nvmlDeviceGetUtilizationRates", {"gpu": None, "memory": "x"}),
        ("nvmlDeviceGetComputeRunningProcesses", [{"pid": "x", "usedGpuMemory": "y"}, 5, None]),
        ("nvmlDeviceGetPowerUsage", 19 * 10**308),  # found by the fuzzer: OverflowError, exit 70
        ("nvmlDeviceGetTemperature", -(10**400)),
    ],
    ids=["gpm-list", "gpm-odd-entries", "power-text", "memory-list", "utilization-fields", "processes-odd",
         "power-310-digits", "temperature-400-digits"],
)
def test_values_of_the_wrong_type_cost_only_themselves(tmp_path, fn, value):
    """Every tick's answer of that call is of the wrong type: each is refused (or missing), and
    every tick is stored with its other values."""
    out, rows = _replay(tmp_path, _edited(tmp_path, fn=fn, value=value, every=True))
    assert out.returncode == 0, out.stderr
    assert rows == _TICKS and "Traceback" not in out.stderr


@pytest.mark.parametrize("value", ["x", 10**6, -1, None])
def test_a_capture_whose_device_count_is_no_count_is_one_line_exit_65(tmp_path, value):
    """Its init block's ``nvmlDeviceGetCount``: nothing of it can be replayed (a million GPUs
    used to be replayed until the timeout)."""
    out, rows = _replay(tmp_path, _edited(tmp_path, fn="nvmlDeviceGetCount", value=value, every=True))
    assert out.returncode == 65, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "nvmlDeviceGetCount answers" in line and "not a count of 0 to 64 GPUs" in line, line
    assert not rows


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_capture_that_is_not_a_regular_file_is_one_line_exit_65(tmp_path, kind):
    """``--replay`` naming a FIFO used to wait for a writer for ever; ``/dev/zero`` read 64 Mi
    characters before it was refused. Both are refused on sight, like ``--config``'s files."""
    import os

    if kind == "fifo":
        path = tmp_path / "capture.jsonl"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero")
    out, rows = _replay(tmp_path, path)
    assert out.returncode == 65, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert line == f"vgpumon: cannot read capture {path}: {'a FIFO' if kind == 'fifo' else 'a character device'}, not a regular file"
    assert not rows
