"""Finding local vLLM servers in the process table (psutil), and what their processes use.

A server is a process whose command line is ``vllm serve …`` (the console script, also as
``python …/bin/vllm serve``) or ``python -m vllm.entrypoints.openai.api_server …``. Its helper
processes (``VLLM::EngineCore``, ``VLLM::Worker``, extra API servers of
``--api-server-count``) are its descendants; a match whose ancestor is also a match is one of
those and not a server of its own.

Where it is scraped: at a TCP socket the server's own process listens on, never at an address
its command line merely names (any local user can start a process whose argv reads
``vllm serve --host H --port P``; the root agent would GET H:P and take it for a py-spy target).
The process's listening sockets are read through its file descriptors (psutil matches the socket
inodes of ``/proc/<pid>/fd`` against the LISTEN entries of ``/proc/net/tcp`` and ``tcp6``, this
network namespace's). The port is ``--port N`` / ``--port=N`` when given, else the single TCP
port the process listens on, else vLLM's default 8000; it must be one the process listens on,
or the process is not a server to scrape (yet: one still starting is found once it binds). The
address is the socket's own: ``127.0.0.1`` (``::1``) for a socket bound to every IPv4 (IPv6)
address, else the address it is bound to (``--host`` picks among several). Servers on a Unix
socket (``--uds``) are not scraped. Decisions: docs/security.md, "What the agent trusts".

Engine processes: the descendants that do the serving, whose loss leaves an API process that may
go on answering ``/health`` 200 (always in 0.2.x and V1 0.8.x, FACTS §5) while nothing can be
served. vLLM titles them (setproctitle): ``VLLM::EngineCore``, ``VLLM::Worker…``,
``VLLM::DPCoordinator`` (0.32.0 shows the first two). Builds that set no title start them with
Python ``multiprocessing``: a spawned child runs ``… spawn_main(…) --multiprocessing-fork``, a
forked one keeps the server's own command line. The multiprocessing resource tracker is not one.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

import psutil

log = logging.getLogger(__name__)

DEFAULT_PORT = 8000
_API_MODULE = "vllm.entrypoints.openai.api_server"
_WILDCARD = {"", "0.0.0.0", "::", "[::]"}  # noqa: S104  the wildcard addresses vLLM may listen on, recognised, not bound


@dataclass(frozen=True, slots=True)
class VllmProcess:
    """A vLLM server found in the process table.

    Attributes:
        pid: the server's (API server's) process id.
        create_time: its start time, epoch seconds (``psutil.Process.create_time()``); with the
            pid it identifies one start of the server.
        host: address to scrape: the one its listening socket is bound to (``127.0.0.1`` or
            ``::1`` for a wildcard bind), never one its command line merely names.
        port: HTTP port, one its process listens on.
        pids: the server and all its descendants (engine cores, workers), for the GPU mapping
            and the RSS/CPU figures.
        cmdline: the command line, for display.
        engine_pids: the descendants that are engine processes (see module docstring) and are
            alive (zombies left out), for "engine lost".
        listening: the process listens where ``host``/``port`` say. ``False``: a server still
            starting, not listening yet; ``host``/``port`` are then only its command line's claim,
            never asked: it is tracked as starting (its prewarm counts from its start) and
            scraped, or traced, only once its own socket proves the address.
    """

    pid: int
    create_time: float
    host: str
    port: int
    pids: tuple[int, ...]
    cmdline: tuple[str, ...] = ()
    engine_pids: tuple[int, ...] = ()
    listening: bool = True


@dataclass(frozen=True, slots=True)
class ProcessUsage:
    """Resource use of a set of processes at one moment.

    Attributes:
        rss_bytes: resident set size summed over the processes that still exist.
        cpu_seconds: pid → user + system CPU seconds since that process started.
    """

    rss_bytes: int
    cpu_seconds: Mapping[int, float]


class ProcessTable(Protocol):
    """What the vLLM source needs from the host's process table (injected; psutil by default)."""

    def scan(self) -> Sequence[VllmProcess]:
        """Every vLLM server on the host now."""

    def usage(self, pids: Sequence[int]) -> ProcessUsage | None:
        """RSS and CPU time of these processes; ``None`` when none can be read."""


def _arg(cmdline: Sequence[str], name: str) -> str | None:
    for i, a in enumerate(cmdline):
        if a == name and i + 1 < len(cmdline):
            return cmdline[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def is_vllm_server(cmdline: Sequence[str]) -> bool:
    """``vllm serve …`` or ``python -m vllm.entrypoints.openai.api_server …``."""
    if not cmdline:
        return False
    for i, a in enumerate(cmdline):
        if a == "-m" and i + 1 < len(cmdline) and cmdline[i + 1] == _API_MODULE:
            return True
        if os.path.basename(a) == "vllm" and i + 1 < len(cmdline) and cmdline[i + 1] == "serve":
            return True
    return False


def is_engine_process(name: str, cmdline: Sequence[str]) -> bool:
    """Whether a descendant of a vLLM server is one of its engine processes (module docstring).

    Args:
        name: the process name (``comm``, 15 characters; ``VLLM::EngineCor`` for a titled one).
        cmdline: its arguments as ``/proc/<pid>/cmdline`` shows them (the title, once set).
    """
    first = cmdline[0] if cmdline else ""
    if name.startswith("VLLM::") or first.startswith("VLLM::"):
        return True
    joined = " ".join(cmdline)
    if "multiprocessing.resource_tracker" in joined or "multiprocessing.forkserver" in joined:
        return False
    if "spawn_main" in joined or "--multiprocessing-fork" in cmdline:
        return True
    return is_vllm_server(cmdline)


def port_and_host(cmdline: Sequence[str], listening: Sequence[int] = ()) -> tuple[str, int]:
    """Where the command line says the server answers HTTP (see module docstring): a claim,
    checked against the process's sockets by ``verified_address`` before anything is sent there.

    Args:
        cmdline: the process's arguments.
        listening: TCP ports the process listens on (used only without ``--port``).
    """
    host = _arg(cmdline, "--host") or ""
    host = "127.0.0.1" if host in _WILDCARD else host
    port_arg = _arg(cmdline, "--port")
    if port_arg and port_arg.isdigit():
        return host, int(port_arg)
    ports = sorted(set(listening))
    if len(ports) == 1:
        return host, ports[0]
    return host, DEFAULT_PORT


def _plain_ip(ip: str) -> str:
    """An IPv4-mapped IPv6 address (``::ffff:10.0.0.5``, as a dual-stack socket shows an IPv4
    bind) as its IPv4 address; any other as it is."""
    return ip[7:] if ip.lower().startswith("::ffff:") and "." in ip else ip


def verified_address(cmdline: Sequence[str], listening: Sequence[tuple[str, int]]) -> tuple[str, int] | None:
    """The address to scrape a server at, taken from the sockets its process listens on, or
    ``None`` when it listens on none of the port its command line names (module docstring).

    Args:
        cmdline: the process's arguments (``--port``, and ``--host`` to choose among addresses).
        listening: ``(ip, port)`` of each TCP socket the process listens on.
    """
    ports = [port for _, port in listening]
    _, port = port_and_host(cmdline, ports)
    ips = {_plain_ip(ip) for ip, p in listening if p == port}
    if not ips:
        return None
    if "0.0.0.0" in ips or "" in ips:  # noqa: S104  a bind to every IPv4 address, recognised, not bound
        return "127.0.0.1", port
    if "::" in ips:
        return "::1", port
    loopback = sorted(ip for ip in ips if ip.startswith("127.") or ip == "::1")
    if loopback:
        return loopback[0], port
    named = _plain_ip((_arg(cmdline, "--host") or "").strip("[]"))
    return (named if named in ips else sorted(ips)[0]), port


def listening_sockets(process: psutil.Process) -> list[tuple[str, int]]:
    """``(ip, port)`` of each TCP socket ``process`` itself listens on (IPv4 and IPv6), read
    through its file descriptors; empty when there are none or they cannot be read (another
    user's process, for an agent without root): an unverified server is not scraped.
    """
    try:
        conns = process.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    return [(c.laddr.ip, c.laddr.port) for c in conns if c.status == psutil.CONN_LISTEN and c.laddr]


def _raw_cmdline(pid: int) -> bytes | None:
    """``/proc/<pid>/cmdline`` as bytes (one read, no parsing); ``None`` where it cannot be read."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return None


def _last_pid() -> int | None:
    """The PID most recently given out in this PID namespace (``/proc/loadavg``'s fifth field,
    changed by every fork and thread), or ``None`` where it cannot be read or reads 0 (procfs
    emulations that do not keep it)."""
    try:
        with open("/proc/loadavg", "rb") as f:
            pid = int(f.read().split()[4])
    except (OSError, ValueError, IndexError):
        return None
    return pid or None


def _last_pid_usable() -> bool:
    """Whether ``/proc/loadavg``'s last PID speaks for the processes ``/proc`` lists: ``/proc``
    is this process's own PID namespace's (its ``self`` is this PID: not a host's procfs seen
    from inside another namespace, whose forks would not move this namespace's counter), and
    nothing is mounted over ``/proc/loadavg`` (LXCFS serves a container's own figures there)."""
    try:
        if os.readlink("/proc/self") != str(os.getpid()):
            return False
        with open("/proc/self/mountinfo") as f:
            return not any(line.split()[4:5] == ["/proc/loadavg"] for line in f)
    except OSError:
        return False


class PsutilProcessTable:
    """The host's process table through psutil (needs no privileges for the user's own
    processes; root sees every server).

    Reading every process's command line at each poll is most of the agent's CPU on a busy host,
    so a PID's verdict ("a vLLM server or not") is remembered while the PID lives and only new
    PIDs are read. Two cases make a remembered "no" wrong, and each is looked at again:

    * a wrapper that ``exec``s the server under its own PID (an entrypoint script that prepares
      for a few seconds, then ``exec vllm serve``): the raw command line of every process
      younger than ``young_s`` is read again at each scan (one small read; a change means an
      ``exec``), so such a server is found at the first scan after its ``exec``;
    * a PID recycled between two scans: the whole table is read again every ``full_every_s``
      seconds.

    While no server exists, a scan first reads the PID the kernel gave out last
    (``/proc/loadavg``): unchanged since the previous scan means no process (nor thread) was
    created since, so only the young processes' command lines are read again (an ``exec``)
    and the table is not listed. That is an idle GPU host's whole discovery cost. The shortcut
    is taken only once that PID has been seen to move (a procfs that never updates it is
    listed every time), and only where ``/proc`` is this process's own PID namespace's and
    nothing is mounted over ``/proc/loadavg`` (``_last_pid_usable``).

    Args:
        young_s: processes started less than this many seconds ago are read at every scan.
        full_every_s: seconds between two full reads of the process table.
        clock: epoch-seconds clock (``time.time``; process start times are epoch seconds).
    """

    def __init__(self, young_s: float = 120.0, full_every_s: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.young_s = young_s
        self.full_every_s = full_every_s
        self.clock = clock
        # pid → (a server, process start, raw command line of a non-server: an exec changes it)
        self._verdict: dict[int, tuple[bool, float, bytes | None]] = {}
        self._engine_verdict: dict[tuple[int, float], bool] = {}  # (pid, start) → engine process
        self._last_full: float | None = None
        self._last_pid: int | None = None
        self._last_pid_moves = False
        self._last_pid_usable = _last_pid_usable()
        self._found_none = False
        self._address_of: dict[tuple[int, float], tuple[str, int]] = {}  # (pid, start) → verified address
        self._unverified: set[tuple[int, float]] = set()  # servers already logged as not listening

    def _engines(self, tree: Sequence[psutil.Process]) -> tuple[int, ...]:
        """The live engine processes among a server's descendants; a command line is read once
        per process start, the state (zombie or not) every scan."""
        out = []
        for q in tree:
            try:
                with q.oneshot():
                    if q.status() == psutil.STATUS_ZOMBIE:
                        continue  # killed, not yet reaped by the API process: gone for serving
                    key = (q.pid, q.create_time())
                    verdict = self._engine_verdict.get(key)
                    if verdict is None:
                        verdict = self._engine_verdict[key] = is_engine_process(q.name(), q.cmdline())
            except psutil.Error:
                continue
            if verdict:
                out.append(q.pid)
        return tuple(out)

    def _nothing_new(self, now: float, last_pid: int | None) -> bool:
        """No process created since the previous scan, which found no server, and every young
        process still the program it was: this scan would find nothing either."""
        if (last_pid is None or not self._last_pid_usable or not self._found_none or not self._last_pid_moves
                or last_pid != self._last_pid):
            return False
        young = now - self.young_s
        return all(
            _raw_cmdline(pid) == raw
            for pid, (server, started, raw) in self._verdict.items()
            if not server and started >= young
        )

    def scan(self) -> list[VllmProcess]:
        now = self.clock()
        full = self._last_full is None or now - self._last_full >= self.full_every_s
        last_pid = _last_pid()  # before the listing: a process forked during it moves it again
        if not full and self._nothing_new(now, last_pid):
            return []
        self._last_pid_moves |= last_pid is not None and self._last_pid is not None and last_pid != self._last_pid
        self._last_pid = last_pid
        out = self._scan(now, full)
        self._found_none = not out
        return out

    def _scan(self, now: float, full: bool) -> list[VllmProcess]:
        pids = psutil.pids()
        if full:
            self._last_full = now
            self._verdict = {}
            self._address_of = {}  # a server's sockets are read again at each full read
            self._unverified = set()  # and one still not listening is logged again
        else:
            live = set(pids)
            self._verdict = {pid: v for pid, v in self._verdict.items() if pid in live}
        young = now - self.young_s
        found: dict[int, psutil.Process] = {}
        for pid in pids:
            known = self._verdict.get(pid)
            if known is not None and not known[0]:
                if known[1] < young:
                    continue  # an old process that is not a server
                raw = _raw_cmdline(pid)
                if raw is not None and raw == known[2]:
                    continue  # a young one, still the program it was (no exec since)
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue  # exited, not yet reaped by its parent: gone for us
                    argv = p.cmdline()
                    started = p.create_time() if known is None else known[1]
                p.info = {"cmdline": argv}
                server = is_vllm_server(argv or ())
                self._verdict[pid] = (server, started, None if server else _raw_cmdline(pid))
                if server:
                    found[pid] = p
            except (psutil.Error, TypeError):
                continue
        out = []
        engine_keys: set[tuple[int, float]] = set()
        for pid, p in found.items():
            try:
                if any(a.pid in found for a in p.parents()):
                    continue  # an extra API server or a helper of a server we already have
                cmdline = tuple(p.info["cmdline"] or ())
                children = p.children(recursive=True)
                tree = [p] + children
                engines = self._engines(children)
                address = self._address(p, cmdline)
                # not listening (yet) where its command line says: a server starting (vLLM loads
                # before it listens), tracked as such, never asked, nor traced
                host, port = address if address is not None else port_and_host(cmdline)
                out.append(
                    VllmProcess(
                        pid=pid, create_time=p.create_time(), host=host, port=port,
                        pids=tuple(q.pid for q in tree), cmdline=cmdline, engine_pids=engines,
                        listening=address is not None,
                    )
                )
                engine_keys.update(k for k in self._engine_verdict if k[0] in {q.pid for q in children})
            except psutil.Error:
                continue  # exited while we looked
        self._engine_verdict = {k: v for k, v in self._engine_verdict.items() if k in engine_keys}
        live_servers = {(v.pid, v.create_time) for v in out}
        self._address_of = {k: a for k, a in self._address_of.items() if k in live_servers}
        return out

    def _address(self, p: psutil.Process, cmdline: Sequence[str]) -> tuple[str, int] | None:
        """Where to scrape server ``p``: its verified listening address (``verified_address``),
        read once per process start and again at every full read; a process not (yet)
        listening where its command line says is read again at each scan, and logged once."""
        key = (p.pid, p.create_time())
        known = self._address_of.get(key)
        if known is not None:
            return known
        address = verified_address(cmdline, listening_sockets(p))
        if address is None:
            if key not in self._unverified:
                self._unverified.add(key)
                claimed = port_and_host(cmdline)
                log.info("pid %d runs as a vLLM server but listens on no TCP port %d yet: starting, not scraped until it does",
                         p.pid, claimed[1])
            return None
        self._unverified.discard(key)
        self._address_of[key] = address
        return address

    def usage(self, pids: Sequence[int]) -> ProcessUsage | None:
        rss = 0
        cpu: dict[int, float] = {}
        for pid in pids:
            try:
                p = psutil.Process(pid)
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:
                        continue
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    cpu[pid] = t.user + t.system
            except psutil.Error:
                continue
        return ProcessUsage(rss_bytes=rss, cpu_seconds=cpu) if cpu else None


class NoProcesses:
    """A process table that finds nothing (static targets only)."""

    def scan(self) -> list[VllmProcess]:
        return []

    def usage(self, pids: Sequence[int]) -> ProcessUsage | None:
        return None
