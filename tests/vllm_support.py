"""Helpers of the vLLM tests: where the recorded captures are, and a source wired to a fake
clock."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from vgpumon.sources.vllm import VllmSource
from vgpumon.testing.vllm import FakeClock, FakeVllmServer

TESTS = Path(__file__).resolve().parent
#: Where ``shared_dir`` finds each shared part, inside the repository (provenance:
#: tests/data/README.md), so that a fresh clone runs every test that does not need Postgres or a
#: real vLLM.
_IN_REPO = {"fixtures": TESTS / "data", "tools": TESTS}


def shared_dir(*parts: str) -> Path:
    """A directory of recorded test material: ``shared_dir("fixtures", "vllm-real")`` is
    ``tests/data/vllm-real``, ``shared_dir("tools", "vllm-cpu")`` is ``tests/vllm-cpu``.

    Raises:
        FileNotFoundError: no such directory in the repository (a test that names a new one
            must add it, with its provenance, under ``tests/data``).
    """
    head, *rest = parts
    path = _IN_REPO[head].joinpath(*rest)
    if not path.is_dir():
        raise FileNotFoundError(f"test material {path} is missing from the repository")
    return path


def expected(directory: Path) -> dict[str, Any]:
    """``expected.json`` of a capture directory, without its ``_about`` note."""
    doc = json.loads((directory / "expected.json").read_text())
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def source(clock: FakeClock, **kw: Any) -> VllmSource:
    """A vLLM source on a fake clock, with short timeouts (tests never wait on them unless a
    server is made to hang). The server answers on the same event loop: on a loaded machine
    (the suite runs on four workers) an answer took more than the 0.5 s this used to be, and a
    healthy server read as hung."""
    kw.setdefault("request_timeout", 2.0)
    kw.setdefault("interval", 0.5)
    return VllmSource(clock=clock, **kw)


def lifecycle_body(row: dict[str, Any]) -> str:
    """A ``/metrics`` body from one row of the real lifecycle recording (its raw exposition
    lines of running, waiting, KV usage and generated tokens)."""
    lines = []
    for key, metric in (("running", "num_requests_running"), ("waiting", "num_requests_waiting"),
                        ("kv", "kv_cache_usage_perc"), ("gen", "generation_tokens_total")):
        kind = "counter" if key == "gen" else "gauge"
        base = metric.removesuffix("_total")
        lines.append(f"# TYPE vllm:{base} {kind}")
        lines.extend(row[key])
    return "\n".join(lines) + "\n"


class ServerThread:
    """Fake vLLM servers on their own event loop and thread, so that serving 20 MB bodies
    does not load the agent's loop — only the agent's own scraping does."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.servers: list[FakeVllmServer] = []

    def start(self, server: FakeVllmServer) -> FakeVllmServer:
        asyncio.run_coroutine_threadsafe(server.start(), self.loop).result(10)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for s in self.servers:
            asyncio.run_coroutine_threadsafe(s.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
