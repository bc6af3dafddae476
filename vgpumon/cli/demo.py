"""``vgpumon demo``: two recorded hosts, one sick and one healthy, replayed into a store of their
own and read back with the commands an operator would type, each shown before its output.

The hosts are real captures (``tests/data``, provenance in its README): the 8-GPU incident that
``vgpumon.testing.incident`` derives from the H200 captures (uncorrectable ECC, a GPU fallen off
the bus, application XIDs, NVML blanks, every PCIe link loaded at once behind two shared
switches, each card at the share of its switch's uplink it would get: ``uplink_bound``) and the
healthy one-GPU H200 workload. Both are replayed with ``--shift-to-now``, so
their times end now and the retention of ``db prune`` keeps them whatever the capture's age.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Annotated, Optional

import typer

from vgpumon.base.errors import CaptureFormatError, ExitCode, UsageError

#: The captures the demo replays, under ``--data``.
WORKLOAD = "h200-workload.jsonl.gz"
NEEDED = (WORKLOAD, "h200-idle-hbm.jsonl.gz", "h200-sysfs.json")
SICK, HEALTHY = "gpu-incident", "h200-healthy"


def demo(
    data: Annotated[
        Path,
        typer.Option("--data", help="Directory of the recorded captures (a checkout's tests/data).", file_okay=False),
    ] = Path("tests/data"),
    workdir: Annotated[
        Optional[Path],
        typer.Option("--dir", help="Where the demo's store and captures go (default: a new temporary directory, kept for you to explore).", file_okay=False),
    ] = None,
    lines: Annotated[
        Optional[int],
        typer.Option("--lines", min=5, help="Lines of each report to show (default: a screen, the terminal's height).", show_default=False),
    ] = None,
) -> None:
    """Replay a sick 8-GPU host and a healthy H200 from recorded captures, then show what
    diagnose says about each and what capacity says about adding two cards to the sick one.

    The replays' times are moved to end now (agent --shift-to-now), so the demo works on any day.
    Every step is printed as the command that does it, to run again by hand. The store stays in
    --dir (or the temporary directory named at the end). Needs no GPU.

    Examples:
      vgpumon demo
      vgpumon demo --dir /tmp/vgpumon-demo --lines 40
    """
    from vgpumon.testing import incident

    missing = [name for name in NEEDED if not (data / name).is_file()]
    if missing:
        raise CaptureFormatError(f"--data {data}: {missing[0]} is not there; run from a checkout of vgpumon (the captures are in tests/data) or give --data DIR")
    work = workdir if workdir is not None else Path(tempfile.mkdtemp(prefix="vgpumon-demo-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        store = work / "demo.db"
        if store.exists():
            raise UsageError(f"--dir {work} holds a demo.db already: give another --dir, or remove it")
        capture = incident.write(data, work / "incident-8gpu.jsonl.gz", uplink_bound=True)
        sysfs = incident.sysfs_tree(data, work / "sysfs")
    except OSError as exc:
        raise UsageError(f"--dir {work}: cannot write there: {exc.strerror or exc}") from None
    width, height = _screen()
    show = lines or max(20, height - 4)
    db = ["--db", str(store)]

    _say(f"vgpumon demo: two recorded hosts replayed into {store}, their times moved to end now", bold=True)
    _step(["agent", "--replay", str(capture), "--sysfs", str(sysfs), "--hostname", SICK, "--shift-to-now", *db, "--listen", "off"], width)
    _step(["agent", "--replay", str(data / WORKLOAD), "--hostname", HEALTHY, "--shift-to-now", *db, "--listen", "off"], width)
    _step(["db", "prune", *db], width)

    _say(f"\n1. {SICK}: an 8-GPU host in trouble", bold=True)
    _step(["diagnose", SICK, *db], width, head=show, codes=(0, 1, 2))
    _say(f"\n2. {HEALTHY}: a healthy host", bold=True)
    _step(["diagnose", HEALTHY, *db], width, head=show, codes=(0, 1, 2))
    _say(f"\n3. Can {SICK} take two more cards? Its GPUs share two PCIe switches", bold=True)
    _step(["capacity", SICK, *db, "--add", "2"], width)
    _say(f"\nThe store stays in {work}: run the commands above to read on (--json for the data); "
         f"remove it with: rm -r {shlex.quote(str(work))}")


def _screen() -> tuple[int, int]:
    """The terminal's columns and rows (80 × 24 when the output is not a terminal)."""
    size = shutil.get_terminal_size((80, 24))
    return max(40, size.columns), max(10, size.lines)


def _say(text: str, *, bold: bool = False) -> None:
    """A line of the demo's own, wrapped at word boundaries to the terminal."""
    width = _screen()[0]
    typer.secho("\n".join(textwrap.fill(part, width, break_long_words=False, break_on_hyphens=False) if part else ""
                          for part in text.split("\n")), bold=bold)


def _step(args: list[str], width: int, *, head: int | None = None, codes: tuple[int, ...] = (0,)) -> None:
    """Print ``$ vgpumon ARGS``, run it, and print its output (its first ``head`` lines, and how
    many more there are); the agent's summary line stands for its log. An exit code outside
    ``codes`` ends the demo with that code and the command's own error line."""
    typer.secho("$ " + shlex.join(["vgpumon", *args]), fg="cyan")
    env = {**os.environ, "COLUMNS": str(width)}
    env.pop("VGPUMON_CONFIG", None)  # the demo's settings are its flags, whatever the user configured
    out = subprocess.run([sys.executable, "-m", "vgpumon", *args], capture_output=True, text=True, env=env, check=False)  # noqa: S603  this interpreter running vgpumon itself
    if out.returncode not in codes:
        sys.stderr.write(out.stderr)
        raise typer.Exit(out.returncode or ExitCode.SOFTWARE)
    text = out.stdout
    if args[0] == "agent":  # its log narrates the incident as it happens; the summary says what was stored
        text = "".join(line for line in out.stderr.splitlines(keepends=True) if line.startswith("vgpumon agent:"))
    shown = text.splitlines()
    if head is not None and len(shown) > head:
        rest = len(shown) - head
        shown = [*shown[:head], f"… {rest} more lines: findings in full, GPUs, health, trends"]
    for line in shown:
        typer.echo(line)
