"""What a user sees at the command line: exit codes and one-line errors."""

from __future__ import annotations

import json

import pytest
from conftest import H200_CAPTURE, ROOT, nvml_present, vgpumon

from vgpumon.sources.nvml.backend import NVML_ERROR_NOT_SUPPORTED
from vgpumon.sources.nvml.capture import read_capture
from vgpumon.testing import scenarios

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)


run = vgpumon


@pytest.mark.skipif(nvml_present(), reason="this host has an NVIDIA driver; the no-driver path cannot be shown here")
def test_agent_without_driver_names_the_cause_in_one_line_and_exits_69(tmp_path):
    out = run("agent", "--duration", "1", "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert out.returncode == 69
    assert not (tmp_path / "x.db").exists(), "no driver: no empty store left behind"
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "libnvidia-ml.so.1" in lines[0] and "not found" in lines[0]
    assert "Traceback" not in out.stderr


def test_usage_error_exits_64_not_critical():
    out = run("diagnose")
    assert out.returncode == 64
    assert "Missing argument" in out.stderr


def test_bad_window_is_a_usage_error():
    out = run("diagnose", "localhost", "--window", "soon")
    assert out.returncode == 64
    assert "not a duration" in out.stderr


def test_diagnose_unknown_host_is_unknown_and_lists_known_hosts(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run("agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", url, "--hostname", "gpu-host-17").returncode == 0
    out = run("diagnose", "gpu-host-42", "--db", url)
    assert out.returncode == 3
    assert "gpu-host-42" in out.stdout and "gpu-host-17" in out.stdout
    assert run("diagnose", "gpu-host-17", "--db", url).returncode == 0


def test_diagnose_on_empty_store_is_unknown(tmp_path):
    missing = tmp_path / "missing.db"
    out = run("diagnose", "localhost", "--db", f"sqlite:///{missing}", "--json")
    assert out.returncode == 3
    assert '"status": "unknown"' in out.stdout
    assert "no store at" in out.stderr
    assert not missing.exists(), "a reader must not create an empty store"


def test_unreachable_store_is_unknown_with_one_line():
    out = run("diagnose", "localhost", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert out.returncode == 3
    # one line: the UNKNOWN report's, which says why (docs/cli.md); nothing again on stderr
    assert out.stderr == "" and len(out.stdout.strip().splitlines()) == 1
    assert out.stdout.startswith("UNKNOWN ") and ": store " in out.stdout
    as_json = run("diagnose", "localhost", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none", "--json")
    assert as_json.returncode == 3 and as_json.stderr.startswith("vgpumon: store") and "Traceback" not in as_json.stderr
    assert len(as_json.stderr.strip().splitlines()) == 1


def test_garbage_capture_is_a_data_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("this is not a capture\n")
    out = run("agent", "--listen", "off", "--replay", str(bad), "--db", f"sqlite:///{tmp_path / 'x.db'}")
    assert out.returncode == 65
    assert "not a vgpumon capture" in out.stderr and "Traceback" not in out.stderr


def test_gpu_without_gpm_is_labelled_utilization_proxy(tmp_path):
    """Pre-Hopper path (derived: GPM support query answers NOT_SUPPORTED): the report must not
    pass utilization off as SM activity, and PCIe bytes/s are N/A with the reason."""
    header, ticks = read_capture(H200_CAPTURE)
    header, ticks = scenarios.fail_call(header, ticks, "nvmlGpmQueryDeviceSupport", NVML_ERROR_NOT_SUPPORTED, from_tick=-1)
    cap = tmp_path / "no-gpm.jsonl"
    scenarios.write(cap, header, ticks)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run("agent", "--listen", "off", "--replay", str(cap), "--db", url).returncode == 0
    out = run("diagnose", "localhost", "--db", url)
    assert out.returncode == 0
    # SM activity and utilization side by side, labelled: no GPM leaves SM activity N/A with the
    # reason, and utilization (busy time, not SM work) keeps its own column
    assert "SM act." in out.stdout and "util." in out.stdout and "SM act.: GPM SM activity" in out.stdout
    assert "N/A (no GPM on this GPU" in out.stdout
    (gpu,) = json.loads(run("diagnose", "localhost", "--db", url, "--json").stdout)["gpus"]
    assert gpu["sm_active"]["max_ratio"] is None and "no GPM" in gpu["unknown"]["sm_active_ratio.max"]
    assert gpu["utilization"]["max_ratio"] == 1.0  # the copy and matmul phases: util 100 % either way
    assert gpu["pcie"]["rx"]["max_bytes_per_second"] is None and "no GPM" in gpu["unknown"]["pcie_rx_bytes_per_second.max"]


def test_db_commands_upgrade_stats_and_prune(tmp_path):
    """What an operator types: upgrade an empty store, see what an agent stored, prune it with a
    short raw window (the capture is older than a minute): the raw rows become 1-minute rollups."""
    import json

    url = f"sqlite:///{tmp_path / 'x.db'}"
    up = run("db", "upgrade", "--db", url)
    assert up.returncode == 0 and "store schema at" in up.stdout
    assert run("agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", url, "--spool", str(tmp_path / "spool")).returncode == 0
    stats = json.loads(run("db", "stats", "--db", url, "--json").stdout)["tables"]
    raw = next(t for t in stats if t["table"] == "gpu_samples")
    assert raw["rows"] > 60 and raw["bytes"] > 0 and raw["oldest"] < raw["newest"]
    unconfirmed = run("db", "prune", "--db", url, "--raw-retention", "1s", "--json")
    assert unconfirmed.returncode == 64 and "--yes" in unconfirmed.stderr, "a retention under 1h asks for --yes"
    assert json.loads(run("db", "stats", "--db", url, "--json").stdout)["tables"][0]["rows"] == raw["rows"]
    pruned = run("db", "prune", "--db", url, "--raw-retention", "1s", "--yes", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["rows_deleted"] == raw["rows"]
    after = {t["table"]: t for t in json.loads(run("db", "stats", "--db", url, "--json").stdout)["tables"]}
    assert after["gpu_samples"]["rows"] == 0
    assert 2 <= after["gpu_samples_1m"]["rows"] <= 3 and after["gpu_samples_1m"]["folded_samples"] == 0
    text = run("db", "stats", "--db", url).stdout
    assert "gpu_samples_1m" in text and "oldest (UTC)" in text


def test_an_agent_whose_store_is_down_at_start_exits_75_and_its_unit_restarts_it():
    """A fleet's Postgres down (or restarting) while an agent starts: exit 75, which the systemd
    unit restarts on, not 69, which it does not (the host used to stay unmonitored)."""
    import os
    import re

    out = run("agent", "--replay", str(H200_CAPTURE), "--listen", "off", "--db", "postgresql+psycopg://vgpumon@127.0.0.1:1/fleet")
    assert out.returncode == 75, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Connection refused" in out.stderr
    unit = (ROOT / "exporters" / "systemd" / "vgpumon-agent.service").read_text()
    assert re.search(r"^Restart=on-failure$", unit, re.M)
    prevented = {int(c) for line in re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.M) for c in line.split()}
    assert 75 not in prevented and 69 in prevented
    url = os.environ.get("VGPUMON_TEST_POSTGRES_URL")
    if url:  # a server that answers "no such role" needs a person: 69, not restarted for nothing
        from sqlalchemy.engine import make_url

        wrong = make_url(url).set(username="no_such_role_vgpumon").render_as_string(hide_password=False)
        out = run("agent", "--replay", str(H200_CAPTURE), "--listen", "off", "--db", wrong)
        assert out.returncode == 69 and "does not exist" in out.stderr, out.stderr


def test_db_commands_on_an_unreachable_store_exit_75_with_one_line():
    out = run("db", "stats", "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert out.returncode == 75  # EX_TEMPFAIL: out of reach for now
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert run("db", "prune", "--raw-retention", "2d", "--rollup-retention", "1d").returncode == 64


def test_stale_host_is_unknown_with_max_age_and_reported_without(tmp_path):
    """The replayed capture's newest sample is long past: from monitoring (--max-age) that is
    UNKNOWN, "is the agent running?"; a post-mortem without --max-age still reports it."""
    db = tmp_path / "x.db"  # a plain path is a SQLite store
    assert run("agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", str(db)).returncode == 0
    stale = run("diagnose", "localhost", "--db", str(db), "--max-age", "2m")
    assert stale.returncode == 3
    assert "is the agent running?" in stale.stdout
    assert run("diagnose", "localhost", "--db", str(db)).returncode == 0


def test_short_window_still_shows_the_ecc_counts(tmp_path):
    """ECC is read every 10 ticks; a 3 s window still shows the newest counts, not N/A."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert run("agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", url).returncode == 0
    out = run("diagnose", "localhost", "--db", url, "--window", "3s")
    assert "ECC uncorr. 0 vol. / 0 agg." in out.stdout and "N/A (ECC" not in out.stdout


def test_agent_alerts_and_diagnose_reports_the_rules_with_overridable_thresholds(tmp_path):
    """What an operator sees: the recorded H2D copy phase, 10 minutes of it, replayed by the agent:
    it logs the alert as it fires; diagnose exits 1 (WARNING) naming it; a [rules] file that
    raises the saturation share to 99 % makes the same window OK; a mistyped key is a usage error."""
    from rules_support import copy_phase

    cap = tmp_path / "copy.jsonl.gz"
    scenarios.write(cap, *copy_phase(minutes=10))
    url = f"sqlite:///{tmp_path / 'x.db'}"
    agent = run("agent", "--listen", "off", "--replay", str(cap), "--db", url, "--hostname", "h")
    assert agent.returncode == 0, agent.stderr
    assert "FIRING GpuPcieSaturated [warning] hostname=h gpu=0" in agent.stderr
    out = run("diagnose", "h", "--db", url, "--window", "10m")
    assert out.returncode == 1, out.stdout
    verdict, reason = out.stdout.splitlines()[:2]
    assert verdict.startswith("WARNING h") and "GPU 0: p95 over 10 min: TX" in reason and "of the Gen5 x16 max link" in reason
    relaxed = tmp_path / "config.toml"
    relaxed.write_text("[rules.thresholds]\npcie_saturation_ratio = 0.99\n")
    assert run("--config", str(relaxed), "diagnose", "h", "--db", url, "--window", "10m").returncode == 0
    relaxed.write_text("[rules.thresholds]\npcie_saturation = 0.99\n")
    bad = run("--config", str(relaxed), "diagnose", "h", "--db", url)
    assert bad.returncode == 65 and "pcie_saturation: unknown threshold" in bad.stderr, bad.stderr
