"""Hung, not slow (docs/vllm.md): a vLLM server whose engine is stopped reads idle on every face
(frozen gauges, /health 200). The engine process's state (a real child process, stopped with
SIGSTOP) and the generation probe (the fake server, with a real client process holding a
connection open on its port) tell it apart; an idle server with nobody waiting is never probed,
and a long prefill (work queued, counters flat, the engine using CPU) is busy, not hung."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import psutil
import pytest
from conftest import wait_for
from vllm_support import shared_dir, source

from vgpumon.sources.vllm import ServerState, VllmProcess
from vgpumon.sources.vllm.discovery import ProcessUsage
from vgpumon.sources.vllm.hang import PROBE_ID_PREFIX, HangWatch, client_connections
from vgpumon.testing.vllm import FakeClock, FakeProcessTable, FakeVllmServer, free_port

S = ServerState
IDLE = "vllm-0.32.0-cpu__idle.txt"  # recorded: 0 running, 0 waiting
BUSY = "vllm-0.32.0-cpu__busy.txt"  # recorded: 97 running


def _capture(name: str) -> str:
    return (shared_dir("fixtures", "vllm-real") / name).read_text()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A real child process standing in for ``VLLM::EngineCore``."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        yield p
    finally:
        os.kill(p.pid, signal.SIGCONT)
        p.kill()
        p.wait()


def _client(port: int) -> subprocess.Popen[bytes]:
    """A real client process holding one connection open on ``port`` (a user waiting on a
    completion)."""
    code = ("import socket, sys, time; s = socket.create_connection(('127.0.0.1', %d)); "
            "print('connected', flush=True); time.sleep(600)" % port)
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"connected\n"
    return p


class Scripted(FakeProcessTable):
    """The fake process table, with the engine's CPU seconds scripted per call of ``usage`` (the
    kernel's accounting is the process edge)."""

    def __init__(self, processes: Sequence[VllmProcess], cpu_per_poll: float) -> None:
        super().__init__(processes)
        self.cpu = 0.0
        self.cpu_per_poll = cpu_per_poll

    def usage(self, pids: Sequence[int]) -> ProcessUsage | None:
        self.cpu += self.cpu_per_poll
        return ProcessUsage(rss_bytes=1 << 30, cpu_seconds={pid: self.cpu for pid in pids})


async def _polls(src: Any, clock: FakeClock, n: int, interval: float) -> list[Any]:
    out = []
    for _ in range(n):
        (smp,) = await src.poll()
        out.append(smp)
        clock.advance(interval)
    return out


def test_a_stopped_engine_reads_hung_within_a_minute_while_its_gauges_say_idle(sleeper):
    """As in the issue: the engine stopped (SIGSTOP), /metrics frozen at 0 running / 0 waiting,
    /health 200. Polls every 2 s: hung at the third poll that sees the engine stopped, 4 s after
    the first, and idle again once it continues."""

    async def go() -> None:
        clock = FakeClock()
        port = free_port()
        server = FakeVllmServer(port=port, version="0.32.0", models=["tiny"], metrics=_capture(IDLE))
        me = os.getpid()
        proc = VllmProcess(pid=me, create_time=clock.now - 30, host="127.0.0.1", port=port, pids=(me, sleeper.pid),
                           engine_pids=(sleeper.pid,))
        src = source(clock, processes=FakeProcessTable([proc]), interval=2.0, probe_timeout=0)
        await server.start(port)
        try:
            before = await _polls(src, clock, 3, 2.0)
            assert [s.state for s in before] == [S.READY, S.IDLE, S.IDLE]
            os.kill(sleeper.pid, signal.SIGSTOP)
            wait_for(lambda: psutil.Process(sleeper.pid).status() == psutil.STATUS_STOPPED, what="the child stopped")
            stopped = await _polls(src, clock, 4, 2.0)
            assert [s.state for s in stopped] == [S.IDLE, S.IDLE, S.HUNG, S.HUNG]
            assert stopped[2].reason == f"engine process {sleeper.pid} stopped (T) for 3 polls"
            assert stopped[2].running == 0 and stopped[2].waiting == 0 and stopped[2].health_status == 200
            assert stopped[2].ts - stopped[0].ts == 4.0  # well within the minute the issue asks
            os.kill(sleeper.pid, signal.SIGCONT)
            wait_for(lambda: psutil.Process(sleeper.pid).status() != psutil.STATUS_STOPPED, what="the child continued")
            (again,) = await _polls(src, clock, 1, 2.0)
            assert again.state is S.IDLE
        finally:
            await src.close()
            await server.stop()

    asyncio.run(go())


def test_uninterruptible_sleep_for_fewer_polls_than_hang_after_is_not_hung():
    """One or two polls in D (a page fault, a driver call) conclude nothing; three in a row do."""
    w = HangWatch(after=3)
    assert [w.engine_stalled({7: s}) for s in ("disk-sleep", "disk-sleep", "sleeping", "disk-sleep")] == [None] * 4
    assert w.engine_stalled({7: "disk-sleep"}) is None
    assert w.engine_stalled({7: "disk-sleep"}) == "engine process 7 in uninterruptible sleep (D) for 3 polls"


class ProbeRig:
    """The fake server serving the recorded idle capture, tracked as a discovered server whose
    process is this test's own (it holds the server's sockets), polled every 2 s of a fake clock."""

    def __init__(self, probe_timeout: float) -> None:
        self.clock = FakeClock()
        self.port = free_port()
        self.server = FakeVllmServer(port=self.port, version="0.32.0", models=["tiny"], metrics=_capture(IDLE))
        me = os.getpid()
        proc = VllmProcess(pid=me, create_time=self.clock.now - 30, host="127.0.0.1", port=self.port, pids=(me,))
        self.src = source(self.clock, processes=FakeProcessTable([proc]), interval=2.0, probe_timeout=probe_timeout)

    @property
    def watch(self) -> HangWatch:
        (srv,) = self.src._servers.values()
        assert srv.hang is not None
        return srv.hang

    async def probe_done(self) -> None:
        """Wait until the probe in flight has its verdict (the condition, not a time)."""
        assert self.watch.probing is not None
        await asyncio.wait_for(asyncio.shield(self.watch.probing), 60)


def _probe_run(probe_timeout: float, test: Any) -> None:
    async def go() -> None:
        rig = ProbeRig(probe_timeout)
        await rig.server.start(rig.port)
        try:
            await test(rig)
        finally:
            await rig.src.close()
            await rig.server.stop()

    asyncio.run(go())


def test_an_unanswered_probe_while_a_client_waits_reads_hung():
    """Idle and flat for 3 scrapes with a client connected: one probe, marked as vgpumon's; its
    deadline passes (the engine never answers) and the server reads hung, saying why."""

    async def t(rig: ProbeRig) -> None:
        rig.server.hang.add("/v1/completions")
        client = _client(rig.port)
        try:
            states = [s.state for s in await _polls(rig.src, rig.clock, 4, 2.0)]
            assert states == [S.READY, S.IDLE, S.IDLE, S.IDLE]
            assert client_connections((os.getpid(),), rig.port) == 1  # the client; the agent's own left out
            await rig.probe_done()
            (hung,) = await _polls(rig.src, rig.clock, 1, 2.0)
        finally:
            client.kill()
            client.wait()
        assert hung.state is S.HUNG
        (rid,) = rig.server.completions
        assert rid.startswith(PROBE_ID_PREFIX)
        assert hung.reason == f"generation probe {rid}: no token within 0.5 s"

    _probe_run(0.5, t)


def test_a_probe_outrun_by_progress_concludes_nothing():
    """The engine resumes while a probe waits behind its backlog: tokens advance, then the probe
    misses its deadline. That late timeout must not mark the server hung (it did, for up to a
    probe interval, after a SIGSTOP/SIGCONT of a real engine)."""

    async def t(rig: ProbeRig) -> None:
        rig.server.hang.add("/v1/completions")
        client = _client(rig.port)
        try:
            await _polls(rig.src, rig.clock, 4, 2.0)
            assert rig.watch.probing is not None and not rig.watch.probing.done()  # the probe waits
            rig.watch.progressed()  # tokens advanced meanwhile: the engine steps
            await rig.probe_done()
            (after,) = await _polls(rig.src, rig.clock, 1, 2.0)
        finally:
            client.kill()
            client.wait()
        assert rig.watch.probe_hung is None
        assert after.state is not S.HUNG, after

    _probe_run(0.5, t)


def test_an_answered_probe_keeps_the_idle_server_idle():
    async def t(rig: ProbeRig) -> None:
        client = _client(rig.port)
        try:
            await _polls(rig.src, rig.clock, 4, 2.0)
            await rig.probe_done()
            after = await _polls(rig.src, rig.clock, 3, 2.0)
        finally:
            client.kill()
            client.wait()
        assert [s.state for s in after] == [S.IDLE] * 3
        assert len(rig.server.completions) == 1  # the next one is due 30 s after this one

    _probe_run(30.0, t)


def test_a_refused_probe_concludes_nothing_and_is_not_sent_again():
    """A server that wants an API key answers the probe 401: still idle, and no second probe
    while the client keeps waiting (40 s more, past the 30 s between probes)."""

    async def t(rig: ProbeRig) -> None:
        rig.server.completions_status = 401
        client = _client(rig.port)
        try:
            await _polls(rig.src, rig.clock, 4, 2.0)
            await rig.probe_done()
            after = await _polls(rig.src, rig.clock, 20, 2.0)
        finally:
            client.kill()
            client.wait()
        assert {s.state for s in after} == {S.IDLE}
        assert len(rig.server.completions) == 1 and rig.watch.probe_off == "/v1/completions answered 401"

    _probe_run(30.0, t)


def test_an_idle_server_nobody_waits_on_is_never_probed():
    async def t(rig: ProbeRig) -> None:
        states = [s.state for s in await _polls(rig.src, rig.clock, 30, 2.0)]
        assert states == [S.READY] + [S.IDLE] * 29
        assert rig.server.completions == [] and rig.watch.probing is None

    _probe_run(10.0, t)


@pytest.mark.parametrize(("cpu_per_poll", "state", "reason"), [
    (1.0, S.BUSY, "engine working, no token counted for 4 scrapes"),  # a long prefill: the engine uses half a core
    (0.0, S.HUNG, "work queued, token counters flat for 4 scrapes"),
])
def test_work_queued_with_flat_counters_is_hung_only_when_the_engine_does_nothing(cpu_per_poll, state, reason):
    """The recorded busy capture (97 running) served unchanged for 5 polls 2 s apart: with the
    engine using CPU it is a long step (prefill counts its tokens when it ends), without it hung."""

    async def go() -> None:
        clock = FakeClock()
        port = free_port()
        server = FakeVllmServer(port=port, version="0.32.0", models=["tiny"], metrics=_capture(BUSY))
        proc = VllmProcess(pid=4242, create_time=clock.now - 30, host="127.0.0.1", port=port, pids=(4242, 4243),
                           engine_pids=(4243,))
        src = source(clock, processes=Scripted([proc], cpu_per_poll), interval=2.0, probe_timeout=0)
        await server.start(port)
        try:
            last = (await _polls(src, clock, 5, 2.0))[-1]
        finally:
            await src.close()
            await server.stop()
        assert (last.state, last.reason) == (state, reason)

    asyncio.run(go())
