"""Where the output goes wrong, not the input: a monitoring check that reads one line and closes
the pipe keeps the verdict's exit code; a full disk is one line and exit 74, not a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import H200_CAPTURE, VGPUMON

pytestmark = pytest.mark.slow  # starts processes or servers: not in the quick subset (docs/testing.md)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("output")
    out = subprocess.run(VGPUMON + ["agent", "--replay", str(H200_CAPTURE), "--db", str(d / "s.db"), "--hostname", "h",
                                    "--listen", "off", "--spool", str(d / "spool")],
                         capture_output=True, text=True, timeout=120, env=_env())
    assert out.returncode == 0, out.stderr
    return d / "s.db"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}


def _reader_gone(args: list[str]) -> tuple[int, str]:
    """Run with a stdout pipe whose reader has already gone (closed before the command starts
    writing: the interpreter alone takes longer to start), as after `| head -1`."""
    p = subprocess.Popen(VGPUMON + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    p.stdout.close()  # type: ignore[union-attr]
    err = p.stderr.read()  # type: ignore[union-attr]
    return p.wait(timeout=60), err


@pytest.mark.parametrize(("extra", "code"), [([], 0), (["--max-age", "2m"], 3)], ids=["ok", "stale"])
def test_diagnose_piped_to_head_keeps_its_verdict(store, extra, code):
    rc, err = _reader_gone(["diagnose", "h", "--db", str(store), *extra])
    assert rc == code, err
    assert "Traceback" not in err


def test_a_listing_piped_to_head_is_not_a_warning():
    rc, err = _reader_gone(["rules", "list"])
    assert rc == 0, err


@pytest.mark.parametrize(("args", "code"), [(["--help"], 0), (["agent", "--help"], 0), (["db", "--help"], 0), ([], 64), (["db"], 64)],
                         ids=["help", "agent-help", "db-help", "bare", "bare-group"])
def test_help_piped_to_head_keeps_its_code(args, code):
    """The help is written by rich, which exits 1 when the reader has gone; `vgpumon --help |
    head -1` is not a failure (0), and a bare group's help keeps its 64."""
    rc, err = _reader_gone(args)
    assert rc == code, err
    assert "Traceback" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_one_line_and_exit_74(store):
    with open("/dev/full", "w") as full:
        out = subprocess.run(VGPUMON + ["diagnose", "h", "--db", str(store)], stdout=full, stderr=subprocess.PIPE, text=True,
                             env=_env(), timeout=60)
    assert out.returncode == 74
    lines = out.stderr.strip().splitlines()
    assert lines == ["vgpumon: cannot write the output: No space left on device"]


def test_findings_that_are_all_pending_are_not_introduced_with_and():
    """Only pending or informational findings: their line opens the section, not "and 1 …"
    under a heading with nothing before it."""
    import io

    from vgpumon.diagnose import render

    buf = io.StringIO()
    out = render.console(buf, width=120, color=False)
    minor = {"severity": "info", "message": "pending: GPU 0 PCIe at 85 % for 2 min", "gpu": {"index": 0}}
    render._findings({"findings": [minor]}, out)
    lines = [line.strip() for line in buf.getvalue().splitlines() if line.strip()]
    assert lines[0] == "Findings, most severe first"
    assert lines[1] == "1 pending or informational:"
    major = {**minor, "severity": "warning", "message": "PCIe saturated", "alert": "GpuPcieSaturated", "gpu": None}
    buf.truncate(0), buf.seek(0)
    render._findings({"findings": [major, minor]}, out)
    assert "and 1 pending or informational:" in buf.getvalue()


def test_an_80_column_terminal_shows_every_figure_whole(store):
    """A table wider than the terminal used to be squeezed by rich until the figures themselves
    were cut ("59.…", "204…"); below its width each GPU's figures are a block of lines instead."""
    import json
    import re

    from vgpumon.diagnose.render import render_diagnose

    out = subprocess.run(VGPUMON + ["diagnose", "h", "--db", str(store), "--json"], capture_output=True, text=True,
                         env=_env(), timeout=60)
    report = json.loads(out.stdout)
    wide, narrow = render_diagnose(report), render_diagnose(report, width=80)
    figures = re.findall(r"\d+\.\d+ GB/s \(\d+\.\d %\)|\d+\.\d W / \d+\.\d W|\d+\.\d+ GiB / \d+\.\d+ GiB", wide)
    assert len(figures) >= 4, wide
    for figure in figures:
        assert figure in narrow, figure
    tables = narrow[narrow.index("GPUs, "):narrow.index("vLLM servers")]
    assert "…" not in tables and max(len(line) for line in tables.splitlines()) <= 80
    assert "GPU 0" in tables and "PASS max" in tables
