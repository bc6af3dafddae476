"""Every door, fuzzed: the ``/metrics`` reader, the other vLLM endpoints, capture ticks, TOML
settings, API requests and command lines each either take an input or refuse it as documented
(``vgpumon.testing.fuzz``); nothing else escapes. A short run here (bounded examples, built from
the recorded inputs); the long one is ``bench/fuzz_long.py`` (docs/reliability.md, "Fuzzing")."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vgpumon.base.durations import parse_duration
from vgpumon.testing.fuzz import TARGETS, Finding, seeds

pytestmark = pytest.mark.fuzz

_SHORT = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _passes_or_refuses(name: str, data: bytes) -> None:
    target = TARGETS[name]
    try:
        target.run(data)
    except target.refusals:
        pass  # the documented refusal: one line, nothing else lost


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**400), max_value=10**400) | st.floats() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=20), inner, max_size=5),
    max_leaves=20,
)
_NUMBERS = st.sampled_from(["0", "-1", "1e16", "+Inf", "-Inf", "NaN", "1" * 400, "0x10", "1_000", "", "1e-400", "97.0"])


# -- /metrics -------------------------------------------------------------------------------------

_REAL = seeds("metrics")


@st.composite
def _metrics_bodies(draw: st.DrawFn) -> bytes:
    """A recorded vLLM 0.32 scrape with some of its lines changed: a value, a label value, a
    line cut short, bytes inserted."""
    lines = draw(st.sampled_from(_REAL)).split(b"\n")
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["value", "label", "cut", "bytes", "dup"]))
        line = lines[i]
        if how == "value" and b" " in line:
            lines[i] = line.rsplit(b" ", 1)[0] + b" " + draw(_NUMBERS).encode()
        elif how == "label" and b'="' in line:
            text = draw(st.text(max_size=400)).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
            lines[i] = line.replace(b'="', b'="' + text.encode("utf-8", "surrogateescape"), 1)
        elif how == "cut":
            lines[i] = line[: draw(st.integers(0, max(len(line) - 1, 0)))]
        elif how == "bytes":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.binary(max_size=40)) + line[at:]
        else:
            lines.insert(i, line)
    return b"\n".join(lines)


@_SHORT
@given(_metrics_bodies() | st.binary(max_size=2000))
def test_the_metrics_reader_takes_or_refuses_any_body(body):
    _passes_or_refuses("metrics", body)


# -- the other vLLM endpoints ---------------------------------------------------------------------


@_SHORT
@given(st.one_of(
    _JSON.map(lambda v: json.dumps({"version": v})), _JSON.map(lambda v: json.dumps({"data": v})),
    st.lists(_JSON.map(lambda v: {"id": v}), max_size=4).map(lambda d: json.dumps({"data": d})),
    _JSON.map(lambda v: json.dumps({"server_load": v, "is_sleeping": v})),
    st.dictionaries(st.sampled_from(["num_running", "num_waiting", "gpu_cache_usage", "block_size", "num_gpu_blocks",
                                     "free_blocks", "kv_cache_usage"]), _JSON, max_size=7).map(json.dumps),
    _JSON.map(json.dumps),
).map(lambda s: s.encode()) | st.binary(max_size=300))
def test_the_other_vllm_endpoints_take_any_json_as_an_answer_or_none(body):
    _passes_or_refuses("vllm_json", body)


# -- capture ticks --------------------------------------------------------------------------------

_TICKS = [json.loads(t) for t in seeds("capture")]


@st.composite
def _ticks(draw: st.DrawFn) -> bytes:
    """A recorded H200 tick with its time, or one call's answer, or one call, made odd."""
    tick = json.loads(json.dumps(draw(st.sampled_from(_TICKS))))
    how = draw(st.sampled_from(["ts", "answer", "error", "call"]))
    if how == "ts":
        tick["ts"] = draw(st.floats() | st.integers(min_value=-(10**30), max_value=10**30))
    elif tick["calls"]:
        call = tick["calls"][draw(st.integers(0, len(tick["calls"]) - 1))]
        if how == "answer":
            call[4] = {"v": draw(_JSON)}
        elif how == "error":
            call[4] = {"e": draw(st.integers(-(2**40), 2**40))}
        else:
            call[draw(st.integers(0, 4))] = draw(_JSON)
    return json.dumps(tick).encode()


@_SHORT
@given(_ticks())
def test_a_capture_tick_is_replayed_or_refused_whatever_it_holds(line):
    _passes_or_refuses("capture", line)


# -- settings -------------------------------------------------------------------------------------

_KEYS = {
    "": ["log_level"], "store": ["url", "raw_retention", "rollup_retention"], "agent": ["interval", "spool", "slow_every"],
    "vllm": ["urls", "interval"], "diagnose": ["window", "max_age"], "api": ["token", "stacks"],
    "rules.thresholds": ["gpu_temperature_celsius", "for", "disabled"],
}
_TOML_VALUE = st.one_of(
    st.text(max_size=40).map(json.dumps), st.integers(-(2**70), 2**70).map(str), st.floats().map(repr),
    st.booleans().map(lambda b: str(b).lower()), st.sampled_from(['"1s"', '"15m"', '"-3h"', '"0s"', '"99999999d"', "[]", '["a", 1]', "{}"]),
)


@st.composite
def _toml(draw: st.DrawFn) -> bytes:
    out = []
    for section in draw(st.lists(st.sampled_from(sorted(_KEYS)), max_size=4, unique=True)):
        if section:
            out.append(f"[{section}]")
        for key in draw(st.lists(st.sampled_from(_KEYS[section]), max_size=3, unique=True)):
            out.append(f"{key} = {draw(_TOML_VALUE)}")
    return "\n".join(out).encode("utf-8", "surrogatepass")


@_SHORT
@given(_toml() | st.binary(max_size=400) | st.sampled_from(seeds("settings")))
def test_a_settings_file_is_read_or_refused_in_one_line(text):
    _passes_or_refuses("settings", text)


def test_a_duration_past_any_float_is_refused_in_one_line():
    """The long fuzz run's finding (seed 2001, 500 000 inputs): a TOML integer of 400 digits as a
    duration ended in OverflowError, converted to a float, instead of the range's refusal."""
    _passes_or_refuses("settings", b"[diagnose]\nwindow = " + b"1" * 400)
    with pytest.raises(ValueError, match="at most"):
        parse_duration(int("1" * 400))


# -- API requests ---------------------------------------------------------------------------------


@_SHORT
@given(
    st.sampled_from([b"GET", b"HEAD", b"POST", b"DELETE", b"get"]),
    st.sampled_from([b"", b"/", b"/snapshot", b"/alerts", b"/diagnose", b"/nope"]),
    st.lists(st.tuples(st.sampled_from(["window", "since", "max_age", "stacks", "x"]), st.text(max_size=30)), max_size=4),
    st.sampled_from([b"Bearer fuzz-token-0123456789", b"Bearer ", b"bearer x", b""]) | st.binary(max_size=80),
)
def test_an_api_request_is_answered_in_json_and_never_500(method, path, query, auth):
    from urllib.parse import urlencode

    q = urlencode(query).encode()
    _passes_or_refuses("api", method + b"\n" + path + (b"?" + q if q else b"") + b"\n" + auth)


# -- command lines --------------------------------------------------------------------------------

_WORDS = st.sampled_from(["--json", "--window", "--since", "--max-age", "--gpu", "--hostname", "--stacks", "--html",
                          "--help", "h200", "15m", "-3h", "0", "2026-12-01T00:00:00", "9" * 40, "--", "-"]) | st.text(max_size=40)


@_SHORT
@given(st.integers(0, 3), st.lists(_WORDS, max_size=6))
def test_a_command_line_is_answered_with_a_documented_exit_code(command, words):
    data = bytes([command]) + b"\x00".join(w.encode("utf-8", "surrogateescape") for w in words if "\x00" not in w)
    _passes_or_refuses("cli", data)


def test_each_target_runs_its_recorded_seeds():
    """The seeds pass: a target that refused its own recorded inputs would fuzz nothing."""
    for name, target in TARGETS.items():
        for seed in seeds(name):
            try:
                target.run(seed)
            except target.refusals as exc:
                assert name == "settings", f"{name} refused its seed: {exc}"


def test_a_finding_is_reported_not_swallowed(monkeypatch):
    """A planted fault is found: with the door of ``/v1/models`` taken away (a NUL let through,
    as before the door), the target says so; and an exception that is no refusal escapes."""
    from vgpumon.sources.vllm import scrape

    monkeypatch.setattr(scrape, "models_answer", lambda door, doc, refused: tuple(d["id"] for d in doc["data"]))
    with pytest.raises(Finding):
        TARGETS["vllm_json"].run(b'{"data": [{"id": "evil\\u0000model"}]}')
    with pytest.raises(TypeError):
        TARGETS["vllm_json"].run(b'{"data": null}')
