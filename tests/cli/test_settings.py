"""One settings object: flags over environment over config file over defaults, each value's
origin known, `config show` a config file that reads back as the same settings, and one helper
that masks every secret."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
from conftest import ROOT, VGPUMON

from vgpumon.base.errors import ConfigFileError, UsageError
from vgpumon.base.masking import MaskingFormatter, mask_secrets
from vgpumon.config import format_duration, load_settings, parse_duration


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No VGPUMON_* variable of the caller, and no user config file."""
    for k in list(os.environ):
        if k.startswith("VGPUMON_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "no-config-home"))
    return monkeypatch


def test_flag_over_environment_over_file_over_default(clean_env, tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.write_text('[store]\nraw_retention = "48h"\nrollup_retention = "30d"\nurl = "from-file.db"\n[agent]\ninterval = 2\n')
    clean_env.setenv("VGPUMON_ROLLUP_RETENTION", "60d")  # short name beats the file
    clean_env.setenv("VGPUMON_STORE__ROLLUP_RETENTION", "45d")  # long name beats the short one
    clean_env.setenv("VGPUMON_DB", "from-env.db")
    s = load_settings(cfg, {("store", "url"): ("--db", "from-flag.db")})
    assert s.store.url == "from-flag.db"
    assert s.store.rollup_retention == 45 * 86400
    assert s.store.raw_retention == 48 * 3600
    assert s.agent.interval == 2.0
    assert s.diagnose.window == 900.0
    assert s.origins["store.url"] == "--db"
    assert s.origins["store.rollup_retention"] == "VGPUMON_STORE__ROLLUP_RETENTION"
    assert s.origins["store.raw_retention"] == f"{cfg}: [store] raw_retention"
    assert s.origins["diagnose.window"] == "default"
    without_flag = load_settings(cfg)
    assert without_flag.store.url == "from-env.db" and without_flag.origins["store.url"] == "VGPUMON_DB"


def test_config_file_from_the_environment_and_the_user_config_dir(clean_env, tmp_path):
    home = tmp_path / "no-config-home" / "vgpumon"
    home.mkdir(parents=True)
    (home / "config.toml").write_text('[diagnose]\nwindow = "1h"\n')
    assert load_settings().diagnose.window == 3600.0
    other = tmp_path / "other.toml"
    other.write_text('[diagnose]\nwindow = "2h"\n')
    clean_env.setenv("VGPUMON_CONFIG", str(other))
    assert load_settings().diagnose.window == 7200.0


def test_machine_defaults_are_filled_and_the_spool_follows_the_store(clean_env):
    a = load_settings(None, {("store", "url"): ("--db", "a.db")})
    b = load_settings(None, {("store", "url"): ("--db", "b.db")})
    assert a.agent.hostname and a.agent.spool != b.agent.spool  # never replay one store's spool into another


def test_errors_name_the_flag_the_variable_or_the_file_key(clean_env, tmp_path):
    with pytest.raises(UsageError, match=r"invalid --window: must be at most 3650d"):
        load_settings(None, {("diagnose", "window"): ("--window", "9999d")})
    clean_env.setenv("VGPUMON_AGENT__INTERVAL", "fast")
    with pytest.raises(UsageError, match=r"invalid VGPUMON_AGENT__INTERVAL: 'fast' is not a duration"):
        load_settings()
    clean_env.delenv("VGPUMON_AGENT__INTERVAL")
    cfg = tmp_path / "c.toml"
    cfg.write_text("[vllm]\nurls = [\"not a url\"]\n")
    with pytest.raises(ConfigFileError, match=r"c\.toml: \[vllm\] urls: 'not a url' is not an http"):
        load_settings(cfg)


def test_the_rule_names_of_the_thresholds_come_from_the_caller(clean_env, tmp_path):
    """The settings cannot import the rules' catalogue: ``for`` and ``disabled`` are checked
    against the names ``load_settings`` is given, called only when the table names a rule."""
    cfg = tmp_path / "c.toml"
    cfg.write_text('[rules.thresholds]\ndisabled = ["GpuLost"]\n[rules.thresholds.for]\nGpuStuck = "1m"\n')
    calls = []

    def names():
        calls.append(1)
        return {"GpuLost", "GpuStuck"}

    assert load_settings(cfg, rule_names=names).rules.thresholds["disabled"] == ["GpuLost"] and calls
    with pytest.raises(ConfigFileError, match=r"c\.toml: \[rules\.thresholds\] disabled: unknown rule GpuLost"):
        load_settings(cfg)  # no names given: every rule name is unknown
    cfg.write_text("[rules.thresholds]\npcie_saturation_ratio = 0.9\n")
    calls.clear()
    assert load_settings(cfg, rule_names=names).rules.thresholds == {"pcie_saturation_ratio": 0.9} and not calls


@pytest.mark.parametrize("text,seconds", [("90", 90), ("90s", 90), ("1.5m", 90), ("2h", 7200), ("3d", 259200), (" 15m ", 900), (0.5, 0.5)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


def test_config_show_prints_a_config_file_that_reads_back_the_same(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path / "none"), VGPUMON_HOSTNAME="gpu-host-17", VGPUMON_VLLM__URLS="127.0.0.1:8001")
    cfg = tmp_path / "in.toml"
    cfg.write_text('log_level = "info"\n[store]\nraw_retention = "36h"\n[diagnose]\nmax_age = "2m"\n')
    shown = subprocess.run(VGPUMON + ["--config", str(cfg), "config", "show"], capture_output=True, text=True, env=env)
    assert shown.returncode == 0, shown.stderr
    assert 'hostname = "gpu-host-17"  # from VGPUMON_HOSTNAME' in shown.stdout
    assert f'raw_retention = "36h"  # from {cfg}: [store] raw_retention' in shown.stdout
    assert 'urls = ["http://127.0.0.1:8001"]' in shown.stdout
    assert "# slow_every = (unset" in shown.stdout
    out = tmp_path / "out.toml"
    out.write_text(shown.stdout)
    plain = {k: v for k, v in env.items() if k not in ("VGPUMON_HOSTNAME", "VGPUMON_VLLM__URLS")}

    def values(args: list[str], e: dict) -> dict:
        doc = json.loads(subprocess.run(VGPUMON + args + ["config", "show", "--json"], capture_output=True, text=True, env=e).stdout)
        return {s: {k: v["value"] for k, v in items.items()} if "value" not in items else items["value"] for s, items in doc["settings"].items()}

    assert values(["--config", str(out)], plain) == values(["--config", str(cfg)], env)


@pytest.mark.parametrize(
    "text,masked",
    [
        ("postgresql+psycopg://fleet:hunter2@db.example:5432/vgpumon", "postgresql+psycopg://fleet:***@db.example:5432/vgpumon"),
        ("store postgresql://u:p@ss@w0rd@db/x unavailable", "store postgresql://u:***@db/x unavailable"),
        ("postgresql://:hunter2@db/x", "postgresql://:***@db/x"),
        ("host=db user=fleet password=hunter2 dbname=x", "host=db user=fleet password=*** dbname=x"),
        ("postgresql://u@db/x?password=hunter2&sslmode=require", "postgresql://u@db/x?password=***&sslmode=require"),
        ("http://127.0.0.1:8001/metrics", "http://127.0.0.1:8001/metrics"),
        ("postgresql+psycopg://fleet@db/vgpumon", "postgresql+psycopg://fleet@db/vgpumon"),
    ],
)
def test_mask_secrets(text, masked):
    assert mask_secrets(text) == masked


def test_log_lines_and_tracebacks_are_masked():
    record = logging.LogRecord("vgpumon", logging.ERROR, __file__, 1, "cannot reach %s", ("postgresql://u:hunter2@db/x",), None)
    try:
        raise RuntimeError("connect to postgresql://u:hunter2@db/x failed")
    except RuntimeError:
        record.exc_info = sys.exc_info()
    out = MaskingFormatter("%(message)s").format(record)
    assert "hunter2" not in out
    assert out.startswith("cannot reach postgresql://u:***@db/x") and out.endswith("connect to postgresql://u:***@db/x failed")


def test_every_setting_is_documented():
    """docs/configuration.md has a table row for each setting, under its section's heading."""
    import re

    from vgpumon.config import field_descriptions

    doc = (ROOT / "docs" / "configuration.md").read_text()
    documented: set[str] = set()
    section = ""
    for line in doc.splitlines():
        heading = re.match(r"## `\[(\w+)\]`", line)
        if heading or line.startswith("## Top level"):
            section = heading.group(1) if heading else ""
        row = re.match(r"\| `(\w+)` \|", line)
        if row:
            documented.add(f"{section}.{row.group(1)}" if section else row.group(1))
    assert set(field_descriptions()) == documented


def test_the_generation_probe_deadline_defaults_to_10s_and_0_turns_it_off(clean_env, tmp_path):
    assert load_settings().vllm.probe_timeout == 10.0
    cfg = tmp_path / "c.toml"
    for off in ('"0s"', "0", '"off"'):
        cfg.write_text(f"[vllm]\nprobe_timeout = {off}\n")
        assert load_settings(cfg).vllm.probe_timeout == 0.0, off
    cfg.write_text('[vllm]\nprobe_timeout = "2.5s"\n')
    assert load_settings(cfg).vllm.probe_timeout == 2.5
    cfg.write_text('[vllm]\nprobe_timeout = "20m"\n')
    with pytest.raises(ConfigFileError, match=r"c\.toml: \[vllm\] probe_timeout: .*at most"):
        load_settings(cfg)


def test_garbage_in_the_environment_is_one_short_line_and_exit_64(clean_env, tmp_path):
    """Every VGPUMON_* variable set to junk, as a hostile or careless environment would. Before:
    a URL whose host was 100 000 letters passed the check and failed every vLLM poll (and every
    alert delivery) with a traceback, one with a control character was polled; an error line
    repeated a 100 000-character value whole."""
    huge = "x" * 100_000
    for name in ("VGPUMON_VLLM_URLS", "VGPUMON_ALERT_WEBHOOKS", "VGPUMON_OTLP_URL", "VGPUMON_LISTEN", "VGPUMON_LOG_LEVEL",
                 "VGPUMON_AGENT__INTERVAL", "VGPUMON_RAW_RETENTION", "VGPUMON_HOSTNAME"):
        urls = () if name == "VGPUMON_HOSTNAME" else (f"http://{huge}:8000", f"http://{'a' * 64}.example:8000")
        for value in (huge, *urls, "a\tb\x01c"):
            clean_env.setenv(name, value)
            with pytest.raises(UsageError) as err:
                load_settings()
            line = str(err.value)
            assert line.startswith(f"invalid {name}") and "\n" not in line and len(line) < 400, (name, line[:200])
        clean_env.delenv(name)
    out = subprocess.run([*VGPUMON, "config", "show"], capture_output=True, text=True, timeout=60, check=False,
                         env={**os.environ, "VGPUMON_VLLM_URLS": f"http://{huge}:8000"})
    assert out.returncode == 64 and out.stderr.count("\n") == 1 and "at most 253" in out.stderr, out.stderr[:300]
