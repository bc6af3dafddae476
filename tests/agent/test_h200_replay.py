"""The real H200 capture, replayed through agent → store → diagnose, shows what the card did.

The capture (tests/data/README.md) was recorded by ``vgpumon record`` on an H200 while
bench/h200_workload.py ran idle → pinned H2D copies → bf16 matmuls → a growing allocation; the
phases file holds the wall-clock bounds the workload itself logged. A tick's GPM figures average
the interval that ends at the tick, so each phase is checked on ticks at least 1.2 s inside it.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import H200_CAPTURE, H200_PHASES, KEEP_ALL, phase, replay_into

from vgpumon.base.pcie import link_capacity_bytes_per_second
from vgpumon.diagnose import build_report

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

COLUMNS = ("sm_active_ratio", "utilization_gpu_ratio", "pcie_rx_bytes_per_second", "memory_used_bytes")


def _series(store, start: float, end: float):
    (gpu,) = store.gpus_of("h200-replay")
    return store.series(gpu.id, start, end, COLUMNS)


def _inside(name: str, store):
    p = phase(name)
    rows = _series(store, p["start"] + 1.2, p["end"])
    assert len(rows) >= 8, f"too few ticks inside phase {name}"
    return rows


def test_copy_phase_saturates_pcie_rx_while_sms_idle(db_url, store_of):
    replay_into(db_url)
    rows = _inside("h2d_copy", store_of(db_url))
    for r in rows:
        assert r["pcie_rx_bytes_per_second"] > 40e9
        assert r["sm_active_ratio"] < 0.05
        # the reason vgpumon exists: "GPU util" says busy while no SM works
        assert r["utilization_gpu_ratio"] >= 0.9
    # GPM agrees with what the program measured for itself (55.0 GB/s) within 10 %
    mean_rx = sum(r["pcie_rx_bytes_per_second"] for r in rows) / len(rows)
    assert abs(mean_rx / H200_PHASES["h2d_bytes_per_second"] - 1) < 0.10


def test_matmul_phase_keeps_sms_busy(db_url, store_of):
    replay_into(db_url)
    rows = _inside("matmul", store_of(db_url))
    assert all(r["sm_active_ratio"] > 0.80 for r in rows)
    assert all(r["pcie_rx_bytes_per_second"] < 1e9 for r in rows)


def test_growth_phase_memory_rises_monotonically_by_the_amount_allocated(db_url, store_of):
    replay_into(db_url)
    store = store_of(db_url)
    g = phase("growth")
    before = _series(store, g["start"] - 2.0, g["start"])[-1]["memory_used_bytes"]
    during = [r["memory_used_bytes"] for r in _series(store, g["start"], g["end"] + 0.5)]
    after = _series(store, g["end"] + 0.5, phase("idle_end")["end"])[0]["memory_used_bytes"]
    assert all(b >= a for a, b in zip(during, during[1:])), "memory used fell during the growth phase"
    assert during[-1] > during[0]
    assert after - before == H200_PHASES["growth_total_bytes"]  # 24 × 512 MiB, to the byte


def test_diagnose_report_shows_the_h200_and_its_phases(db_url, store_of):
    agent = replay_into(db_url)
    assert agent.stats.ticks >= 60 and agent.stats.rows_pending == 0
    report = build_report(store_of(db_url), "h200-replay", window_seconds=900)
    assert report["status"] == "ok"
    (gpu,) = report["gpus"]
    assert gpu["name"] == "NVIDIA H200"
    assert gpu["samples"] == agent.stats.ticks
    link = gpu["pcie"]["link_max"]
    assert (link["generation"], link["width"]) == (5, 16)
    assert gpu["pcie"]["link_current"] == {"generation": 5, "width": 16}
    assert gpu["pcie"]["rx"]["max_share_of_max_link"] >= 0.6
    assert gpu["sm_active"] == {"source": "gpm", "mean_ratio": gpu["sm_active"]["mean_ratio"], "max_ratio": gpu["sm_active"]["max_ratio"]}
    assert gpu["sm_active"]["max_ratio"] >= 0.8
    assert gpu["ecc"] == {"corrected_volatile": 0, "uncorrected_volatile": 0, "corrected_aggregate": 0, "uncorrected_aggregate": 0}
    assert 30 <= gpu["temperature"]["max_celsius"] <= 90
    assert 600 <= gpu["power"]["max_watts"] <= 700  # H200 SXM board limit is 700 W
    assert gpu["memory"]["total_bytes"] == 150754820096
    assert gpu["unknown"] == {}


def test_readme_acceptance_commands(tmp_path):
    """The README's try-it commands, as a user types them."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    run = [sys.executable, "-m", "vgpumon"]
    subprocess.run(run + ["agent", "--replay", str(H200_CAPTURE), "--db", url, "--listen", "off"], check=True, capture_output=True)
    out = subprocess.run(run + ["diagnose", "localhost", "--db", url, "--json"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    (gpu,) = json.loads(out.stdout)["gpus"]
    assert gpu["name"] == "NVIDIA H200"
    cap = link_capacity_bytes_per_second(5, 16)
    assert gpu["pcie"]["rx"]["max_bytes_per_second"] >= 0.6 * cap
    assert gpu["sm_active"]["max_ratio"] >= 0.8
    text = subprocess.run(run + ["diagnose", "localhost", "--db", url], capture_output=True, text=True).stdout
    assert "NVIDIA H200" in text and "PCIe RX" in text and "Gen5 x16" in text
    subprocess.run(run + ["db", "prune", "--db", url, *KEEP_ALL], check=True, capture_output=True)
    review = subprocess.run(run + ["capacity", "--db", url, "--json"], capture_output=True, text=True)
    assert review.returncode == 0, review.stderr
    (host,) = json.loads(review.stdout)["hosts"]
    assert host["gpus"] and host["gpus"][0]["rx"]["max_bytes_per_second"] >= 0.6 * cap
