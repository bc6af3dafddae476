"""Energy per generated token, on recorded readings: the H200's energy counter (its workload
capture, read every 10 ticks; its idle capture, every 2) against the generation-token counter of
the real vLLM 0.32 recording (``vllm-0.32.0-cpu__lifecycle.jsonl``, polled every ~0.5 s), the
two aligned in time: the recording's t = 56.26 s (its first poll with the counter, at 0) falls
on the workload capture's tick 30 (the start of its matmul phase). The expected figures are
hand computations from the recorded numbers (printed in each test); the meter must agree within
±5 %."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest
from conftest import DATA, H200_CAPTURE
from rules_support import replay
from vllm_support import lifecycle_body, shared_dir, source

from vgpumon.diagnose.render import render_diagnose
from vgpumon.diagnose.report import build_report
from vgpumon.model import GpuSample, Snapshot
from vgpumon.sources.vllm import VllmProcess
from vgpumon.sources.vllm.energy import EnergyMeter, memory_shares
from vgpumon.store import open_store
from vgpumon.store.vllm_repository import VllmRepository
from vgpumon.testing import scenarios
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer, free_port

GPU = "GPU-0"


def _energy(capture: str) -> list[tuple[float, float]]:
    """(ts, joules) of every recorded nvmlDeviceGetTotalEnergyConsumption answer (mJ)."""
    out = []
    with gzip.open(DATA / capture, "rt") as f:
        for line in f:
            t = json.loads(line)
            for c in t.get("calls", []):
                if c[1] == "nvmlDeviceGetTotalEnergyConsumption" and "v" in c[4]:
                    out.append((t["ts"], c[4]["v"] / 1000.0))
    return out


def _tokens() -> list[tuple[float, float]]:
    """(t, generation_tokens_total) of every poll of the recording that read the counter."""
    rows = [json.loads(line) for line in (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__lifecycle.jsonl").read_text().splitlines()]
    out = []
    for r in rows:
        if "gen" in r:
            (value,) = [float(line.rsplit(" ", 1)[1]) for line in r["gen"] if not line.startswith("#")]
            out.append((r["t"], value))
    return out


def _feed(meter: EnergyMeter, energy: list[tuple[float, float]], offset: float, shares=None):
    """Polls and energy reads in time order, as the source sees them (the poll after a read
    steps the meter); returns every interval's figure."""
    tokens = [(t + offset, v) for t, v in _tokens()]
    events = sorted([(t, "poll", v) for t, v in tokens] + [(t, "read", j) for t, j in energy])
    reads: dict[str, tuple[float, float]] = {}
    out = []
    for t, kind, v in events:
        if kind == "read":
            reads[GPU] = (t, v)
            continue
        meter.note_tokens(t, v)
        if reads and (e := meter.step(dict(reads), shares or {GPU: 1.0})) is not None:
            out.append(e)
    return out


def test_energy_per_token_over_a_recorded_interval_matches_a_hand_computation():
    energy = _energy("h200-workload.jsonl.gz")
    tick30 = energy[3][0]  # reads at ticks 0, 10, 20, 30, …
    offset = tick30 - 56.26
    first, second = _feed(EnergyMeter(), energy[3:], offset)[:2]
    # by hand: (13739.143 − 6912.021) J from tick 30 to 40 / (10813 − 0) tokens (flat at 10813 from t 62.73 to 68.68)
    assert first.joules == pytest.approx(13739.143 - 6912.021)
    assert first.joules_per_token == pytest.approx(6827.122 / 10813, rel=0.05)
    # ticks 40 → 50 (t 66.26 → 76.26): 16150.024 − 13739.143 J over 70835 − 10813 tokens (flat from t 75.13)
    assert second.joules_per_token == pytest.approx(2410.881 / 60022, rel=0.05)
    assert (first.note, second.note) == ("", "")


def test_an_idle_interval_has_no_figure_not_an_infinite_one():
    """The idle capture's reads (every 2 s) over the recording's flat stretch (t 75.13 → 81.18,
    70835 tokens throughout)."""
    energy = _energy("h200-idle-full.jsonl.gz")
    offset = energy[0][0] - 75.2
    figures = _feed(EnergyMeter(), energy[:4], offset)
    assert figures and all(e.joules_per_token is None and e.note == "no tokens generated" and e.tokens == 0 for e in figures)
    assert all(e.joules is not None and e.joules > 0 for e in figures)  # the energy was spent, on no token


def test_a_counter_reset_gives_no_figure_and_the_next_interval_counts_from_the_new_reading():
    """The workload capture's reads with a driver reload after tick 30: the counter restarts from
    the recorded idle capture's first value."""
    energy = _energy("h200-workload.jsonl.gz")
    offset = energy[3][0] - 56.26
    reloaded = energy[3:4] + [(ts, j - energy[4][1] + 2649.503) for ts, j in energy[4:]]
    first, second = _feed(EnergyMeter(), reloaded, offset)[:2]
    assert first.joules_per_token is None and first.note == f"energy counter reset on {GPU}"
    assert second.joules_per_token == pytest.approx(2410.881 / 60022, rel=0.05)


def test_a_gpu_shared_with_another_process_is_split_by_memory_held_and_says_so():
    # the recorded workload's process held 30.15 GB; a second server's process beside it, 10 GB
    shares, note = memory_shares([GPU], {GPU: ((4243, 30_150_000_000), (5000, 10_000_000_000))}, {4242, 4243})
    assert shares[GPU] == pytest.approx(30.15 / 40.15)
    assert note == f"{GPU} shared with 1 other process(es): 75 % charged, by memory held"
    energy = _energy("h200-workload.jsonl.gz")
    (first,) = _feed(EnergyMeter(), energy[3:], energy[3][0] - 56.26, shares)[:1]
    assert first.joules_per_token == pytest.approx(6827.122 * 30.15 / 40.15 / 10813, rel=0.05)
    alone, none = memory_shares([GPU], {GPU: ((4243, 30_150_000_000),)}, {4243})
    assert alone == {GPU: 1.0} and none == ""
    by_count, how = memory_shares([GPU], {GPU: ((4243, None), (5000, None))}, {4243})
    assert by_count == {GPU: 0.5} and how.endswith("by process count (NVML reports no per-process memory)")


def _source_run(second: bool = False) -> list:
    """The vLLM source polling the fake server through the recording, fed the recorded energy
    reads of the GPU its engine (pid 4243, 30.15 GB as recorded) holds; with ``second``, a second
    server (pid 5001, 10 GB) shares that GPU, serving the recorded idle capture (no token)."""
    rows = {r["t"]: r for r in map(json.loads, (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__lifecycle.jsonl").read_text().splitlines())}
    idle = (shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__idle.txt").read_text()
    energy = _energy("h200-workload.jsonl.gz")[3:5]  # ticks 30 and 40
    offset = energy[0][0] - 56.26
    procs = ((4243, 30_150_000_000), (5001, 10_000_000_000)) if second else ((4243, 30_150_000_000),)

    async def go():
        clock = FakeClock(start=offset + 56.26)
        servers, table = [], []
        for pid in ((4242, 5000) if second else (4242,)):
            port = free_port()
            servers.append(FakeVllmServer(port=port, version="0.32.0", models=["tiny"], metrics=idle))
            table.append(VllmProcess(pid=pid, create_time=clock.now - 60, host="127.0.0.1", port=port, pids=(pid, pid + 1)))
        src = source(clock, processes=FakeProcessTable(table))
        for srv in servers:
            await srv.start(srv.port)
        out = []
        try:
            reads = list(energy)
            for t, row in sorted(rows.items()):
                if "gen" not in row:
                    continue
                clock.now = offset + t
                while reads and reads[0][0] <= clock.now:
                    ts, joules = reads.pop(0)
                    src.observe(Snapshot(ts=ts, hostname="h", gpus=(), samples=(
                        GpuSample(ts=ts, uuid=GPU, index=0, energy_joules_total=joules, processes=procs),)))
                servers[0].metrics = lifecycle_body(row)
                out += sorted(await src.poll(), key=lambda smp: smp.instance.pid or 0)
        finally:
            await src.close()
            for srv in servers:
                await srv.stop()
        return out

    return asyncio.run(go())


def test_the_source_puts_the_figure_on_the_servers_sample():
    """The vLLM source end to end: the fake server serves the recorded lifecycle's counter at
    each poll, the agent's snapshots carry the H200's recorded energy reads for the GPU the
    server's engine holds; from the poll after the second read the samples carry the interval's
    figure (0.631 J per token)."""
    samples = _source_run()
    first = next(i for i, s in enumerate(samples) if s.energy_per_token_joules is not None)
    assert all(s.energy_per_token_joules is None for s in samples[:first])  # before the second read: no figure
    assert samples[first].ts >= _energy("h200-workload.jsonl.gz")[4][0]  # the first poll after the read at tick 40
    # held until the next read (none comes: the recording ends 15 s later)
    (held,) = {s.energy_per_token_joules for s in samples[first:]}
    assert held == pytest.approx(6827.122 / 10813, rel=0.05)
    assert samples[-1].energy_interval_joules == pytest.approx(6827.122)
    assert samples[-1].gpu_uuids == (GPU,) and samples[-1].energy_per_token_note is None


def test_diagnose_says_the_servers_energy_per_token(tmp_path):
    """The samples of the end-to-end run above, stored beside the H200 capture whose energy reads
    they used (replayed through the agent: the GPU rows of the same host and times), as
    ``diagnose`` reports and prints them."""
    samples = _source_run()
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *scenarios.load(str(H200_CAPTURE)))
    store = open_store(url)
    try:
        VllmRepository(store.engine).write("h", samples)
        report = build_report(store, "h", now=samples[-1].ts)
    finally:
        store.close()
    (server,) = report["vllm"]
    assert server["energy_per_token_joules"] == pytest.approx(6827.122 / 10813, rel=0.05)
    assert f"{server['server']}: energy per generated token 0.6314 J" in render_diagnose(report, width=200)


def test_two_servers_on_one_gpu_split_its_energy_by_memory_and_the_host_figure_counts_both(tmp_path):
    """The serving server (30.15 GB) and an idle one (10 GB) on the GPU of the recorded reads:
    75 % and 25 % of the 6827.1 J; the idle one has no figure; the host's is all the energy over
    all the tokens, 6827.1 J / 10 813 = 0.6314 J."""
    samples = _source_run(second=True)
    busy, idle = samples[-2], samples[-1]
    assert (busy.instance.pid, idle.instance.pid) == (4242, 5000)
    assert busy.energy_interval_joules == pytest.approx(6827.122 * 30.15 / 40.15)
    assert busy.energy_per_token_joules == pytest.approx(6827.122 * 30.15 / 40.15 / 10813, rel=0.05)
    assert busy.energy_per_token_note == f"{GPU} shared with 1 other process(es): 75 % charged, by memory held"
    assert idle.energy_per_token_joules is None and idle.energy_interval_joules == pytest.approx(6827.122 * 10 / 40.15)
    assert idle.energy_per_token_note == "no tokens generated"
    url = f"sqlite:///{tmp_path / 'x.db'}"
    replay(url, *scenarios.load(str(H200_CAPTURE)))
    store = open_store(url)
    try:
        VllmRepository(store.engine).write("h", samples)
        text = render_diagnose(build_report(store, "h", now=samples[-1].ts), width=200)
    finally:
        store.close()
    assert f"{idle.instance.host}:{idle.instance.port}: energy per generated token N/A (no tokens generated)" in text
    assert "host: energy per generated token 0.6314 J over 2 servers' newest intervals" in text
