"""Where the real Prometheus tools are: Debian's ``prometheus`` package (2.42) installs
``/usr/bin/prometheus`` and ``/usr/bin/promtool``. A machine without them skips the tests that need
them, unless ``VGPUMON_REQUIRE_PROMETHEUS`` is set (``.ci/run`` sets it): there a missing tool is a
failure, so CI can never pass by skipping."""

from __future__ import annotations

import os
import shutil

import pytest

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
