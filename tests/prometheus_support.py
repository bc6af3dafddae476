"""Where the real Prometheus tools are: Debian's ``prometheus`` package (2.42) installs
``/usr/bin/prometheus`` and ``/usr/bin/promtool``, its ``victoria-metrics`` package
``/usr/bin/victoria-metrics``. A machine without them skips the tests that need
them, unless ``VGPUMON_REQUIRE_PROMETHEUS`` is set (``.ci/run`` sets it): there a missing tool is a
failure, so CI can never pass by skipping."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[1] / "rules"

REQUIRE_ENV = "VGPUMON_REQUIRE_PROMETHEUS"


def tool(name: str) -> str:
    """The path of ``promtool`` or ``prometheus``; skips (or fails in CI) when not installed."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} not installed (apt-get install prometheus)"
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(f"{message}, and {REQUIRE_ENV} is set")
        pytest.skip(message)
    return path


def start_prometheus(tmp_path: Path, prom_port: int, agent_port: int) -> subprocess.Popen:
    """A real Prometheus scraping the agent at ``agent_port`` each second and evaluating the
    project's rule files each second (the twins), its TSDB and log under ``tmp_path``."""
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(r) for r in sorted(RULES.glob("*.rules.yml"))],
        "scrape_configs": [{"job_name": "vgpumon", "static_configs": [{"targets": [f"127.0.0.1:{agent_port}"]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    return subprocess.Popen(
        [tool("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"),  # noqa: SIM115  the child owns it
    )
