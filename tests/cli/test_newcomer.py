"""What a new user meets first, through the real console script: a mistyped
VGPUMON_LOG_LEVEL refused by every command, the generators that write the repository's files
refusing another directory, and a store path that cannot be used told in one line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import H200_CAPTURE, ROOT, VGPUMON, vgpumon

pytestmark = pytest.mark.slow  # starts processes: not in the quick subset (docs/testing.md)


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return vgpumon(*args, cwd=cwd, clean=True, env={"XDG_CONFIG_HOME": str(cwd / "no-config-home"), **env})


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


@pytest.mark.parametrize("args", [["rules", "list"], ["rules", "build", "--check"], ["dashboards", "build", "--check"],
                                  ["config", "show"]], ids=" ".join)
def test_a_bad_log_level_is_refused_by_every_command(tmp_path, args):
    """The commands that read no settings used to take VGPUMON_LOG_LEVEL=LOUD silently."""
    out = _run(args, ROOT, VGPUMON_LOG_LEVEL="LOUD")
    assert out.returncode == 64, out.stdout[:300] + out.stderr
    assert out.stderr.splitlines() == ["vgpumon: invalid VGPUMON_LOG_LEVEL: Input should be 'debug', 'info', 'warning' or 'error' (got 'LOUD')"]
    assert out.stdout == ""


def test_a_log_level_flag_wins_over_a_bad_variable(tmp_path):
    out = _run(["--log-level", "error", "rules", "list", "--json"], ROOT, VGPUMON_LOG_LEVEL="LOUD")
    assert out.returncode == 0, out.stderr
    assert '"GpuLost"' in out.stdout


@pytest.mark.parametrize(("args", "says"), [
    (["rules", "build"], "where rules/ and docs/runbooks/ belong: run it there, or say where to write with --out DIR --runbooks DIR"),
    (["rules", "build", "--out", "r"], "where docs/runbooks/ belongs: run it there, or say where to write with --runbooks DIR"),
    (["rules", "build", "--check"], "--out DIR --runbooks DIR"),
    (["dashboards", "build"], "where dashboards/ belongs: run it there, or say where to write with --out DIR"),
], ids=["rules", "rules-out-given", "rules-check", "dashboards"])
def test_the_generators_refuse_a_directory_that_is_no_checkout(tmp_path, args, says):
    """`rules build` typed in a home directory used to leave rules/ and docs/runbooks/ there."""
    out = _run(args, tmp_path)
    assert out.returncode == 64, out.stdout + out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"vgpumon: {args[0]} build: {tmp_path} is not the root of a vgpumon checkout"), lines
    assert says in lines[0]
    assert _files(tmp_path) == []


def test_the_generators_write_where_they_are_told(tmp_path):
    out = _run(["rules", "build", "--out", "r", "--runbooks", "rb"], tmp_path)
    assert out.returncode == 0, out.stderr
    assert list((tmp_path / "r").glob("*.rules.yml"))
    assert (tmp_path / "rb" / "GpuLost.md").is_file()
    assert not (tmp_path / "rules").exists() and not (tmp_path / "docs").exists()


# -- a 76-second replay, as the README's step by step stores it ----------------------------------


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The H200 capture replayed as the README says (shifted to end now, not yet pruned)."""
    d = tmp_path_factory.mktemp("fresh")
    out = _run(["agent", "--replay", str(H200_CAPTURE), "--shift-to-now", "--hostname", "h", "--db", str(d / "demo.db"),
                "--listen", "off"], d)
    assert out.returncode == 0, out.stderr
    return d


def test_the_memory_column_shows_what_its_label_says(fresh):
    """The table's title says "(mean / max)" and its memory column showed the last reading: 0.00
    GiB for a GPU that held 12.70 GiB a minute before. The column is the window's highest
    reading, and says so."""
    import json

    rep = json.loads(_run(["diagnose", "h", "--db", "demo.db", "--json"], fresh).stdout)
    mem = rep["gpus"][0]["memory"]
    assert mem["used_last_bytes"] < 1e9 < mem["used_max_bytes"]  # the capture frees what it allocated
    text = _run(["diagnose", "h", "--db", "demo.db"], fresh, COLUMNS="80").stdout
    (line,) = [x for x in text.splitlines() if x.strip().startswith("memory used")]
    assert line.split() == ["memory", "used", "max", "/", "total", f"{mem['used_max_bytes'] / 2**30:.2f}", "GiB", "/",
                            f"{mem['total_bytes'] / 2**30:.2f}", "GiB"], line


def test_rules_that_cannot_judge_76_seconds_say_what_is_missing(fresh):
    """With 76 s of samples every input of GpuStuck and GpuMemoryHeldIdle is there: what they
    lack is the history their window needs, not "utilization, GPM activity, PCIe or the link
    not reported"; a counter the capture never read is "not reported", not "fewer than two
    reads"; a leak trend reads rollups that a replay has not written yet."""
    import json

    rep = json.loads(_run(["diagnose", "h", "--db", "demo.db", "--json"], fresh).stdout)
    reasons = rep["gpus"][0]["rules_unknown"]
    assert reasons["GpuStuck"] == "samples span only the last 75 s; it judges the last 5 min and needs samples over 90 % of it"
    assert reasons["GpuMemoryHeldIdle"] == "samples span only the last 75 s; it judges the last 60 min and needs samples over 90 % of it"
    assert reasons["GpuPcieReplaysHigh"] == "replay counter not reported in the last 10 min"
    assert reasons["GpuMemoryLeak"].startswith("its raw samples are not rolled up yet: it reads 1-minute rollups, 6.0 h of them")
    assert not any("not reported" in r for rule, r in reasons.items() if rule in ("GpuStuck", "GpuMemoryHeldIdle"))


# -- reports at a narrow terminal -----------------------------------------------------------------

_UNIT_FIRST = re.compile(r"^(?:[kMGT]i?B/s|[kMGT]i?B|%|ms|s|min|h|days?|W|°C|MHz)(?![\w/])")


def _split_figures(text: str) -> list[str]:
    """Each place where a line ends in a number and the next begins with a unit."""
    lines = text.splitlines()
    return [f"{a.rstrip()!r} / {b.strip()!r}" for a, b in zip(lines, lines[1:])
            if re.search(r"\d$", a.rstrip()) and _UNIT_FIRST.match(b.strip())]


@pytest.fixture(scope="module")
def incident_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import DATA

    from vgpumon.testing import incident

    d = tmp_path_factory.mktemp("incident")
    cap = incident.write(DATA, d / "incident.jsonl.gz", uplink_bound=True)
    out = _run(["agent", "--replay", str(cap), "--sysfs", str(incident.sysfs_tree(DATA, d / "sys")), "--hostname", "h8",
                "--shift-to-now", "--db", "s.db", "--listen", "off"], d)
    assert out.returncode == 0, out.stderr
    assert _run(["db", "prune", "--db", "s.db"], d).returncode == 0
    return d


@pytest.mark.parametrize("columns", [60, 80, 100])
def test_a_wrapped_report_keeps_each_figure_with_its_unit(incident_store, columns):
    """At 80 columns the ECC evidence read "(read 5" / "s ago)"; no wrap splits a number from
    its unit, in diagnose or capacity, and the space between them is a plain space again."""
    diag = _run(["diagnose", "h8", "--db", "s.db"], incident_store, COLUMNS=str(columns))
    cap = _run(["capacity", "h8", "--db", "s.db", "--add", "2"], incident_store, COLUMNS=str(columns))
    assert diag.returncode == 2 and cap.returncode == 0, diag.stderr + cap.stderr
    for out in (diag.stdout, cap.stdout):
        assert _split_figures(out) == []
        assert "\u2800" not in out
        assert max(len(line) for line in out.splitlines()[1:]) <= columns
    assert "5 s ago" in " ".join(diag.stdout.split()) and "133.6 % at p95" in " ".join(cap.stdout.split())


# -- a store path this user may not use ----------------------------------------------------------


def _as_another_user() -> list[str]:
    """A prefix that runs a command as a user the test's 0700 directory shuts out: this user
    (not root: chmod binds), or uid 65534 through setpriv (root: chmod does not bind); skips
    where neither can be had."""
    import shutil

    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv (util-linux): cannot become a user a directory shuts out")
    base = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(base + [sys.executable, "-c", "import vgpumon.cli"], capture_output=True, text=True)
    if probe.returncode != 0:  # the interpreter itself is out of its reach: no such user can run it
        pytest.skip(f"cannot run this interpreter as uid 65534: {probe.stderr.strip().splitlines()[-1:]}")
    return base


_STORE_COMMANDS = [
    ["agent", "--replay", str(H200_CAPTURE), "--listen", "off", "--db", "{db}"],
    ["db", "upgrade", "--db", "{db}"],
    ["db", "prune", "--db", "{db}"],
    ["db", "stats", "--db", "{db}"],
    ["capacity", "--db", "{db}"],
    ["diagnose", "h", "--db", "{db}"],
]


def _one_line_and_documented_code(args: list[str], out: subprocess.CompletedProcess[str], says: str) -> None:
    lines = out.stderr.strip().splitlines()
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    if args[0] == "diagnose":  # UNKNOWN, the reason on its one line, and nothing else
        assert out.returncode == 3 and out.stdout.startswith("UNKNOWN h: ") and says in out.stdout, out.stdout
        assert out.stdout.count("\n") == 1 and out.stderr == "", out.stderr
        return
    assert len(lines) == 1 and lines[0].startswith("vgpumon: ") and says in lines[0], out.stderr
    assert out.returncode == 69, out.stdout + out.stderr  # the store cannot be used (README's table)


@pytest.mark.parametrize("args", _STORE_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_store_below_a_regular_file_is_one_line(tmp_path, args):
    (tmp_path / "file").write_text("not a directory\n")
    db = tmp_path / "file" / "x.db"
    out = _run([a.replace("{db}", str(db)) for a in args], tmp_path, VGPUMON_AGENT_EXEC="0")
    _one_line_and_documented_code(args, out, f"store {db} unavailable: {tmp_path / 'file'} is a file, not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("args", _STORE_COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_a_store_in_a_directory_this_user_may_not_enter_is_one_line(tmp_path, args):
    """`--db /root/x.db` as another user was pathlib's PermissionError and a traceback (exit 1)
    from every command: now one line naming the directory, 69 (diagnose: UNKNOWN, 3)."""
    import shutil
    import tempfile

    prefix = _as_another_user()
    top = Path(tempfile.mkdtemp(prefix="vgpumon-closed-", dir="/tmp" if prefix else tmp_path))
    try:
        top.chmod(0o755)
        closed = top / "closed"
        closed.mkdir(mode=0o700)
        db = closed / "x.db"
        env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
        env.update({"HOME": str(top), "XDG_CONFIG_HOME": str(top / "no-config"), "VGPUMON_AGENT_EXEC": "0"})
        if not prefix:
            closed.chmod(0o000)
        out = subprocess.run(prefix + VGPUMON + [a.replace("{db}", str(db)) for a in args], capture_output=True, text=True,
                             cwd=top, env=env, timeout=120)
        _one_line_and_documented_code(args, out, f"store {db} unavailable: permission denied: ")
        assert f"may not enter {closed};" in out.stdout + out.stderr
    finally:
        (top / "closed").chmod(0o700)
        shutil.rmtree(top)


def test_diagnose_of_a_store_it_cannot_use_says_so_once(tmp_path):
    """The README's `diagnose … --db postgresql+psycopg://…` in a venv without the postgres extra
    printed its UNKNOWN line and the same reason again on stderr, a stray line at a terminal.
    The text report says it once, on its first line; --json keeps the line on stderr, where the
    person running a program's command sees it."""
    url = "postgresql+psycopg://u@127.0.0.1:1/fleet"
    code = ("import sys; sys.modules['psycopg'] = None\n"  # the driver is absent from this interpreter
            "from vgpumon.cli import main; main(sys.argv[1:])")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "no-config")
    text = subprocess.run([sys.executable, "-c", code, "diagnose", "gpu-host-17", "--db", url, "--max-age", "2m"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert text.returncode == 3, text.stderr
    assert text.stderr == ""
    (line,) = text.stdout.splitlines()
    assert line.startswith("UNKNOWN gpu-host-17: no driver for postgresql+psycopg: "), line
    assert line.endswith("; install the postgres extra: pip install 'vgpumon[postgres]'"), line
    as_json = subprocess.run([sys.executable, "-c", code, "diagnose", "gpu-host-17", "--db", url, "--json"],
                             capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert as_json.returncode == 3 and '"status": "unknown"' in as_json.stdout
    assert as_json.stderr.count("\n") == 1 and as_json.stderr.startswith("vgpumon: no driver for postgresql+psycopg")
