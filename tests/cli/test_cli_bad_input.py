"""Bad input through the real console script, one row per case a new user tried: the exit code
from the README's table, one line on stderr that names the problem, no traceback, no secret,
and nothing created or changed where the command only reads (or fails before it writes)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import H200_CAPTURE, VGPUMON

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)

SECRET = "s3cret-pw"
LONG_HOST = "h" * 300


class Case(NamedTuple):
    id: str
    args: list[str]
    code: int
    says: str  # regex the one stderr line must match
    env: dict[str, str] = {}
    #: the command may write before it meets the bad input (a replay stores the ticks it could
    #: read before a truncated capture ends): only the files it names may change
    writes: str | None = None


def _capture_lines() -> list[str]:
    with gzip.open(H200_CAPTURE, "rt") as f:
        return f.read().splitlines()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a real store (one replay), and the broken inputs the cases name."""
    d = tmp_path_factory.mktemp("bad-input")
    out = subprocess.run(VGPUMON + ["agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", str(d / "store.db"), "--hostname", "h"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for leftover in d.glob("store.db.*"):  # the migration lock file: not part of what readers see
        leftover.unlink()
    lines = _capture_lines()
    tick = json.loads(lines[2])
    (d / "empty.jsonl").write_text("")
    (d / "header-only.jsonl").write_text(lines[0] + "\n")
    (d / "no-header.jsonl").write_text("\n".join(lines[1:4]) + "\n")
    (d / "not-json.jsonl").write_text("this is not a capture\n")
    (d / "ts-string.jsonl").write_text("\n".join([lines[0], lines[1], json.dumps({**tick, "ts": "soon"})]) + "\n")
    (d / "calls-dict.jsonl").write_text("\n".join([lines[0], lines[1], json.dumps({**tick, "calls": {"a": 1}})]) + "\n")
    (d / "tick-float.jsonl").write_text("\n".join([lines[0], lines[1], json.dumps({**tick, "tick": 0.5})]) + "\n")
    (d / "slow-every-string.jsonl").write_text("\n".join([json.dumps({**json.loads(lines[0]), "slow_every": "ten"}), *lines[1:4]]) + "\n")
    (d / "random.jsonl.gz").write_bytes(os.urandom(2048))
    (d / "truncated.jsonl.gz").write_bytes(H200_CAPTURE.read_bytes()[:4000])
    # a line longer than any capture's (65 Mi spaces, no newline): an error, not a MemoryError
    (d / "huge-line.jsonl.gz").write_bytes(gzip.compress((lines[0] + "\n" + '{"tick": 0, ' + " " * (65 << 20)).encode(), 1))
    (d / "a-directory").mkdir()
    os.mkfifo(d / "a-fifo")  # nobody writes it: reading it would hang
    (d / "zero.db").write_bytes(b"")
    (d / "random.db").write_bytes(os.urandom(4096))
    import sqlite3

    foreign = sqlite3.connect(d / "foreign.db")
    foreign.executescript("CREATE TABLE customers (id INTEGER); CREATE TABLE orders (id INTEGER);")
    foreign.close()
    (d / "not-toml.toml").write_text("[store\nurl = \n")
    (d / "bad-window.toml").write_text('[diagnose]\nwindow = "0"\n')
    (d / "typo.toml").write_text('[stor]\nurl = "x.db"\n')
    (d / "bad-type.toml").write_text("[agent]\nhost_every = \"often\"\n")
    (d / "percent-ratio.toml").write_text("[rules.thresholds]\npcie_saturation_ratio = 80\n")
    (d / "negative-for.toml").write_text('[rules.thresholds.for]\nGpuLost = "-1m"\n')
    (d / "clear-above.toml").write_text("[rules.thresholds]\npcie_saturation_ratio = 0.7\npcie_clear_ratio = 0.75\n")
    (d / "polls-inf.toml").write_text("[rules.thresholds]\nvllm_engine_lost_polls = inf\n")
    (d / "for-list.toml").write_text('[rules.thresholds]\nfor = ["GpuLost"]\n')
    return d


DIAG = ["diagnose", "h", "--db", "{d}/store.db"]
AGENT = ["agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", "{d}/new.db"]
PRUNE = ["db", "prune", "--db", "{d}/store.db"]


def replay_of(name: str) -> list[str]:
    """The agent replaying ``name`` from the work directory into a store not yet created."""
    return ["agent", "--listen", "off", "--replay", "{d}/" + name, "--db", "{d}/new.db"]


CASES = [
    # durations and intervals: 0, negative, inf, nan, empty, too large, not a duration
    Case("window-zero", [*DIAG, "--window", "0"], 64, r"--window: must be more than 0"),
    Case("window-negative", [*DIAG, "--window", "-5m"], 64, r"--window: '-5m' is not a duration"),
    Case("window-inf", [*DIAG, "--window", "inf"], 64, r"--window: 'inf' is not a duration"),
    Case("window-nan", [*DIAG, "--window", "nan"], 64, r"--window: 'nan' is not a duration"),
    Case("window-empty", [*DIAG, "--window", ""], 64, r"--window: empty"),
    Case("window-huge", [*DIAG, "--window", "1000000d"], 64, r"--window: must be at most 3650d"),
    Case("window-words", [*DIAG, "--window", "soon"], 64, r"--window: 'soon' is not a duration"),
    Case("max-age-zero", [*DIAG, "--max-age", "0s"], 64, r"--max-age: must be more than 0"),
    Case("max-age-nan", [*DIAG, "--max-age", "nan"], 64, r"--max-age: 'nan' is not a duration"),
    Case("timeout-zero", [*DIAG, "--timeout", "0"], 64, r"--timeout: must be more than 0"),
    Case("prune-retention-huge", [*PRUNE, "--raw-retention", "99999999999999d"], 64, r"--raw-retention: must be at most 3650d"),
    Case("prune-rollup-nan", [*PRUNE, "--rollup-retention", "nan"], 64, r"--rollup-retention: 'nan' is not a duration"),
    Case("prune-rollup-shorter", [*PRUNE, "--raw-retention", "2d", "--rollup-retention", "1d"], 64, r"--rollup-retention: rollups \(1d\) must be kept"),
    Case("prune-under-an-hour", [*PRUNE, "--raw-retention", "30m"], 64, r"--raw-retention 30m is under 1h.*--yes"),
    Case("agent-duration-words", [*AGENT, "--duration", "abc"], 64, r"'--duration': 'abc' is not a duration"),
    Case("agent-duration-zero", [*AGENT, "--duration", "0"], 64, r"'--duration': must be more than 0"),
    Case("agent-interval-zero", [*AGENT, "--interval", "0"], 64, r"--interval: must be more than 0"),
    # an output file that cannot be written is an I/O error (74), not a usage one
    Case("capacity-html-missing-dir", ["capacity", "--db", "{d}/store.db", "--html", "{d}/missing/review.html"], 74,
         r"--html: cannot write .*missing/review\.html: No such file or directory"),
    # an option of vgpumon itself given after the command: say where it goes
    Case("root-option-after-command", [*AGENT, "--log-level", "info"], 64,
         r"--log-level is an option of vgpumon itself: give it before the command \(vgpumon --log-level … agent …\)"),
    Case("root-option-after-subcommand", ["db", "stats", "--config", "x.toml"], 64,
         r"--config is an option of vgpumon itself: give it before the command \(vgpumon --config … db stats …\)"),
    # alerts sent to a typo would never arrive, and nobody would be told
    Case("alert-webhook-scheme", [*AGENT, "--alert-webhook", "ftp://x"], 64,
         r"invalid --alert-webhook: 'ftp://x' is not an http\(s\) URL of a host"),
    Case("alertmanager-no-scheme", [*AGENT, "--alertmanager", "notaurl"], 64,
         r"invalid --alertmanager: 'notaurl' is not an http\(s\) URL of a host"),
    Case("alertmanagers-env", AGENT, 64, r"invalid VGPUMON_ALERTMANAGERS: 'x' is not an http\(s\) URL",
         {"VGPUMON_ALERTMANAGERS": "http://a:9093 x"}),
    Case("agent-interval-nan", [*AGENT, "--interval", "nan"], 64, r"--interval: 'nan' is not a duration"),
    Case("agent-interval-inf", [*AGENT, "--interval", "inf"], 64, r"--interval: 'inf' is not a duration"),
    Case("agent-interval-huge", [*AGENT, "--interval", "2d"], 64, r"--interval: must be at most 1d"),
    Case("agent-vllm-interval-zero", [*AGENT, "--vllm-interval", "0"], 64, r"--vllm-interval: must be more than 0"),
    Case("agent-retention-negative", [*AGENT, "--raw-retention", "-1h"], 64, r"--raw-retention: '-1h' is not a duration"),
    Case("agent-recorded-pace-live", ["agent", "--pace", "recorded", "--db", "{d}/new.db"], 64, r"--pace recorded paces a replay: give --replay"),
    # other values
    Case("agent-vllm-url-words", [*AGENT, "--vllm-url", "not a url"], 64, r"--vllm-url: 'not a url' is not an http\(s\) URL"),
    Case("agent-vllm-url-port", [*AGENT, "--vllm-url", "http://gpu-host:port"], 64, r"--vllm-url: 'http://gpu-host:port' is not a URL"),
    Case("agent-vllm-url-scheme", [*AGENT, "--vllm-url", "ftp://gpu-host:8000"], 64, r"--vllm-url: 'ftp://gpu-host:8000' is not an http\(s\) URL"),
    Case("agent-hostname-long", [*AGENT, "--hostname", LONG_HOST], 64, r"--hostname: host name of 300 characters; at most 255"),
    Case("agent-hostname-empty", [*AGENT, "--hostname", " "], 64, r"--hostname: empty host name"),
    Case("agent-hostname-newline", [*AGENT, "--hostname", "a\nb"], 64, r"--hostname: host name with control characters"),
    Case("agent-host-every-zero", [*AGENT, "--host-every", "0"], 64, r"--host-every: .*greater than or equal to 1"),
    Case("agent-slow-every-negative", [*AGENT, "--slow-every", "-1"], 64, r"--slow-every: .*greater than or equal to 1"),
    Case("agent-spool-max-zero", [*AGENT, "--spool-max-mb", "0"], 64, r"--spool-max-mb: .*greater than or equal to 1"),
    Case("agent-host-every-words", [*AGENT, "--host-every", "often"], 64, r"'--host-every': .*valid integer"),
    Case("record-duration-words", ["record", "{d}/rec.jsonl", "--duration", "abc"], 64, r"'--duration': 'abc' is not a duration"),
    Case("db-empty", ["diagnose", "h", "--db", ""], 64, r"--db: empty store URL"),
    Case("db-other-engine", ["diagnose", "h", "--db", f"mysql://u:{SECRET}@db/x"], 64, r"--db: vgpumon stores into SQLite or Postgres, not 'mysql'"),
    Case("db-sqlite-no-file", ["db", "stats", "--db", "sqlite://"], 64, r"--db: a SQLite store needs a file"),
    Case("db-sqlite-memory", ["agent", "--replay", str(H200_CAPTURE), "--db", "sqlite:///:memory:"], 64, r"--db: an in-memory SQLite store keeps nothing"),
    # a device or a directory is not a store: refused before SQLite writes a journal beside it
    Case("agent-store-dev-null", ["agent", "--replay", str(H200_CAPTURE), "--listen", "off", "--db", "/dev/null"], 69,
         r"store /dev/null is not a regular file"),
    Case("upgrade-store-directory", ["db", "upgrade", "--db", "{d}/a-directory"], 69, r"a-directory is not a regular file"),
    # a directory where no file can be made (a pseudo file system): the migration lock says so
    Case("agent-store-on-proc", ["agent", "--replay", str(H200_CAPTURE), "--listen", "off", "--db", "/proc/vgpumon-test.db"], 69,
         r"cannot create /proc/vgpumon-test\.db\.migrate\.lock"),
    Case("agent-store-dir-impossible", ["agent", "--replay", str(H200_CAPTURE), "--listen", "off", "--db", "{d}/zero.db/sub/x.db"], 69,
         r"zero\.db/sub/x\.db unavailable: .*zero\.db is a file, not a directory"),
    Case("capacity-unknown-host", ["capacity", "nosuch", "--db", "{d}/store.db"], 64, r"nosuch is not in the store"),
    Case("diagnose-no-host", ["diagnose"], 64, r"Missing argument 'host'"),
    Case("config-dev-zero", ["--config", "/dev/zero", "config", "show"], 65, r"/dev/zero is a character device, not a regular file"),
    Case("config-fifo", ["--config", "{d}/a-fifo", "config", "show"], 65, r"a-fifo is a FIFO, not a regular file"),
    Case("metrics-file-dev-zero", [*AGENT, "--metrics-file", "/dev/zero"], 65, r"--metrics-file: .*/dev/zero is a character device"),
    Case("metrics-file-fifo", [*AGENT, "--metrics-file", "{d}/a-fifo"], 65, r"--metrics-file: .*a-fifo is a FIFO"),
    Case("diagnose-host-control-character", ["diagnose", "gpu\x01host"], 64, r"host 'gpu\\x01host': host name with control characters"),
    Case("diagnose-host-300-characters", ["diagnose", "h" * 300], 64, r"host 'h{60}'…: host name of 300 characters; at most 255"),
    Case("unknown-option", [*DIAG, "--bogus"], 64, r"No such option: --bogus"),
    Case("unknown-command", ["bogus"], 64, r"No such command 'bogus'"),
    Case("log-level-loud", ["--log-level", "loud", *DIAG], 64, r"'--log-level': 'loud' is not one of 'debug'"),
    # environment variables name themselves
    Case("env-window", DIAG, 64, r"VGPUMON_DIAGNOSE__WINDOW: must be more than 0", {"VGPUMON_DIAGNOSE__WINDOW": "0"}),
    Case("env-retention", DIAG, 64, r"VGPUMON_RAW_RETENTION: 'forever' is not a duration", {"VGPUMON_RAW_RETENTION": "forever"}),
    Case("env-unknown-key", DIAG, 64, r"VGPUMON_STORE__URLL: unknown setting", {"VGPUMON_STORE__URLL": "x"}),
    Case("env-hostname-long", ["diagnose", "localhost", "--db", "{d}/store.db"], 64, r"VGPUMON_HOSTNAME: host name of 300", {"VGPUMON_HOSTNAME": LONG_HOST}),
    Case("env-section-not-json", DIAG, 64, r"VGPUMON_STORE: a whole section must be a JSON object", {"VGPUMON_STORE": "{"}),
    Case("env-log-level", DIAG, 64, r"VGPUMON_LOG_LEVEL: .*'debug', 'info', 'warning' or 'error'", {"VGPUMON_LOG_LEVEL": "loud"}),
    # config files are input files: 65, naming the file and the key
    Case("config-missing", ["--config", "{d}/missing.toml", *DIAG], 65, r"cannot read config file .*missing\.toml"),
    Case("config-env-missing", DIAG, 65, r"cannot read config file .*missing\.toml", {"VGPUMON_CONFIG": "{d}/missing.toml"}),
    Case("config-not-toml", ["--config", "{d}/not-toml.toml", *DIAG], 65, r"not-toml\.toml is not TOML"),
    Case("config-bad-value", ["--config", "{d}/bad-window.toml", *DIAG], 65, r"bad-window\.toml: \[diagnose\] window: must be more than 0"),
    Case("config-unknown-section", ["--config", "{d}/typo.toml", *DIAG], 65, r"typo\.toml: stor: unknown setting"),
    Case("config-bad-type", ["--config", "{d}/bad-type.toml", *DIAG], 65, r"bad-type\.toml: \[agent\] host_every: .*integer"),
    # a threshold out of its kind's range would silence its rule (a ratio written as a percentage)
    Case("threshold-percent", ["--config", "{d}/percent-ratio.toml", *DIAG], 65,
         r"percent-ratio\.toml: \[rules\.thresholds\] pcie_saturation_ratio: 80 is outside 0 ≤ x ≤ 1"),
    Case("threshold-for-negative", ["--config", "{d}/negative-for.toml", *DIAG], 65,
         r"negative-for\.toml: \[rules\.thresholds\] for\.GpuLost: '-1m' is not a duration"),
    Case("threshold-inf", ["--config", "{d}/polls-inf.toml", *DIAG], 65,
         r"polls-inf\.toml: \[rules\.thresholds\] vllm_engine_lost_polls: inf is not a finite number"),
    Case("threshold-for-list", ["--config", "{d}/for-list.toml", *DIAG], 65,
         r"for-list\.toml: \[rules\.thresholds\] for: not a table of rule = duration"),
    Case("threshold-clear-above", ["--config", "{d}/clear-above.toml", *DIAG], 65,
         r"clear-above\.toml: \[rules\.thresholds\] pcie_clear_ratio: 0\.75 is above pcie_saturation_ratio \(0\.7\)"),
    # captures: 65, one line
    Case("capture-missing", replay_of("missing.jsonl"), 65, r"cannot read capture .*missing\.jsonl: No such file"),
    Case("capture-directory", replay_of("a-directory"), 65, r"cannot read capture .*a-directory: Is a directory"),
    Case("capture-empty", replay_of("empty.jsonl"), 65, r"empty\.jsonl is empty, not a vgpumon capture"),
    Case("capture-header-only", replay_of("header-only.jsonl"), 65, r"header-only\.jsonl holds no ticks"),
    Case("capture-no-header", replay_of("no-header.jsonl"), 65, r"no-header\.jsonl is not a vgpumon capture \(no header\)"),
    Case("capture-not-json", replay_of("not-json.jsonl"), 65, r"not-json\.jsonl is not a vgpumon capture \(line 1 is not JSON\)"),
    Case("capture-ts-string", replay_of("ts-string.jsonl"), 65, r"ts-string\.jsonl:3: malformed capture line \(\"ts\" is not a number"),
    Case("capture-calls-dict", replay_of("calls-dict.jsonl"), 65, r"calls-dict\.jsonl:3: malformed capture line \(\"calls\" is not a list\)"),
    Case("capture-huge-line", replay_of("huge-line.jsonl.gz"), 65, r"huge-line\.jsonl\.gz:2: a capture line over 64 Mi characters"),
    Case("capture-tick-float", replay_of("tick-float.jsonl"), 65, r"tick-float\.jsonl:3: malformed capture line \(\"tick\" is not an integer\)"),
    Case("capture-header-type", replay_of("slow-every-string.jsonl"), 65, r"slow-every-string\.jsonl:1: header \"slow_every\" is not a positive integer"),
    Case("capture-random-gzip", replay_of("random.jsonl.gz"), 65, r"cannot read capture .*random\.jsonl\.gz: Not a gzipped file"),
    Case(
        "capture-truncated-gzip", ["agent", "--listen", "off", "--replay", "{d}/truncated.jsonl.gz", "--db", "{d}/partial.db"], 65,
        r"cannot read capture .*truncated\.jsonl\.gz after line \d+: Compressed file ended.*\(\d+ ticks before it were stored: \d+ rows written", writes="partial.db",
    ),
    # stores a reader cannot use: diagnose answers UNKNOWN (3), the other commands 69
    Case("stats-missing-store", ["db", "stats", "--db", "{d}/missing.db"], 69, r"no store at .*missing\.db: it does not exist"),
    Case("stats-directory", ["db", "stats", "--db", "{d}/a-directory"], 69, r"no store at .*a-directory: it is not a file"),
    Case("stats-zero-byte-file", ["db", "stats", "--db", "{d}/zero.db"], 69, r"zero\.db holds no vgpumon data"),
    Case("stats-random-file", ["db", "stats", "--db", "{d}/random.db"], 69, r"random\.db unavailable: file is not a database"),
    # (with --json, whose reader is a program: the text report says it on its first line only)
    Case("diagnose-zero-byte-file", ["diagnose", "h", "--db", "{d}/zero.db", "--json"], 3, r"zero\.db holds no vgpumon data"),
    Case("diagnose-foreign-file", ["diagnose", "h", "--db", "{d}/foreign.db", "--json"], 3, r"foreign\.db holds no vgpumon data"),
    Case("prune-missing-store", [*PRUNE[:2], "--db", "{d}/missing.db"], 69, r"no store at .*missing\.db"),
    # the agent refuses another application's SQLite file instead of adding its tables
    Case("agent-foreign-file", ["agent", "--listen", "off", "--replay", str(H200_CAPTURE), "--db", "{d}/foreign.db"], 69, r"foreign\.db holds tables of something else \(customers, orders\)"),
    Case("upgrade-foreign-file", ["db", "upgrade", "--db", "{d}/foreign.db"], 69, r"foreign\.db holds tables of something else"),
]


def _snapshot(d: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file under ``d`` with its size, mtime and (small files) contents."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(d))] = (st.st_size, st.st_mtime_ns, p.read_bytes() if st.st_size < 1 << 20 else b"")
    return out


def test_at_least_forty_cases():
    assert len(CASES) >= 40 and len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_with_the_documented_exit_code(case: Case, work: Path):
    args = [a.replace("{d}", str(work)) for a in case.args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    env.update({k: v.replace("{d}", str(work)) for k, v in case.env.items()})
    env["XDG_CONFIG_HOME"] = str(work / "no-config-home")  # no user config file leaks in
    before = _snapshot(work)
    out = subprocess.run(VGPUMON + args, capture_output=True, text=True, env=env, timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == case.code, out.stderr
    assert "Traceback" not in out.stderr
    assert len(lines) == 1, f"want one line on stderr, got: {out.stderr!r}"
    assert re.search(case.says, lines[0]), lines[0]
    assert lines[0].startswith("vgpumon: ")
    assert SECRET not in out.stderr + out.stdout
    after = _snapshot(work)
    if case.writes:  # what it wrote is the store it named, holding the ticks read before the fault
        written = {k for k in after if k.startswith(case.writes)}
        assert written and {k: v for k, v in after.items() if k not in written} == before
        for name in written:
            (work / name).unlink()
        return
    assert after == before, "a command that failed on its input created or changed files"
    if "/dev/null" in args:  # as root, SQLite used to leave its journal and our lock in /dev
        assert not Path("/dev/null-journal").exists() and not Path("/dev/null.migrate.lock").exists()
