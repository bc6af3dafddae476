"""An agent just started answers `diagnose` from its first tick: that tick is written at once, not
a flush interval later (before, the API's report was UNKNOWN "not in the store" for the first
10 s while /metrics already served the tick)."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path

import pytest
from conftest import H200_CAPTURE, VGPUMON, stored_ticks, wait_for

from vgpumon.testing.vllm import free_port

pytestmark = pytest.mark.slow  # starts an agent process: not in the quick subset (docs/testing.md)


def test_the_first_tick_is_in_the_store_and_the_api_diagnose_reports_it(tmp_path: Path):
    port = free_port()
    db = tmp_path / "s.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    # five minutes (the longest allowed) between batched writes: only the first-tick write can
    # put a row in the store while the 76 s capture replays
    agent = subprocess.Popen(VGPUMON + ["agent", "--replay", str(H200_CAPTURE), "--pace", "recorded", "--shift-to-now", "--hostname", "h",
                                        "--db", str(db), "--spool", str(tmp_path / "spool"), "--listen", f"127.0.0.1:{port}",
                                        "--flush-interval", "300", "--no-vllm"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_for(lambda: stored_ticks(db) > 0 or agent.poll() is not None, timeout=60, what="the first tick in the store")
        assert agent.poll() is None, "the agent is still replaying: the row is the first tick's, not the final flush's"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/diagnose", timeout=30) as answer:  # noqa: S310  a local agent
            report = json.loads(answer.read())
        assert report["status"] != "unknown", report["findings"][:2]
        assert report["host"] == "h" and report["gpus"][0]["index"] == 0
    finally:
        agent.terminate()
        agent.wait(60)
