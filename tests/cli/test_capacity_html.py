"""`capacity --html` as a person opens it in a browser: the README's demo store, rendered by
headless Chromium (Debian's `chromium`). The time chart shows its traces on axes that fit the
data, the bars carry their figures, and the terminal review's notes are on the page."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import H200_CAPTURE, KEEP_ALL, VGPUMON
from png_support import read_png

pytestmark = [
    pytest.mark.slow,  # starts processes: not in the quick subset (docs/testing.md)
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (headless) to render the page"),
]

PLOT_BG = (229, 236, 246)  # plotly's default plot area
FIRST_TRACE = (99, 110, 250)  # plotly's first trace colour (GPU 0 TX)
CHROMIUM = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--virtual-time-budget=10000"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The README's demo: the H200 capture replayed, rolled up, reviewed with --html."""
    pytest.importorskip("plotly")
    d = tmp_path_factory.mktemp("html")
    db = str(d / "demo.db")
    for args in (["agent", "--replay", str(H200_CAPTURE), "--db", db, "--listen", "off", "--spool", str(d / "spool")],
                 ["db", "prune", "--db", db, *KEEP_ALL],
                 ["capacity", "--db", db, "--html", str(d / "review.html")]):
        out = subprocess.run(VGPUMON + args, capture_output=True, text=True, env=_env(), timeout=180)
        assert out.returncode == 0, out.stderr
    return d / "review.html"


def _near(p: tuple[int, int, int], q: tuple[int, int, int], within: int = 40) -> bool:
    return sum(abs(a - b) for a, b in zip(p, q)) <= within


def test_the_time_chart_shows_its_traces_in_the_plot_area(page, tmp_path):
    """The first plot area (plotly's blue-grey background, the top band of rows holding it) has
    the traces drawn in it: many distinct colours and the first trace's colour along a line.
    Before, every trace waited hidden for a click and the area was background, grid and the
    saturation line only."""
    shot = tmp_path / "review.png"
    out = subprocess.run([*CHROMIUM, "--window-size=1200,1100", f"--screenshot={shot}", page.as_uri()], capture_output=True,
                         text=True, timeout=120)
    assert shot.exists(), out.stderr
    rows = read_png(shot)
    bg_rows = [y for y, row in enumerate(rows) if sum(px == PLOT_BG for px in row) > 200]
    assert bg_rows, "no plot area in the screenshot"
    band = [bg_rows[0]]
    for y in bg_rows[1:]:
        if y > band[-1] + 5:  # past the first area (a gridline's row has no background: a gap of a row or two)
            break
        band.append(y)
    xs = [x for x, px in enumerate(rows[band[len(band) // 2]]) if px == PLOT_BG]
    area = [rows[y][x] for y in band for x in range(xs[0], xs[-1] + 1)]
    assert len(band) > 100 and len(xs) > 300, (len(band), len(xs))
    colours = {px for px in area}
    traced = sum(_near(px, FIRST_TRACE) for px in area)
    assert len(colours) > 20, len(colours)
    assert traced > 200, traced  # a line across the chart, not a legend swatch


def test_the_axes_fit_the_data_the_bars_carry_their_figures_and_the_notes_are_there(page):
    """What the rendered page says: the time axis in the capture's days (not January 2000), the
    bar labelled with the share the terminal review prints, no empty projection series for a host
    without a shared link, and the terminal's note on why."""
    dom = subprocess.run([*CHROMIUM, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    texts = [re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text[^>]*>.*?</text>", dom)]
    assert "Nov 30, 2026" in " ".join(texts) and "2000" not in " ".join(texts), texts[:20]
    assert "GPU 0 TX" in texts and "GPU 0 RX" in texts
    assert "84.3 %" in texts  # RX p95 of the max link, as `vgpumon capacity` prints it
    assert not any("more cards" in t for t in texts)
    assert "no PCIe topology stored for this host (the agent reads it from sysfs at start): shared links unknown" in dom
    assert "1 GPU; 7 days to 2026-11-30 01:40 UTC, 3 minutes of 1-minute rollups" in dom
