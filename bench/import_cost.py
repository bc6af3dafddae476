"""Resident memory each package adds to the agent's process, in the order the agent imports
them (one fresh interpreter; RSS from ``/proc/self/status`` after each import).

Usage: python3 bench/import_cost.py
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS = [
    ("pynvml + nvmlInit", None),
    ("typer", "typer"),
    ("pydantic_settings", "pydantic_settings"),
    ("vgpumon.cli", "vgpumon.cli"),
    ("sqlalchemy (core)", "sqlalchemy"),
    ("sqlalchemy.orm", "sqlalchemy.orm"),
    ("vgpumon.store", "vgpumon.store"),
    ("vgpumon.sources.nvml", "vgpumon.sources.nvml"),
    ("vgpumon.agent", "vgpumon.agent"),
    ("psutil", "psutil"),
    ("prometheus_client", "prometheus_client"),
    ("aiohttp", "aiohttp"),
    ("aiohttp.web", "aiohttp.web"),
    ("vgpumon.exporter.server", "vgpumon.exporter.server"),
    ("vgpumon.sources.vllm", "vgpumon.sources.vllm"),
    ("vgpumon.alerts.runner", "vgpumon.alerts.runner"),
    ("alembic (migration only)", "alembic.command"),
]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    before = rss_mb()
    print(f"{'interpreter':<28} {before:7.1f} MB")
    for name, module in STEPS:
        if module is None:
            try:
                import pynvml

                pynvml.nvmlInit()
            except Exception as exc:  # noqa: BLE001 - no GPU here: the import alone
                name += f" (no init: {type(exc).__name__})"
        else:
            importlib.import_module(module)
        now = rss_mb()
        print(f"{name:<28} {now - before:+7.1f} MB  = {now:7.1f} MB  ({len(sys.modules)} modules)")
        before = now


if __name__ == "__main__":
    main()
