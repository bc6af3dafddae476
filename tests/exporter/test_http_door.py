"""The agent's HTTP door against a slowloris client: connections that dribble their headers a byte
at a time are closed after the header deadline, an idle keep-alive connection after its timeout,
and while such a client holds more connections than the cap, a scrape of ``/metrics`` is still
answered; each connection closed unanswered is counted
(``vgpumon_agent_http_connections_closed_total{reason}``)."""

from __future__ import annotations

import re
import select
import socket
import threading
import time
from collections.abc import Callable

import pytest
from api_support import ServingAgent, get
from conftest import H200_CAPTURE

from vgpumon.sources.nvml.capture import ReplayBackend

pytestmark = pytest.mark.slow  # starts servers: not in the quick subset (docs/testing.md)

CAP = 8
HELD = 3 * CAP  # the slowloris client's connections: more than the cap


def _closed(sock: socket.socket) -> bool:
    """True once the server has closed ``sock`` (a FIN read as end of file, or a reset)."""
    if not select.select([sock], [], [], 0)[0]:
        return False  # nothing to read: not closed (a socket's timeout would make recv wait)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _wait_for(condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``condition`` until it holds (at most ``within`` seconds); the seconds it took."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > within:
            raise AssertionError(f"{what}: not within {within} s")
        time.sleep(0.02)
    return time.monotonic() - start


class Slowloris:
    """``n`` connections to ``port``, each sending a request line and then one byte of a header
    that never ends every ``every`` seconds, until the server closes it (``with`` stops it)."""

    def __init__(self, port: int, n: int, every: float = 0.2) -> None:
        self.socks: list[socket.socket] = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: agent\r\nX-Dribble: ")
            self.socks.append(s)
        self.every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._dribble, name="slowloris", daemon=True)

    def __enter__(self) -> "Slowloris":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.socks:
            s.close()

    def _dribble(self) -> None:
        while not self._stop.wait(self.every):
            for s in self.open():
                try:
                    s.send(b"a")
                except OSError:
                    pass

    def open(self) -> list[socket.socket]:
        return [s for s in self.socks if not _closed(s)]


def _closed_total(exposition: str, reason: str) -> float:
    m = re.search(r'^vgpumon_agent_http_connections_closed_total\{[^}]*reason="' + reason + r'"[^}]*\} (\S+)$',
                  exposition, re.M)
    assert m is not None, f"no vgpumon_agent_http_connections_closed_total{{reason={reason!r}}} in /metrics"
    return float(m.group(1))


def _request(sock: socket.socket, path: str = "/healthz") -> bytes:
    """One keep-alive request on ``sock`` and its whole answer (by its Content-Length)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n".encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection before answering: {answer!r}"
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
    while len(body) < length:
        body += sock.recv(65536)
    return head


def test_a_scrape_is_answered_while_a_slowloris_client_holds_more_connections_than_the_cap(tmp_path):
    """Before, aiohttp took every connection and gave none a deadline (its keep-alive close time,
    3630 s, was the only one): the slowloris connections were all held, none was counted."""
    door = {"header_timeout": 60.0, "max_connections": CAP}  # the deadline far: the connections stay held
    with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE), exporter=door) as agent:
        assert agent.port is not None
        with Slowloris(agent.port, HELD) as client:
            # the server sheds the oldest dribbling connections to keep at most CAP open
            _wait_for(lambda: len(client.open()) <= CAP, 10, f"{HELD} dribbling connections held down to {CAP}")
            status, headers, body = get(f"{agent.base}/metrics")
            assert status == 200, body
            assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert re.search(r'^vgpumon_gpu_up\{gpu="0",.*\} ', body, re.M), body[:2000]
            # the scrape got in while the client still held the cap's worth less one (the one
            # closed to make room for the scrape)
            assert len(client.open()) >= CAP - 1
            assert _closed_total(body, "limit") >= HELD - CAP + 1
            assert _closed_total(body, "header_deadline") == 0


def test_dribbled_headers_are_closed_after_the_header_deadline(tmp_path):
    """Before, a connection dribbling its headers was held until aiohttp's keep-alive close time
    (3630 s after its accept): this test saw none closed within its bound."""
    deadline = 1.0
    with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE),
                      exporter={"header_timeout": deadline}) as agent:
        assert agent.port is not None
        with Slowloris(agent.port, 10) as client:
            took = _wait_for(lambda: not client.open(), 15 * deadline, "dribbling connections closed by the server")
            assert took >= deadline * 0.5, f"closed after {took:.2f} s: not by the deadline"
        status, _, body = get(f"{agent.base}/metrics")
        assert status == 200
        assert _closed_total(body, "header_deadline") >= 10
        assert _closed_total(body, "limit") == 0


def test_a_keep_alive_connection_idles_out_and_a_later_request_has_the_header_deadline(tmp_path):
    """A connection that was answered and then idles is closed after the keep-alive timeout; one
    that was answered and then dribbles its next request's headers is closed the header deadline
    after that request's first byte, before the keep-alive timeout. Before, both were held for
    aiohttp's 3630 s."""
    header, keepalive = 1.0, 6.0
    with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE),
                      exporter={"header_timeout": header, "keepalive_timeout": keepalive}) as agent:
        assert agent.port is not None
        idle = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        dribbler = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        silent = socket.create_connection(("127.0.0.1", agent.port), timeout=5)
        try:
            assert _request(idle).startswith(b"HTTP/1.1 200")
            assert _request(dribbler).startswith(b"HTTP/1.1 200")
            answered = time.monotonic()
            # a connection that sends nothing has the header deadline from its accept; the two
            # answered ones, opened before it, are past theirs and are kept (keep-alive)
            _wait_for(lambda: _closed(silent), 10 * header, "a connection that sent nothing closed")
            assert not _closed(dribbler), "an answered connection closed before its keep-alive timeout"
            dribbler.sendall(b"GET /healthz HTTP/1.1\r\nHost: agent\r\nX-Dribble: a")
            _wait_for(lambda: _closed(dribbler), 10 * header, "the dribbled second request closed")
            assert not _closed(idle), "the idle connection closed before its keep-alive timeout"
            _wait_for(lambda: _closed(idle), keepalive * 3, "the idle keep-alive connection closed")
            assert time.monotonic() - answered >= keepalive * 0.9
        finally:
            for s in (idle, dribbler, silent):
                s.close()
        status, _, body = get(f"{agent.base}/metrics")
        assert status == 200
        assert _closed_total(body, "header_deadline") >= 2
        assert _closed_total(body, "idle") >= 1


def test_at_the_cap_the_oldest_waiting_connection_makes_room_and_else_the_new_one_is_refused():
    """``_Door.admit`` alone: the oldest connection that waits for a request is closed for a new
    one; when every connection is being answered, the new one is refused; each counted."""
    from unittest import mock

    from vgpumon.exporter import ExporterConfig
    from vgpumon.exporter.server import _Door, _JsonErrors

    def conn(waiting: bool) -> mock.Mock:
        c = mock.Mock(spec=_JsonErrors)
        c.held.return_value, c.waiting.return_value = True, waiting
        return c

    closed: dict[str, int] = {}
    door = _Door(ExporterConfig(max_connections=3), closed)
    busy, old, young = conn(False), conn(True), conn(True)
    assert door.admit(mock.Mock(connections=[busy, old]))  # under the cap
    assert door.admit(mock.Mock(connections=[busy, old, young]))
    old.force_close.assert_called_once_with()
    young.force_close.assert_not_called()
    assert closed == {"limit": 1}
    assert not door.admit(mock.Mock(connections=[busy, conn(False), conn(False)]))  # every one answering
    assert not door.admit(None)


def test_an_aiohttp_without_the_door_hooks_still_serves_and_says_so(tmp_path, monkeypatch, caplog):
    """The door works through private parts of aiohttp's connection handler: an aiohttp without
    them (another version) serves the scrape as before, and the agent says the limits are off."""
    from vgpumon.exporter import server

    monkeypatch.setattr(server, "_DOOR_HOOKS", False)
    with ServingAgent(f"sqlite:///{tmp_path / 'a.db'}", ReplayBackend(H200_CAPTURE)) as agent:
        status, _, body = get(f"{agent.base}/metrics")
    assert status == 200 and "vgpumon_agent_http_connections_closed_total" in body
    assert any("no header deadline and no connection cap" in r.getMessage() for r in caplog.records)
