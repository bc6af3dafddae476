"""Discovery trusts a process's sockets, not its arguments: any local user can start a process
whose command line reads ``vllm serve --host H --port P``. The root agent used to send its GETs
to H:P and make the process a py-spy target. Now a server is scraped only at an address its own
process listens on (its file descriptors' sockets), and only such a server's processes are the
ones ``diagnose --stacks`` may dump. Real processes here, and a real fake server's sockets."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest
from vllm_support import ServerThread, shared_dir, source

from vgpumon.model.vllm import ServerState
from vgpumon.sources.vllm.discovery import PsutilProcessTable, verified_address
from vgpumon.testing.vllm import FakeClock, FakeVllmServer, free_port

# A process that only claims to be a vLLM server: its argv names the address, it listens nowhere.
_LIAR = "import sys, time\nprint('up', flush=True)\ntime.sleep(600)\n"

# The project's fake vLLM server run as a process of its own, ``vllm serve m --host H --port P``,
# answering the recorded vLLM 0.32 idle scrape where its command line says it does.
_HONEST = textwrap.dedent(
    """
    import asyncio, sys
    from pathlib import Path
    from vgpumon.testing.vllm import FakeVllmServer

    async def main():
        port = int(sys.argv[sys.argv.index("--port") + 1])
        server = FakeVllmServer(metrics=Path(sys.argv[-1]).read_text(), version="0.32.0", models=["m"])
        await server.start(port)
        print("up", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def _start(tmp_path: Path, name: str, body: str, *args: str) -> subprocess.Popen[str]:
    """``python <tmp>/<name>/vllm serve m …``: a process the agent's discovery takes for a vLLM
    server by its command line; returns once it says it is up."""
    (tmp_path / name).mkdir()
    script = tmp_path / name / "vllm"
    script.write_text(body)
    proc = subprocess.Popen([sys.executable, str(script), "serve", "m", *args], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    return proc


def _stop(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        p.kill()
        p.wait(10)


def _poll(table: PsutilProcessTable, polls: int = 3):
    """``polls`` polls of a vLLM source that discovers through ``table``: the samples, the
    processes it would let ``diagnose --stacks`` dump, and the URL of every request it sent
    (its own session's: other programs on the machine may scan and scrape too)."""
    import aiohttp

    sent: list[str] = []

    async def on_start(_session, _ctx, params) -> None:
        sent.append(str(params.url))

    async def run():
        trace = aiohttp.TraceConfig()
        trace.on_request_start.append(on_start)
        async with aiohttp.ClientSession(trace_configs=[trace]) as session:
            src = source(FakeClock(), processes=table, session=session)
            out = []
            try:
                for _ in range(polls):
                    out.extend(await src.poll())
            finally:
                await src.close()
            return out, src.discovered()

    samples, discovered = asyncio.run(run())
    return samples, discovered, sent


def test_a_process_whose_argv_names_an_address_it_does_not_listen_on_gets_no_request(tmp_path):
    """A server answers on 127.0.0.1:P in some other process (this test's fake, which no argv
    names); a local user's process claims ``vllm serve --host 127.0.0.1 --port P``, another
    claims a remote host. Both are listed as not listening, read as starting servers that are
    never asked: the source sends no request to P (nor to the remote host), nothing is a py-spy
    target."""
    servers = ServerThread()
    try:
        fake = servers.start(FakeVllmServer(metrics="", version="0.32.0", models=["m"]))
        local = _start(tmp_path, "local", _LIAR, "--host", "127.0.0.1", "--port", str(fake.port))
        remote = _start(tmp_path, "remote", _LIAR, "--host", "192.0.2.7", "--port", str(fake.port))
        try:
            table = PsutilProcessTable()
            listed = {p.pid: p for p in table.scan()}
            samples, discovered, sent = _poll(table)
        finally:
            _stop(local, remote)
    finally:
        servers.close()
    assert not listed[local.pid].listening and not listed[remote.pid].listening
    assert [u for u in sent if f":{fake.port}/" in u] == []
    assert [u for u in sent if "192.0.2.7" in u] == []
    theirs = [s for s in samples if s.instance.pid in (local.pid, remote.pid)]
    assert theirs and all(s.state is ServerState.STARTING and "not listening" in (s.reason or "") for s in theirs), theirs
    assert all(p.pid not in (local.pid, remote.pid) for p in discovered.values())


def test_a_server_listening_where_its_argv_says_is_scraped_there_and_only_it(tmp_path):
    """The fake vLLM server run as ``vllm serve m --host 127.0.0.1 --port P``, listening there:
    found, scraped (the recorded scrape's model and version reach its sample), its pid the one
    ``--stacks`` may dump. A liar naming the same port beside it changes nothing."""
    port = free_port()
    idle = shared_dir("fixtures", "vllm-real") / "vllm-0.32.0-cpu__idle.txt"
    honest = _start(tmp_path, "honest", _HONEST, "--host", "127.0.0.1", "--port", str(port), str(idle))
    liar = _start(tmp_path, "liar", _LIAR, "--host", "127.0.0.1", "--port", str(port))
    try:
        table = PsutilProcessTable()
        scanned = [p for p in table.scan() if p.pid in (honest.pid, liar.pid)]
        (found,) = [p for p in scanned if p.listening]
        assert [p.pid for p in scanned if not p.listening] == [liar.pid]
        samples, discovered, sent = _poll(table)
    finally:
        _stop(honest, liar)
    assert (found.pid, found.host, found.port) == (honest.pid, "127.0.0.1", port)
    mine = [s for s in samples if s.instance.pid == honest.pid]
    assert mine and all(s.instance.url == f"http://127.0.0.1:{port}" for s in mine)
    assert f"http://127.0.0.1:{port}/metrics" in sent
    assert mine[-1].version == "0.32.0" and mine[-1].telemetry == "full", mine[-1]
    assert {p.pid for p in discovered.values()} & {honest.pid, liar.pid} == {honest.pid}


def test_a_server_found_before_it_listens_is_scraped_once_it_does(tmp_path):
    """vLLM imports for seconds before it binds its port: until then it is listed as not
    listening (a starting server, never asked, nor logged each scan), and the first scan after it
    binds finds where it listens."""
    port = free_port()
    waiting = textwrap.dedent(
        """
        import socket, sys, time
        print("up", flush=True)
        sys.stdin.readline()
        s = socket.create_server(("0.0.0.0", int(sys.argv[sys.argv.index("--port") + 1])))
        print("listening", flush=True)
        time.sleep(600)
        """
    )
    (tmp_path / "w").mkdir()
    script = tmp_path / "w" / "vllm"
    script.write_text(waiting)
    proc = subprocess.Popen([sys.executable, str(script), "serve", "m", "--host", "203.0.113.9", "--port", str(port)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "up"
        table = PsutilProcessTable(full_every_s=3600)
        before = [p for p in table.scan() if p.pid == proc.pid]
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "listening"
        after = [(p.host, p.port) for p in table.scan() if p.pid == proc.pid]
    finally:
        _stop(proc)
    assert [p.listening for p in before] == [False]
    # bound to every address: scraped on loopback, not at the address its argv names
    assert after == [("127.0.0.1", port)]


@pytest.mark.parametrize(
    "argv,listening,address",
    [
        (["--port", "8001"], [("127.0.0.1", 8001), ("127.0.0.1", 41233)], ("127.0.0.1", 8001)),
        (["--port", "8001"], [("127.0.0.1", 41233)], None),  # not where it says
        (["--host", "10.0.0.5", "--port", "8001"], [("0.0.0.0", 8001)], ("127.0.0.1", 8001)),  # noqa: S104
        (["--port", "8001"], [("::", 8001)], ("::1", 8001)),
        (["--port", "8001"], [("::ffff:10.0.0.5", 8001)], ("10.0.0.5", 8001)),
        (["--host", "10.0.0.6", "--port", "8001"], [("10.0.0.5", 8001), ("10.0.0.6", 8001)], ("10.0.0.6", 8001)),
        (["--host", "192.0.2.7", "--port", "8001"], [("10.0.0.5", 8001)], ("10.0.0.5", 8001)),  # its socket's address
        ([], [("127.0.0.1", 8555)], ("127.0.0.1", 8555)),  # no --port: its one port
        ([], [("127.0.0.1", 8000), ("127.0.0.1", 41233)], ("127.0.0.1", 8000)),  # several: vLLM's default
        ([], [], None),
    ],
)
def test_the_address_scraped_is_one_the_process_listens_on(argv, listening, address):
    assert verified_address(["vllm", "serve", "m", *argv], listening) == address


def test_the_sockets_of_a_process_are_read_from_its_descriptors():
    """This test process listens on a port: its sockets list it; a child that listens on
    nothing lists nothing."""
    import socket

    from vgpumon.sources.vllm.discovery import listening_sockets

    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]
        assert ("127.0.0.1", port) in listening_sockets(psutil.Process())
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            assert listening_sockets(psutil.Process(child.pid)) == []
        finally:
            _stop(child)
