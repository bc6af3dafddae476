"""Text that fits the terminal, as a user at an 80-column terminal reads it: help paragraphs
filled to the width (no line ended where a docstring broke), flags shown bare, reports wrapped at
word boundaries with every word whole, tables whose figures are never cut, `rules list` with a
header and its `for` column; and the small things a newcomer trips on (the missing-psycopg line,
runbook links from a base URL)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import DATA, VGPUMON
from typer.testing import CliRunner

from vgpumon.cli import app
from vgpumon.cli.helptext import reflow

pytestmark = pytest.mark.slow  # starts processes: not in the quick subset (docs/testing.md)

WIDTH = 80


def _command_paths() -> list[list[str]]:
    """Every command and group of the app, as the words that name it (``[]``: vgpumon itself)."""
    import typer.main

    def walk(cmd, path: list[str]) -> list[list[str]]:
        subs = getattr(cmd, "commands", {})
        return [path] + [p for name, sub in sorted(subs.items()) for p in walk(sub, [*path, name])]

    return walk(typer.main.get_command(app), [])


COMMANDS = _command_paths()


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}, **extra}


def _help(path: list[str]) -> str:
    out = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH)}, prog_name="vgpumon")
    assert out.exit_code == 0, out.output
    return out.output


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "vgpumon")
def test_help_fills_the_terminal_and_shows_flags_bare(path):
    """Every help line fits 80 columns, a flag has no `<bool>` beside it, and each prose
    paragraph is filled: a line ends only where its next word would not fit (the docstrings'
    own line breaks used to end lines at 60 to 70 columns and leave a word alone on the next)."""
    text = _help(path)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= WIDTH, text
    assert "<bool>" not in text, text
    assert "--help" in text
    # the prose above the panels: a line ends where its next word would not fit (78 columns
    # inside the help's margins); example lines stand alone
    prose = [line.strip() for line in text.split("╭")[0].splitlines()]
    ragged = [(line, nxt) for line, nxt in zip(prose, prose[1:])
              if line and nxt and not line.endswith(":") and not nxt.startswith("vgpumon ") and not line.startswith("vgpumon ")
              and not line.startswith("Usage:") and len(line) + 1 + len(nxt.split()[0]) <= WIDTH - 2]
    assert not ragged, ragged


def test_reflow_keeps_example_blocks_and_joins_prose():
    doc = """First line
    goes on.

    A paragraph that the source
    broke in two.

    Examples:\n
      vgpumon a\n
      vgpumon b --x
    """
    assert reflow(doc) == "First line goes on.\n\nA paragraph that the source broke in two.\n\nExamples:\n  vgpumon a\n  vgpumon b --x"
    # the same block written without blank lines, right under its heading
    assert reflow("Intro.\n\nExamples:\n  vgpumon a\n  vgpumon b") == "Intro.\n\nExamples:\n  vgpumon a\n  vgpumon b"


def test_the_examples_of_every_command_fit_80_columns():
    """An example that wraps at 80 columns would read as two commands; each stands on its own
    line under "Examples:"."""
    for path in COMMANDS:
        text = _help(path)
        if "Examples:" in text:
            assert any(line.strip() == "Examples:" for line in text.splitlines()), (path, text)
        for line in text.splitlines():
            if line.startswith("   vgpumon "):
                following = text.splitlines()[text.splitlines().index(line) + 1]
                assert not following.startswith(" ") or following.startswith("   vgpumon ") or not following.strip(), (path, line, following)


@pytest.fixture(scope="module")
def incident_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8-GPU incident (``vgpumon.testing.incident``, from the recorded H200 captures) replayed
    with its two shared switches, then rolled up."""
    from vgpumon.testing import incident

    d = tmp_path_factory.mktemp("incident")
    capture, sysfs = incident.write(DATA, d / "incident.jsonl.gz"), incident.sysfs_tree(DATA, d / "sysfs")
    db = d / "s.db"
    for args in (["agent", "--replay", str(capture), "--sysfs", str(sysfs), "--hostname", "sick", "--db", str(db), "--listen", "off",
                  "--spool", str(d / "spool")],
                 ["db", "prune", "--db", str(db), "--raw-retention", "3650d", "--rollup-retention", "3650d"]):
        out = subprocess.run(VGPUMON + args, capture_output=True, text=True, env=_env(), timeout=180)
        assert out.returncode == 0, out.stderr
    return db


def _words(text: str) -> set[str]:
    return set(text.split())


def test_diagnose_piped_at_80_columns_wraps_at_words_and_keeps_every_word_whole(incident_store):
    """`COLUMNS=80 vgpumon diagnose … | less`: below the one-line verdict every line fits, and
    every word of every finding's evidence and next step is there whole (before, the reasons and
    findings were single lines the terminal cut anywhere: "(r" / "ead 5 s ago)")."""
    rep = json.loads(subprocess.run(VGPUMON + ["diagnose", "sick", "--db", str(incident_store), "--json"], capture_output=True,
                                    text=True, env=_env(), timeout=60).stdout)
    out = subprocess.run(VGPUMON + ["diagnose", "sick", "--db", str(incident_store)], capture_output=True, text=True,
                         env=_env(COLUMNS=str(WIDTH)), timeout=60)
    assert out.returncode == 2, out.stderr  # CRITICAL
    lines = out.stdout.splitlines()
    assert lines[0].startswith("CRITICAL sick — 3 critical")
    too_wide = [line for line in lines[1:] if len(line) > WIDTH]
    assert not too_wide, too_wide
    shown = _words(out.stdout)
    for f in rep["findings"]:
        # a pending or informational finding is one line: its message
        for key in ("message", "next_step") if f["severity"] in ("critical", "warning", "unknown") else ("message",):
            missing = [w for w in (f.get(key) or "").split() if w not in shown]
            assert not missing, (f["alert"] if "alert" in f else f["message"], key, missing)
    # a wrapped line hangs under its text, so it never reads as a new entry
    at = next(i for i, line in enumerate(lines) if line.startswith("  evidence  2 volatile uncorrectable"))
    assert lines[at + 1].startswith(" " * len("  evidence  ")) and lines[at + 1].strip()


def test_capacity_at_80_columns_cuts_no_figure(incident_store):
    """The review's tables are wider than 80 columns; they become blocks of lines rather than
    columns squeezed to "(negotiat…", "0000:…", "headr…"."""
    wide = subprocess.run(VGPUMON + ["capacity", "sick", "--db", str(incident_store)], capture_output=True, text=True,
                          env=_env(COLUMNS="250"), timeout=60)
    narrow = subprocess.run(VGPUMON + ["capacity", "sick", "--db", str(incident_store)], capture_output=True, text=True,
                            env=_env(COLUMNS=str(WIDTH)), timeout=60)
    assert wide.returncode == narrow.returncode == 0, narrow.stderr
    assert "…" not in narrow.stdout, narrow.stdout
    assert max(len(line) for line in narrow.stdout.splitlines()) <= WIDTH
    figures = set(re.findall(r"\d+\.\d+ / \d+\.\d+ / \d+\.\d+ / \d+\.\d+ GB/s|\d+\.\d %|0000:[0-9a-f]{2}:[0-9a-f]{2}\.\d", wide.stdout))
    assert len(figures) >= 5, wide.stdout
    for figure in figures:
        assert figure in narrow.stdout, figure
    assert re.search(r"IMPOSSIBLE, p95 at \d+ % of the Gen5 x16 link", " ".join(narrow.stdout.split())), narrow.stdout


def test_rules_list_has_a_header_and_the_for_column():
    out = subprocess.run(VGPUMON + ["rules", "list"], capture_output=True, text=True, env=_env(COLUMNS=str(WIDTH)), timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["name", "severity", "subject", "for", "summary"]
    assert max(len(line) for line in lines) <= WIDTH
    rows = {line.split()[0]: line.split() for line in lines[2:] if line[:1].isalpha()}
    assert len(rows) == len(json.loads(subprocess.run(VGPUMON + ["rules", "list", "--json"], capture_output=True, text=True,
                                                       env=_env(), timeout=60).stdout))
    assert rows["GpuPcieSaturated"][1:4] == ["warning", "gpu", "5m"]
    assert rows["GpuMemoryLeak"][3] == "1h"


def test_rules_build_writes_runbook_urls_from_the_base_url_given(tmp_path):
    base = "https://git.example.com/vgpumon/blob/main/docs/runbooks"
    out = subprocess.run(VGPUMON + ["rules", "build", "--out", str(tmp_path / "rules"), "--runbooks", str(tmp_path / "rb"),
                                    "--runbook-base-url", base], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 0, out.stderr
    urls = [r["annotations"]["runbook_url"] for f in (tmp_path / "rules").glob("*.rules.yml")
            for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"]]
    assert urls and all(u.startswith(base + "/") and u.endswith(".md") for u in urls), urls[:3]
    assert f"{base}/GpuLost.md" in urls


@pytest.mark.parametrize("base", ["ftp://host/runbooks/", "https://", "docs/run books/"])
def test_a_runbook_base_url_that_is_no_url_is_one_line_and_exit_64(tmp_path, base):
    out = subprocess.run(VGPUMON + ["rules", "build", "--out", str(tmp_path / "rules"), "--runbooks", str(tmp_path / "rb"),
                                    "--runbook-base-url", base], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 64
    assert out.stderr.count("\n") == 1 and "--runbook-base-url" in out.stderr
    assert not (tmp_path / "rules").exists()


def test_a_postgres_store_without_psycopg_names_the_extra_to_install():
    """The Postgres driver is an extra; a store URL that needs it, without it, says which."""
    code = ("import sys; sys.modules['psycopg'] = None\n"  # the driver is absent from this interpreter
            "from vgpumon.cli import main; main(['db', 'stats', '--db', 'postgresql+psycopg://u@127.0.0.1:1/db'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 69
    assert out.stderr.count("\n") == 1, out.stderr
    assert "pip install 'vgpumon[postgres]'" in out.stderr


def test_escape_sequences_in_stored_text_never_reach_the_terminal(tmp_path):
    """Text others wrote reaches the report: a GPU name, a process's command line (any local user
    names its own processes). An escape sequence in it would retitle the terminal, clear it or
    hide a line; the text report shows each control character as ``\\xNN`` instead."""
    import sqlite3

    from conftest import replay_into, vgpumon

    db = tmp_path / "s.db"
    replay_into(f"sqlite:///{db}", hostname="h")
    hostile = "H200\x1b]0;pwned\x07\x1b[2J\u202e"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE gpus SET name = ?", (hostile,))
    out = vgpumon("diagnose", "h", "--db", str(db))
    assert out.returncode in (0, 1, 2), out.stderr
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout and "\u202e" not in out.stdout
    assert "H200\\x1b]0;pwned\\x07\\x1b[2J\\u202e" in out.stdout
    assert hostile in json.loads(vgpumon("diagnose", "h", "--db", str(db), "--json").stdout)["gpus"][0]["name"]
