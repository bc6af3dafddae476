"""What a new user meets first, through the real console script: a mistyped
VGPUMON_LOG_LEVEL refused by every command, the generators that write the repository's files
refusing another directory, and a store path that cannot be used told in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import H200_CAPTURE, ROOT

pytestmark = pytest.mark.slow  # starts processes: not in the quick subset (docs/testing.md)

VGPUMON = [sys.executable, "-m", "vgpumon"]


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    base["XDG_CONFIG_HOME"] = str(cwd / "no-config-home")
    return subprocess.run(VGPUMON + args, capture_output=True, text=True, cwd=cwd, env={**base, **env}, timeout=120)


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
