"""`vgpumon top` in a real terminal (tmux, 80 × 24) on an agent replaying the 8-GPU incident with
a vLLM server beside it (a fake server at the process edge, serving a recorded vLLM 0.32 scrape):
every GPU row and the vLLM row on one screen, the lost GPU said as such, q quits with 0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import DATA, VGPUMON, nvml_present, wait_for
from vllm_support import ServerThread

from vgpumon.testing import incident
from vgpumon.testing.vllm import FakeVllmServer, free_port

pytestmark = [
    pytest.mark.slow,  # starts an agent and a terminal: not in the quick subset (docs/testing.md)
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux to run the view in a terminal"),
]

BUSY = DATA / "vllm-real" / "vllm-0.32.0-cpu__busy.txt"


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}


@pytest.fixture
def agent(tmp_path: Path):
    """An agent replaying the incident at its recorded pace (ticks 0.5 s apart), scraping one vLLM
    server, its API on a port of its own; yields ``(port, vllm_port)``."""
    servers = ServerThread()
    vllm = servers.start(FakeVllmServer(metrics=BUSY.read_text(), version="0.32.0", models=["tiny"]))
    capture = incident.write(DATA, tmp_path / "incident.jsonl.gz", tick_seconds=0.5)
    port = free_port()
    proc = subprocess.Popen(VGPUMON + ["agent", "--replay", str(capture), "--pace", "recorded", "--shift-to-now", "--hostname", "sick",
                                       "--db", str(tmp_path / "s.db"), "--spool", str(tmp_path / "spool"), "--listen", f"127.0.0.1:{port}",
                                       "--vllm-url", vllm.url, "--vllm-interval", "1s"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    try:
        yield port, vllm.port
    finally:
        proc.terminate()
        proc.wait(60)
        servers.close()


class Terminal:
    """A tmux server of the test's own (its own socket), one 80 × 24 window."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = f"vgpumon-top-{os.getpid()}"
        self.tmp = tmp_path

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30, check=True).stdout

    def start(self, command: list[str]) -> None:
        script = self.tmp / "run.sh"
        env = " ".join(f"{k}={shlex_quote(v)}" for k, v in _env().items() if k in ("PATH", "HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH"))
        script.write_text(f"cd {shlex_quote(str(Path.cwd()))}\nenv {env} TERM=xterm-256color {' '.join(map(shlex_quote, command))}\n"
                          "echo EXITED $?\nsleep 600\n")
        self.tmux("new-session", "-d", "-x", "80", "-y", "24", "sh", str(script))

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p")

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=30)


def shlex_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


@pytest.fixture
def terminal(tmp_path: Path):
    t = Terminal(tmp_path)
    try:
        yield t
    finally:
        t.close()


def _gpu_rows(screen: str) -> dict[int, str]:
    return {int(m.group(1)): line for line in screen.splitlines() if (m := re.match(r"^\s*(\d)\s{2,}", line))}


def test_top_shows_every_gpu_and_the_vllm_server_at_80_columns_and_quits_on_q(agent, terminal):
    port, vllm_port = agent
    terminal.start([*VGPUMON, "top", f"127.0.0.1:{port}"])

    def complete() -> bool:
        screen = terminal.screen()
        rows = _gpu_rows(screen)
        return len(rows) == 8 and "DOWN" in rows[5] and f"127.0.0.1:{vllm_port}" in screen

    # all eight GPUs, GPU 5 after the XID 79 that took it off the bus (tick 45), and the server
    wait_for(complete, timeout=120, what="every GPU row, GPU 5 down, and the vLLM row")
    screen = terminal.screen()
    assert screen.splitlines()[0].startswith("sick — 8 GPUs, tick ")
    rows = _gpu_rows(screen)
    assert "DOWN: GPU is lost" in rows[5]
    for i in (0, 1, 2, 3, 4, 6, 7):
        assert re.search(r"\d+%\s+\d+%\s+\d+\.\d/140G\s+\d+/\d+\s+\d+\s+\d+", rows[i]), rows[i]  # SM, util, memory, TX/RX, W, °C
    server = next(line for line in screen.splitlines() if f"127.0.0.1:{vllm_port}" in line)
    assert re.search(r"tiny\s+\w+\s+97/0\s+2%", server), server  # the recorded scrape: 97 running, 0 waiting, KV 2 %
    assert "GPU  SM  util" in screen and "vLLM server" in screen
    terminal.tmux("send-keys", "q")
    wait_for(lambda: "EXITED 0" in terminal.screen(), timeout=30, what="top to quit on q with 0")


def test_top_once_on_an_unreachable_agent_is_one_line_and_exit_69():
    port = free_port()
    out = subprocess.run(VGPUMON + ["top", f"127.0.0.1:{port}", "--once"], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 69
    assert out.stderr == (f"vgpumon: top: the agent at 127.0.0.1:{port} is unreachable (connection refused); "
                          "is `vgpumon agent` running?\n")


@pytest.mark.skipif(nvml_present(), reason="this host has an NVIDIA driver: top reads NVML in place of the agent")
def test_top_on_this_host_with_neither_an_agent_nor_nvml_names_both(tmp_path):
    """No HOST: this host's agent, else NVML here; with neither, one line naming both."""
    port = free_port()
    config = tmp_path / "config.toml"
    config.write_text(f"[diagnose]\nport = {port}\n")
    out = subprocess.run(VGPUMON + ["--config", str(config), "top", "--once"], capture_output=True, text=True, env=_env(), timeout=60)
    assert out.returncode == 69
    assert out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"vgpumon: top: the agent at localhost:{port} is unreachable (connection refused)")
    assert "; and NVML unavailable: NVML library (libnvidia-ml.so.1) not found" in out.stderr


def test_top_replays_a_capture_through_the_nvml_path():
    """Without an agent, top reads NVML itself; a capture stands in for the H200 here: its first
    tick (GPM has no interval yet, so SM activity is unknown, not 0 %)."""
    out = subprocess.run(VGPUMON + ["top", "--replay", str(DATA / "h200-workload.jsonl.gz"), "--once"], capture_output=True,
                         text=True, env={**_env(), "COLUMNS": "80"}, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("vm — 1 GPU, tick 01:37:58 UTC (replaying ")
    row = _gpu_rows(out.stdout)[0]
    assert re.search(r"^\s*0\s+–\s+0%\s+0\.0/140G\s+–/–\s+79\s+35\s", row), row
    assert "vLLM" not in out.stdout  # no agent: nothing looked for servers, so none is claimed absent
    assert max(len(line) for line in lines) <= 80
