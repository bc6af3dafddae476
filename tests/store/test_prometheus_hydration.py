"""The Prometheus source's hydration on canned API answers (no engine): every value through the
door, the step on long windows, XIDs from counter increases, alert runs as episodes, and the
client's bounds on what it reads."""

from __future__ import annotations

import http.server
import re

import pytest
from prometheus_support import serving
from sqlalchemy import text

from vgpumon.store import open_store
from vgpumon.store.prometheus_api import MAX_POINTS, Matrix, PrometheusApi, PrometheusUnavailableError, quote
from vgpumon.store.prometheus_source import hydrate, newest_sample

HOST = "gpu-host-17"
UUID = "GPU-00000000-0000-4000-8000-000000000000"
GPU = {"hostname": HOST, "gpu": "0", "uuid": UUID}
T0 = 1_796_000_000.0


class CannedApi(PrometheusApi):
    """Answers each query from ``series`` (metric → matrix), as a Prometheus holding them would,
    and records the range queries' steps."""

    def __init__(self, series: dict[str, Matrix], scrapes: float) -> None:
        super().__init__("http://canned:9090")
        self.series, self.scrapes, self.steps = series, scrapes, []

    def _metric(self, expr: str) -> str:
        return re.search(r"(vgpumon_\w+)\{", expr).group(1)

    def instant(self, expr: str, at: float) -> Matrix:
        self.requests += 1
        if expr.startswith("max(count_over_time("):
            return [({}, [(at, self.scrapes)])]
        if expr.startswith(("count(", "max(")):
            return []
        return self.series.get(self._metric(expr), [])

    def range(self, expr: str, start: float, end: float, step: float) -> Matrix:
        self.requests += 1
        self.steps.append(step)
        if expr.startswith("count_over_time("):
            return [(GPU, [(T0 + 9, 3.0)])]
        return self.series.get(self._metric(expr), [])


def _series(n: int = 10, temperature: float = 50.0) -> dict[str, Matrix]:
    ts = [T0 + i for i in range(n)]
    return {
        "vgpumon_gpu_info": [({**GPU, "name": "NVIDIA H200", "pci_bus_id": "00000000:18:00.0", "serial": "x" * 400,
                              "gpm_supported": "true"}, [(t, 1.0) for t in ts])],
        "vgpumon_gpu_up": [(GPU, [(t, 1.0) for t in ts])],
        "vgpumon_gpu_temperature_celsius": [(GPU, [(t, temperature if i == 3 else 40.0) for i, t in enumerate(ts)])],
        "vgpumon_gpu_power_usage_watts": [(GPU, [(t, 100.0) for t in ts])],
        "vgpumon_gpu_xid_events_total": [({**GPU, "xid": "79"}, [(t, 0.0 if i < 5 else 2.0) for i, t in enumerate(ts)])],
        "vgpumon_alerts": [({"hostname": HOST, "gpu": "0", "uuid": UUID, "alertname": "GpuXidCritical", "severity": "critical",
                             "state": "firing"}, [(t, 1.0) for t in ts[5:]])],
    }


def test_every_value_passes_the_door_and_a_refused_one_is_null_and_counted(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    got = hydrate(store, CannedApi(_series(temperature=9999.0), scrapes=10), HOST, T0 - 60, T0 + 9)
    assert got.step_seconds is None and got.resolution == "every scraped sample (about 1 s apart)"
    [gpu] = store.gpus_of(HOST)
    assert gpu.identity.name == "NVIDIA H200" and gpu.identity.serial is None  # 400 characters: refused
    with store.engine.connect() as conn:
        temps = [r[0] for r in conn.execute(text("SELECT temperature_celsius FROM gpu_samples ORDER BY ts"))]
        refused = conn.execute(text("SELECT subject, field, reason FROM rejected_values")).all()
        xids = conn.execute(text("SELECT ts, xid FROM xid_events")).all()
        alerts = conn.execute(text("SELECT name, state, fired_at, resolved_at FROM alerts")).all()
    assert len(temps) == 10 and temps[3] is None and temps[0] == 400  # 0.1 °C as stored
    assert refused == [(f"gpu:{UUID}", "temperature_celsius", "rejected: 9999 outside -40..150 celsius")]
    assert got.rejected == {"temperature_celsius": 1}
    assert xids == [(int((T0 + 5) * 1000), 79)] * 2  # one increase of 2 (epoch ms as stored)
    assert alerts == [("GpuXidCritical", "firing", int((T0 + 5) * 1000), None)]  # runs to the span's end: open
    store.close()


def test_a_window_of_more_than_11000_scrapes_is_read_at_a_step(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'h.db'}")
    api = CannedApi(_series(), scrapes=3 * 86400)
    got = hydrate(store, api, HOST, T0 - 3 * 86400, T0 + 9)
    step = -(-(3 * 86400 + 9) // MAX_POINTS)
    assert got.step_seconds == step and set(api.steps) == {step}
    assert got.resolution.startswith(f"one point per {step:g} s") and "one point per" in got.notes[0]
    store.close()


def test_the_newest_sample_is_found_past_the_staleness_marker():
    api = CannedApi(_series(), scrapes=10)
    assert newest_sample(api, HOST, T0 + 600) == T0 + 9


def test_label_values_are_quoted_in_promql():
    assert quote('a"b\\c') == '"a\\"b\\\\c"'


class _Answer(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802  the standard library's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def answering():
    with serving(_Answer) as url:
        yield url


def test_an_answer_beyond_the_bound_is_refused_and_bad_points_are_dropped(answering):
    _Answer.body = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b"},"values":' + b"[[1,\"1\"]]" + b" " * 2000 + b"}]}}"
    with pytest.raises(PrometheusUnavailableError, match="answered more than"):
        PrometheusApi(answering, max_bytes=1000).instant("x[1m]", T0)
    _Answer.body = (b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"a":"b","z":"' + b"y" * 300 + b'"},'
                    b'"values":[[1,"1"],[2,"NaN"],[3,"x"],[-1,"2"],["4","5"],[5,"+Inf"],[true,"6"]]}]}}')
    [(labels, points)] = PrometheusApi(answering).instant("x[1m]", T0)
    assert labels == {"a": "b"}  # a label longer than any column is left out
    assert points == [(1.0, 1.0), (5.0, float("inf"))]  # the door refuses +Inf; NaN, text, bad times dropped here
