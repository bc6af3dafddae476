"""Where the real Prometheus tools are: Debian's ``prometheus`` package (2.42) installs
``/usr/bin/prometheus`` and ``/usr/bin/promtool``, its ``victoria-metrics`` package
``/usr/bin/victoria-metrics``. A machine without them skips the tests that need
them, unless ``VGPUMON_REQUIRE_PROMETHEUS`` is set (``.ci/run`` sets it): there a missing tool is a
failure, so CI can never pass by skipping."""

from __future__ import annotations

import contextlib
import http.server
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
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


def wait_ready(what: str, check: Callable[[], bool], timeout: float) -> None:
    """Poll ``check`` until it is true (an ``OSError`` counts as not yet: a server still
    starting refuses connections); fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """A web server on a free loopback port answering with ``handler``; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
