"""Fuzz targets: each door of the agent as a function of one input, which either passes or raises
its documented refusal. Anything else it raises is a finding. ``tests/test_fuzz.py`` drives them
with hypothesis (a short run in the suite); ``bench/fuzz_long.py`` with a mutation fuzzer over
the recorded inputs (the long opt-in run). Decisions and counts: docs/reliability.md, "Fuzzing".

Targets (``TARGETS``, by name):

* ``metrics``: a ``/metrics`` body → ``parse_metrics`` (text format and OpenMetrics); refusal
  ``MetricsParseError``.
* ``vllm_json``: the body of ``/version``, ``/v1/models``, ``/load``, ``/is_sleeping`` or
  ``/stats`` → each endpoint's reader, through the door; no refusal (a body of the wrong shape is
  no answer).
* ``capture``: one tick line of a capture → its shape check, then a replay of the recorded
  H200 capture's init block and that tick through the NVML collector; refusal
  ``CaptureFormatError``.
* ``settings``: a TOML settings file → ``load_settings``; refusal ``VgpumonError`` (exit 64/65:
  one line).
* ``api``: an API request (method, path and query, ``Authorization`` header: bytes as a client
  could send them) → the API's guard and handlers, with a token set; refusal: none; an answer
  of status 500 is a finding.
* ``cli``: a command line of the commands that only read (``diagnose``, ``capacity``,
  ``db stats``, ``config show``), on a store holding the recorded H200 replay → the installed ``vgpumon`` console script, in this process;
  a ``SystemExit`` with a documented code is its answer; exit 70 (internal error) or any other
  exception is a finding.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import io
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

#: Exit codes of the CLI that are answers, not crashes (``vgpumon.base.errors.ExitCode``, and 0-3
#: for a report's verdict); 70 is the internal error.
CLI_ANSWERS = frozenset({0, 1, 2, 3, 64, 65, 66, 69, 73, 74, 75, 77, 78, 130})


class Finding(Exception):
    """A target did something other than pass or refuse (its answer was a crash)."""


@dataclass(frozen=True)
class Target:
    """One fuzz target: ``run(data)`` passes or raises one of ``refusals``."""

    name: str
    run: Callable[[bytes], object]
    refusals: tuple[type[BaseException], ...]


# -- /metrics -------------------------------------------------------------------------------------


def _metrics(data: bytes) -> None:
    from vgpumon.sources.vllm.metrics import parse_metrics

    parse_metrics(data)
    parse_metrics(data, openmetrics=True)


# -- the other vLLM endpoints ---------------------------------------------------------------------

_DOOR: Any = None


def _vllm_json(data: bytes) -> None:
    from vgpumon import catalogue
    from vgpumon.catalogue import Door
    from vgpumon.sources.vllm import scrape

    global _DOOR
    if _DOOR is None:
        _DOOR = Door((*catalogue.fields_of("vllm_samples"), *catalogue.fields_of("vllm_instances")))
    doc = scrape.Reply(status=200, body=data).json()
    refused: dict[str, str] = {}
    version = scrape.version_answer(_DOOR, doc, refused)
    models = scrape.models_answer(_DOOR, doc, refused)
    for text in (version, *(models or ())):
        if text is not None and (not isinstance(text, str) or "\x00" in text):
            raise Finding(f"a text through the door that no store holds: {text!r:.60}")
    scrape.load_answer(doc)
    scrape.sleeping_answer(doc)
    fields = scrape.stats_fields(doc)
    _DOOR.check_row(dict(fields), [n for n in fields if n in _DOOR.numeric_spec])


# -- captures -------------------------------------------------------------------------------------

_CAPTURE: tuple[Any, Any] | None = None


def h200_capture() -> Path:
    """The recorded H200 capture the suite replays (``tests/data``), in the repository."""
    return Path(__file__).resolve().parents[2] / "tests" / "data" / "h200-workload.jsonl.gz"


def _recorded() -> tuple[Any, Any]:
    global _CAPTURE
    if _CAPTURE is None:
        lines = gzip.open(h200_capture(), "rt").read().splitlines()
        _CAPTURE = (json.loads(lines[0]), json.loads(lines[1]))
    return _CAPTURE


def _capture(data: bytes) -> None:
    from vgpumon.base.errors import CaptureFormatError
    from vgpumon.sources.nvml.backend import EndOfCapture
    from vgpumon.sources.nvml.capture import _shape_error
    from vgpumon.sources.nvml.source import NvmlSource

    try:
        tick = json.loads(data)
    except (ValueError, RecursionError):
        raise CaptureFormatError("not JSON") from None
    problem = _shape_error(tick)
    if problem:
        raise CaptureFormatError(problem)
    from vgpumon.sources.nvml.capture import ReplayBackend

    header, init = _recorded()
    if tick["tick"] < 0:
        tick = {**tick, "tick": 0, "ts": 1_800_000_000.0}
    src = NvmlSource(ReplayBackend(header=header, ticks=[init, tick]))
    src.start()
    with contextlib.suppress(EndOfCapture):
        src.sample()
        src.sample()


# -- settings -------------------------------------------------------------------------------------


def _settings(data: bytes) -> None:
    from vgpumon.config import load_settings

    fd, name = tempfile.mkstemp(suffix=".toml")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        load_settings(Path(name))
    finally:
        os.unlink(name)


# -- API requests ---------------------------------------------------------------------------------

_TOKEN = "fuzz-token-0123456789"  # noqa: S105  the API token of the fuzzed API, in this process only
_API: Any = None


class _NoAgent:
    """An agent that has not ticked yet and keeps no store: the API's answers stop at what the
    request itself decides (guard, query, method)."""

    hostname = "fuzz-host"
    interval = 1.0
    latest = None
    store = None
    vllm = None
    host = None
    rules = None
    topology = None
    observers: list[object] = []

    def monotonic(self) -> float:
        return 0.0


def _api_request(data: bytes) -> tuple[str, str, dict[str, str]]:
    """Method, path with query, and headers made of fuzz bytes (as aiohttp reads bytes that are
    not UTF-8: surrogate-escaped)."""
    parts = data.split(b"\n", 2) + [b"", b""]
    method = parts[0][:16].decode("ascii", "replace") or "GET"
    path = "/api/v1" + parts[1][:2048].decode("utf-8", "surrogateescape")
    headers = {"Authorization": parts[2][:4096].decode("utf-8", "surrogateescape")}
    return method, path, headers


def _api(data: bytes) -> None:
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from vgpumon.exporter.api import AgentApi, ApiConfig

    global _API
    if _API is None:
        api = AgentApi(cast(Any, _NoAgent()), cast(Any, None), ApiConfig(token=_TOKEN), bound_host="0.0.0.0")  # noqa: S104 - the address it would bind, to require the token
        app = web.Application()
        api.install(app)
        _API = (api, app)
    api, app = _API
    method, path, headers = _api_request(data)
    if "\r" in path or "\n" in path or any(c in method for c in " \r\n"):
        return  # not a request line aiohttp's parser lets through
    try:
        request = make_mocked_request(method, path, headers=headers, app=app)
    except (ValueError, UnicodeError):
        return  # a URL yarl refuses: aiohttp's parser refuses it before the API sees it

    async def route(req: web.Request) -> web.StreamResponse:
        match = await app.router.resolve(req)
        return await match.handler(req)

    async def answer() -> web.StreamResponse:
        return await api._guard(request, route)  # noqa: SLF001 - the guard is the door under test

    response = asyncio.run(answer())
    if response.status >= 500 and response.status != 503:
        raise Finding(f"{method} {path!r:.80}: status {response.status}")
    if isinstance(response, web.Response) and response.body is not None and response.content_type != "application/json":
        raise Finding(f"{method} {path!r:.80}: a {response.content_type} answer, not JSON")


# -- command lines --------------------------------------------------------------------------------

#: Commands that only read: a fuzzed command line may not start an agent, record, or write
#: generated files into the working directory.
CLI_COMMANDS = (("diagnose",), ("capacity",), ("db", "stats"), ("config", "show"))
_CLI_DIR: Path | None = None


def cli_args(data: bytes) -> list[str]:
    """A command line of ``CLI_COMMANDS`` from fuzz bytes: the first byte picks the command, the
    rest are arguments separated by NUL (a NUL cannot be in an argument of a real exec)."""
    command = list(CLI_COMMANDS[data[0] % len(CLI_COMMANDS)]) if data else ["diagnose"]
    words = [w.decode("utf-8", "surrogateescape") for w in data[1:].split(b"\x00") if w][:12]
    return command + [w for w in words if not w.startswith(("--config", "--db"))]  # ours: no real file is named


def _cli_store() -> Path:
    """A directory with a real store to read: the recorded H200 capture replayed into it as host
    ``h200`` (by the agent in a process of its own: it execs into its lean process)."""
    import subprocess
    import sys

    where = Path(tempfile.mkdtemp(prefix="vgpumon-fuzz-"))
    subprocess.run([sys.executable, "-m", "vgpumon", "agent", "--listen", "off", "--replay", str(h200_capture()),  # noqa: S603 - this interpreter, fixed arguments
                    "--db", str(where / "store.db"), "--hostname", "h200"], capture_output=True, timeout=600, check=True,
                   env={**{k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}, "XDG_STATE_HOME": str(where)})
    return where


def _console_script() -> Callable[[], object]:
    """The installed ``vgpumon`` console script's function (``vgpumon.__main__:main``), found
    as the program is run, through its entry point: the command line sits above this package's
    layer (docs/architecture.md), and the fuzzer drives the program as a user runs it."""
    import importlib
    from importlib.metadata import entry_points

    scripts = [e for e in entry_points(group="console_scripts") if e.name == "vgpumon"]
    if scripts:
        return cast(Callable[[], object], scripts[0].load())
    # a source tree run without installing it (a GPU host given the tree): the same function, by name
    return cast(Callable[[], object], importlib.import_module("vgpumon.__main__").main)


def _cli(data: bytes) -> None:
    import sys

    global _CLI_DIR
    if _CLI_DIR is None:
        _CLI_DIR = _cli_store()
    args = cli_args(data)
    store = f"sqlite:///{_CLI_DIR / 'store.db'}"
    argv = [*args, "--db", store] if args[0] in ("diagnose", "capacity", "db") else args
    env = {k: v for k, v in os.environ.items() if not k.startswith("VGPUMON_")}
    env.update(XDG_CONFIG_HOME=str(_CLI_DIR), XDG_STATE_HOME=str(_CLI_DIR), HOME=str(_CLI_DIR))  # no config file
    code: object = 0
    program = _console_script()
    saved_argv = sys.argv
    sys.argv = ["vgpumon", *argv]
    with _environ(env), _signals(), contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            program()
        except SystemExit as exc:
            code = exc.code if exc.code is not None else 0
        finally:
            sys.argv = saved_argv
    if code not in CLI_ANSWERS:
        raise Finding(f"vgpumon {' '.join(map(repr, argv))[:200]}: exit {code}")


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """The CLI installs its stop signals' handlers: the caller's are put back after it."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGALRM)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _targets() -> dict[str, Target]:
    from vgpumon.base.errors import CaptureFormatError, VgpumonError
    from vgpumon.sources.vllm.metrics import MetricsParseError

    return {t.name: t for t in (
        Target("metrics", _metrics, (MetricsParseError,)),
        Target("vllm_json", _vllm_json, ()),
        Target("capture", _capture, (CaptureFormatError,)),
        Target("settings", _settings, (VgpumonError,)),
        Target("api", _api, ()),
        Target("cli", _cli, ()),
    )}


TARGETS: dict[str, Target] = _targets()


def seeds(name: str) -> list[bytes]:
    """Recorded inputs a mutation fuzzer starts from: the real vLLM 0.32 scrapes, real answers
    of the other endpoints, the H200 capture's ticks, the shipped example settings, ordinary
    API requests and command lines."""
    data = Path(__file__).resolve().parents[2] / "tests" / "data"
    if name == "metrics":
        return [p.read_bytes() for p in sorted((data / "vllm-real").glob("*.txt"))]
    if name == "vllm_json":
        return [b'{"version": "0.32.0"}', b'{"object": "list", "data": [{"id": "tiny", "object": "model"}]}',
                b'{"server_load": 3}', b'{"is_sleeping": false}',
                b'{"num_running": 3, "num_waiting": 0, "gpu_cache_usage": 0.25, "block_size": 16, "num_gpu_blocks": 1024}']
    if name == "capture":
        lines = gzip.open(h200_capture(), "rt").read().splitlines()
        return [ln.encode() for ln in lines[2:12]]
    if name == "settings":  # the example of docs/configuration.md, and one of each section
        doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
        example = doc.split("```toml\n", 1)[1].split("```", 1)[0].encode() if "```toml\n" in doc else b""
        return [example, b'[api]\ntoken = "s3cret"\nstacks = true\n[diagnose]\nwindow = "15m"\n',
                b'[rules.thresholds]\ngpu_temperature_celsius = 85\n']
    if name == "api":
        return [b"GET\n/diagnose?window=5m\nBearer " + _TOKEN.encode(), b"GET\n/snapshot\nBearer " + _TOKEN.encode(),
                b"GET\n/alerts\nBearer wrong", b"POST\n/diagnose?since=2h&stacks=1\nBearer " + _TOKEN.encode()]
    if name == "cli":
        return [b"\x00h200\x00--json", b"\x01--window\x0030m", b"\x02", b"\x03\x00--json",
                b"\x00h200\x00--since\x002h\x00--max-age\x005m"]
    raise KeyError(name)
