"""A private, throwaway Postgres server for the tests that stop, crash or freeze one: started
with the machine's own ``initdb``/``pg_ctl``, on a free port, in a temporary directory."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest


def _pg_bindir() -> Path | None:
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout.strip()
        if (Path(out) / "initdb").exists():
            return Path(out)
    except (OSError, subprocess.CalledProcessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """A throwaway Postgres cluster in a temporary directory, on a free port. Postgres refuses to
    run as root, so as root (CI) every command runs as the ``postgres`` OS user."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="vgpumon-pg-"))
        self.data = self.root / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run(self.as_user + [str(self.bindir / tool), *args], check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.root / "log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def kill(self) -> None:
        """SIGKILL every process of the server at once (an OOM killer, a crashed host): no
        shutdown checkpoint, no goodbye to clients; the next ``start`` recovers from the WAL."""
        pids = self.processes()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in pids):
            if time.monotonic() > deadline:
                raise TimeoutError("Postgres processes still alive 30 s after SIGKILL")
            time.sleep(0.05)

    def destroy(self) -> None:
        try:
            self.thaw()  # a test that failed while the server was frozen
        except (OSError, ValueError):
            pass
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


    def processes(self) -> list[int]:
        """The postmaster's PID and its children's (every backend and helper process)."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == postmaster:
                children.append(int(stat.parent.name))
        return [postmaster, *children]

    def freeze(self) -> None:
        """Stop every process of the server (SIGSTOP): connections stay open and the kernel still
        acknowledges what is sent, but nothing answers — a paused VM, stalled storage."""
        for pid in self.processes():
            os.kill(pid, signal.SIGSTOP)

    def thaw(self) -> None:
        for pid in self.processes():
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
def private_postgres():
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip("no Postgres server binaries (initdb, pg_ctl) on this machine")
    pg = PrivatePostgres(bindir)
    pg.start()
    yield pg
    pg.destroy()


def run_beside(agent: Any, script: Callable[[], None], timeout: float = 120.0) -> None:
    """Run ``agent`` (``vgpumon.agent.Agent``) until ``script``, run on a thread of its own
    meanwhile (stopping, freezing or restarting the server), returns; fail rather than hang
    when the agent does not stop within ``timeout`` seconds after that."""
    stop = asyncio.Event()
    failure: list[BaseException] = []
    finished = threading.Event()

    async def run() -> None:
        loop = asyncio.get_running_loop()

        def drive() -> None:
            try:
                script()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                failure.append(exc)
            finally:
                loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=drive, daemon=True).start()
        await agent.run(stop)

    def main() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # noqa: BLE001
            failure.append(exc)
        finally:
            finished.set()

    threading.Thread(target=main, daemon=True).start()
    assert finished.wait(timeout), "the agent did not stop"
    if failure:
        raise failure[0]


def _state(pid: int) -> str:
    """The process's state as /proc/PID/status names it ("" once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.lower()
    except OSError:
        return ""
    return ""
