"""Record and replay: the same collector code on a capture gives what it gave on the hardware."""

from __future__ import annotations

import gzip
import json

from conftest import H200_CAPTURE, read_all

from vgpumon.sources.nvml.capture import RecordingBackend, ReplayBackend, read_capture
from vgpumon.testing import scenarios


def _all_samples(backend) -> list:
    return read_all(backend)[1]


def test_rerecording_a_replay_reproduces_every_sample(tmp_path):
    """Recording wraps any backend: record the replay of the H200 capture, replay that, and
    every tick's samples (timestamps included) must be identical."""
    copy = tmp_path / "copy.jsonl"
    rec = RecordingBackend(ReplayBackend(H200_CAPTURE), copy)
    first = _all_samples(rec)
    rec.close()
    second = _all_samples(ReplayBackend(copy))
    assert len(first) == len(second) >= 60
    # everything but the time the collector itself took
    assert [(r.ts, r.samples, r.xid_events) for r in first] == [(r.ts, r.samples, r.xid_events) for r in second]
    header, _ = read_capture(H200_CAPTURE)
    assert first[0].ts > 1.7e9  # the capture's own timestamps, not replay time


def test_mask_removes_uuids_serials_and_host(tmp_path):
    header, ticks = read_capture(H200_CAPTURE)
    # derive a capture that carries identifiers as a real unmasked one would
    for tick in ticks:
        for call in tick["calls"]:
            if call[1] == "nvmlDeviceGetUUID":
                call[4] = {"v": "GPU-e61d089d-d2ae-0f5a-3541-0771e82c634b"}
            if call[1] == "nvmlDeviceGetSerial":
                call[4] = {"v": "1652923045678"}
    masked = tmp_path / "masked.jsonl.gz"
    rec = RecordingBackend(scenarios.backend(header, ticks), masked, mask=True)
    samples = _all_samples(rec)
    rec.close()
    text = gzip.open(masked, "rt").read()
    assert "e61d089d" not in text and "1652923045678" not in text
    assert json.loads(text.splitlines()[0])["host"] == "masked-host"
    assert samples[0].samples[0].uuid == "GPU-00000000-0000-4000-8000-000000000000"


def test_call_missing_from_capture_is_none_with_reason_not_a_crash():
    header, ticks = read_capture(H200_CAPTURE)
    for tick in ticks:
        tick["calls"] = [c for c in tick["calls"] if c[1] != "nvmlDeviceGetPowerUsage"]
    samples = _all_samples(scenarios.backend(header, ticks))
    s = samples[5].samples[0]
    assert s.power_watts is None and s.missing["power_watts"] == "not in capture"
    assert s.temperature_celsius is not None


def test_field_values_struct_becomes_plain_data_with_its_union_decoded():
    """``nvmlDeviceGetFieldValues`` answers an array of ``nvmlFieldValue_t``, whose ``value`` is a
    union named by ``valueType``: the capture keeps the one member NVML filled, not the other
    members' reinterpretation of its bytes (built with nvidia-ml-py's own ctypes types)."""
    pynvml = __import__("pynvml")
    from vgpumon.sources.nvml.plain import to_plain

    values = (pynvml.c_nvmlFieldValue_t * 2)()
    values[0].fieldId, values[0].valueType, values[0].nvmlReturn = 82, pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, 0
    values[0].value.uiVal = 37
    values[1].fieldId, values[1].valueType, values[1].nvmlReturn = 83, pynvml.NVML_VALUE_TYPE_DOUBLE, 3
    values[1].value.dVal = 1.5
    plain = to_plain(values)
    assert [(v["fieldId"], v["nvmlReturn"], v["value"]) for v in plain] == [(82, 0, 37), (83, 3, 1.5)]
    assert json.loads(json.dumps(plain)) == plain
