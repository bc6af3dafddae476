"""The agent's own process: ``vgpumon agent`` reads and checks its settings (typer, pydantic), then
replaces itself (``execv``, same PID) with this lean entry point, which runs the agent from a
*plan* of plain values and never loads the command line's libraries.

Why: the command line's libraries (typer, pydantic and pydantic-settings, the ORM they pull in)
are only needed to read flags, environment and config file, yet an imported module stays resident
for the process's life. Exec'ing into a process that imports only what sampling, storing,
``/metrics`` and the rules use keeps a daemon that runs on every GPU host about 6.7 MB smaller
(107.9 -> 101.2 MB on the H200 without ``.pyc`` files; docs/benchmarks.md, "Agent footprint").

The plan travels on an inherited, unlinked memory file (``memfd``) whose descriptor is named by
``--plan-fd``: never in argv or the environment, since it holds the store URL's password and the
API token. The process keeps its PID, its standard streams, its working directory (relative
paths mean the same) and its name (``vgpumon``). Where exec is not possible (no ``memfd``, no
``sys.executable``, a frozen build), when ``VGPUMON_AGENT_EXEC=0``, or when the CLI runs inside another program
(tests, ``CliRunner``), the same ``run`` executes in the calling process.

Started by ``vgpumon agent`` only, as ``python -c BOOT ROOT --plan-fd N vgpumon agent ARGS...``
(``ROOT``: where the CLI's ``vgpumon`` package lives; the trailing arguments are the original
command line, passwords masked, kept for ``ps`` and ``pgrep -f 'vgpumon agent'``; not read).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, cast

from vgpumon.base.errors import CaptureFormatError, ExitCode, VgpumonError
from vgpumon.base.logs import exit_internal_error, one_line, setup_logging
from vgpumon.base.masking import mask_secrets
from vgpumon.base.signals import (
    ask_stop,
    caused_by_interrupt,
    exit_interrupted,
    no_alarm,
    quiet_lost_interrupts,
    stop_asked,
)

if TYPE_CHECKING:
    from vgpumon.agent import Agent, AgentStats
    from vgpumon.agent.plan import Plan
    from vgpumon.base.listen import ExporterConfig
    from vgpumon.config import Settings
    from vgpumon.exporter.api import ApiConfig
    from vgpumon.model import Snapshot

log = logging.getLogger("vgpumon")

#: Version of the plan's layout: a CLI and an agent process (``vgpumon.agent.process``) of different installs (an upgrade
#: between the two steps) refuse each other's plan instead of misreading it.
PLAN_VERSION = 1
#: ``VGPUMON_AGENT_EXEC=0`` keeps the agent in the CLI's process (debugging, profilers).
EXEC_ENV = "VGPUMON_AGENT_EXEC"




def make_plan(
    settings: "Settings", *, replay: str | None, recorded_pace: bool, duration: float | None, sysfs: str | None,
    capture_clock: bool = False,
    shift_s: float = 0.0,
) -> Plan:
    """The agent's run as plain, JSON-able values, from the validated settings and the run's own
    flags. Every value was checked by ``vgpumon.config``; ``run`` trusts them.

    Args:
        settings: the effective settings (``load_settings``: store URL, hostname and spool filled).
        replay: a capture to replay instead of reading the GPUs, or ``None``.
        recorded_pace: replay at the capture's own pace.
        duration: seconds to run, or ``None`` for until SIGINT/SIGTERM.
        sysfs: sysfs root for the PCIe topology, or ``None`` (the default for the mode).
        shift_s: seconds added to a replay's every time (``--shift-to-now``).
        capture_clock: a replay at the recorded pace keeps the capture's clock instead of moving
            onto the wall clock (``--replay-clock capture``; a replay as fast as possible always does).
    """
    a, st, ex, r, api = settings.agent, settings.store, settings.exporter, settings.rules, settings.api
    assert st.url is not None and a.hostname is not None, "load_settings fills the store URL and the host name"
    return {
        "version": PLAN_VERSION,
        "log_level": settings.log_level,
        "store": {
            "url": st.url, "busy_timeout_ms": int(st.busy_timeout * 1000), "connect_timeout_s": st.connect_timeout,
            "statement_timeout_s": st.statement_timeout, "raw_retention": st.raw_retention,
            "rollup_retention": st.rollup_retention,
        },
        "agent": {
            "interval": a.interval, "hostname": a.hostname, "slow_every": a.slow_every, "host_every": a.host_every,
            "reprobe_every": a.reprobe_every, "call_deadline": a.call_deadline, "flush_interval": a.flush_interval,
            "gpm": a.gpm, "spool": str(a.spool),
            "spool_max_mb": a.spool_max_mb, "buffer_max_rows": a.buffer_max_rows,
        },
        "vllm": {"enabled": settings.vllm.enabled, "urls": list(settings.vllm.urls), "interval": settings.vllm.interval,
                 "probe_timeout": settings.vllm.probe_timeout},
        "exporter": {
            "listen": ex.listen, "metrics_file": None if ex.metrics_file is None else str(ex.metrics_file),
            "kubelet_socket": ex.kubelet_socket, "otlp_url": ex.otlp_url, "otlp_interval": ex.otlp_interval,
            "header_timeout": ex.header_timeout, "keepalive_timeout": ex.keepalive_timeout,
            "max_connections": ex.max_connections,
        },
        "rules": {"enabled": r.enabled, "thresholds": dict(r.thresholds), "webhooks": list(r.webhooks), "alertmanagers": list(r.alertmanagers)},
        "api": {
            "enabled": api.enabled, "token": api.token.get_secret_value() if api.token is not None else None,
            "stacks": api.stacks, "window": settings.diagnose.window,
        },
        "run": {"replay": replay, "shift_s": shift_s, "recorded_pace": recorded_pace, "capture_clock": capture_clock, "duration": duration, "sysfs": sysfs},
    }


class ReplayClock:
    """The clock of a replay as fast as possible: the capture's time (its ticks', moved by
    ``--shift-to-now``), read between ticks as the newest tick's time plus the wall time since it
    was taken in. A live source beside the replay (a vLLM server) stamps its polls with it, so
    the rules, which judge a replay in its ticks' time, read them on the same clock as the GPUs'
    rows. A replay at the recorded pace needs none: its ticks are on the wall clock."""

    def __init__(self, first_ts: float | None, wall: Callable[[], float] = time.time) -> None:
        self._wall = wall
        #: wall − data time, measured at each tick (until the first, from the capture's first tick)
        self.offset = 0.0 if first_ts is None else wall() - first_ts

    def observe(self, snap: "Snapshot") -> None:
        self.offset = self._wall() - snap.ts

    def now(self) -> float:
        return self._wall() - self.offset


def store_deadline(statement_timeout: float, busy_timeout: float, connect_timeout: float) -> float:
    """Seconds a store call may go without an answer before the agent counts the store as silent
    and cuts its connections (``Agent.store_deadline``): past the longest wait the store's own
    settings allow a healthy store — a statement the server cancels at ``statement_timeout``
    (Postgres) or a lock waited for ``busy_timeout`` (SQLite), after a reconnection of up to
    ``connect_timeout`` — plus 10 s. 75 s with the defaults (60 + 5 + 10)."""
    return max(statement_timeout, busy_timeout) + connect_timeout + 10.0


def ignore_alarms() -> None:
    """Make SIGALRM harmless for the agent process's whole life (on the main thread; a no-op
    elsewhere). A paced run's watchdog uses it while it samples (``Agent._run_paced``); outside
    that, during start-up, a replay or the last flush at stop, its default action would end the
    process (exit 142) and lose the ticks not yet stored. A Python handler, not ``SIG_IGN``:
    handlers do not survive an exec, so the processes the agent starts (py-spy) get the default."""
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGALRM, no_alarm)


def run(plan: Plan) -> int:
    """Run the agent a plan describes until SIGINT/SIGTERM or its duration; prints the closing
    summary on stderr.

    Returns:
        ``ExitCode.OK``, or ``ExitCode.UNAVAILABLE`` when rows could not be stored and wait in the
        spool.

    Raises:
        VgpumonError: no NVIDIA stack (69), a bad capture (65), a store that cannot be used (69),
            a metrics selection file that cannot be used (64), ...
    """
    import asyncio

    from vgpumon.base.workers import limit_malloc_arenas

    ignore_alarms()  # the in-process path (VGPUMON_AGENT_EXEC=0) comes here without main()

    limit_malloc_arenas()  # before any thread starts: a long-lived daemon's resident memory
    from vgpumon.agent import Agent
    from vgpumon.sources.host import HostSource
    from vgpumon.sources.nvml import NvmlSource
    from vgpumon.sources.nvml.capture import ReplayBackend
    from vgpumon.store import open_store
    from vgpumon.store.retention import Retention
    from vgpumon.store.spool import Backlog

    a, st, ex, rp = plan["agent"], plan["store"], plan["exporter"], plan["run"]
    replay = rp["replay"]
    exporter = exporter_config(ex["listen"], ex["metrics_file"], header_timeout=ex["header_timeout"],
                               keepalive_timeout=ex["keepalive_timeout"], max_connections=ex["max_connections"])
    # a replay runs on one clock (docs/exporter.md, "Replays on one clock"): at the recorded
    # pace the wall clock (its first tick lands now) unless --replay-clock capture, as fast as
    # possible the capture's
    on_wall = rp["recorded_pace"] and not rp["capture_clock"]
    backend = ReplayBackend(replay, shift_s=rp["shift_s"], anchor=time.time if on_wall else None) if replay else None  # a bad capture: exit 65 before anything is created
    clock = ReplayClock(backend.first_ts) if backend is not None and not on_wall else None
    slow_every = a["slow_every"]
    if slow_every is None:  # a replay asks for the slow set at the cadence it was recorded with
        slow_every = int(backend.header.get("slow_every", 10)) if backend else 10
    source = NvmlSource(backend, slow_every=slow_every, use_gpm=a["gpm"], reprobe_every=a["reprobe_every"])
    source.start()  # no NVIDIA stack: exit 69 here, before a store is created for nothing
    store = open_store(
        st["url"], busy_timeout_ms=st["busy_timeout_ms"], connect_timeout_s=st["connect_timeout_s"],
        statement_timeout_s=st["statement_timeout_s"],
    )  # migrates (advisory lock / file lock)
    vllm = None
    v = plan["vllm"]
    if v["enabled"] and (replay is None or v["urls"]):
        from vgpumon.config.thresholds import Thresholds
        from vgpumon.rules.catalogue import rule_names
        from vgpumon.sources.vllm import NoProcesses, VllmSource
        from vgpumon.sources.vllm.slo import SloTargets

        # the SLO targets are the rules' thresholds: one setting for the figure and its alert
        th = Thresholds.from_mapping(plan["rules"]["thresholds"], rule_names)
        slo = SloTargets(th.vllm_slo_ttft_seconds, th.vllm_slo_itl_seconds, th.vllm_slo_window_seconds)
        # a replay reads a recorded host: only configured servers, no discovery on this one
        vllm = VllmSource(static_urls=v["urls"], processes=NoProcesses() if replay else None, interval=v["interval"],
                           probe_timeout=v["probe_timeout"], slo=slo, clock=time.time if clock is None else clock.now)
    from pathlib import Path

    backlog = Backlog(Path(a["spool"]), max_spool_bytes=a["spool_max_mb"] << 20, max_memory_rows=a["buffer_max_rows"])
    kubernetes = None
    kubelet_socket = ex["kubelet_socket"]
    if kubelet_socket != "off" and (replay is None or kubelet_socket):
        from vgpumon.sources.kubernetes import DEFAULT_SOCKET, KubernetesSource, PodResourcesClient

        kubernetes = KubernetesSource(PodResourcesClient(kubelet_socket or DEFAULT_SOCKET))
    rules = None
    r = plan["rules"]
    if r["enabled"]:
        from vgpumon.alerts.runner import RuleRunner
        from vgpumon.alerts.sinks import AlertmanagerSink, LogSink, WebhookSink
        from vgpumon.config.thresholds import Thresholds
        from vgpumon.rules.catalogue import rule_names
        from vgpumon.rules.engine import Engine

        sinks = [LogSink(), *(WebhookSink(u) for u in r["webhooks"]), *(AlertmanagerSink(u) for u in r["alertmanagers"])]
        # a replay is judged in the capture's time, not against today's clock
        rules = RuleRunner(Engine(Thresholds.from_mapping(r["thresholds"], rule_names)), sinks=sinks, wall=time.time if replay is None else None)
    sysfs = rp["sysfs"]
    runner = Agent(
        source,
        store,
        host=None if replay else HostSource(),
        sysfs_root=sysfs if sysfs else (None if replay else "/sys"),
        host_every=a["host_every"],
        hostname=a["hostname"],
        interval=a["interval"],
        duration=rp["duration"],
        paced=replay is None,
        recorded_pace=bool(replay) and rp["recorded_pace"],
        vllm=vllm,
        backlog=backlog,
        retention=Retention(store, raw_retention_s=st["raw_retention"], rollup_retention_s=st["rollup_retention"]),
        data_time=bool(replay),
        kubernetes=kubernetes,
        call_deadline=a["call_deadline"],
        flush_interval=a["flush_interval"],
        rules=rules,
        store_deadline=store_deadline(st["statement_timeout_s"], st["busy_timeout_ms"] / 1000, st["connect_timeout_s"]),
    )
    if clock is not None:
        runner.observers.append(clock.observe)
    api = api_config(plan)
    otlp = None
    if ex["otlp_url"]:
        from vgpumon.exporter.otlp import OtlpPusher

        otlp = OtlpPusher(ex["otlp_url"], a["hostname"], interval=ex["otlp_interval"], tick_interval=a["interval"])
        runner.observers.append(otlp.observe)
    # What exists now (modules, the catalogue, SQLAlchemy's tables and caches) lives as long as the
    # process: out of the collector's reach, a full collection no longer walks it every time.
    import gc

    gc.collect()
    gc.freeze()
    try:
        stats = asyncio.run(run_until_signal(runner, exporter, api))
    except CaptureFormatError as exc:
        # a capture broken part-way: the ticks before the fault are stored; say so, or a user
        # replaying it again after a fix would not expect "stored already" lines
        done = runner.stats
        if done.rows_written or done.rows_duplicate:
            raise CaptureFormatError(
                f"{exc} ({done.ticks} ticks before it were stored: {done.rows_written} rows written, "
                f"{done.rows_duplicate} stored already)"
            ) from None
        raise
    finally:
        if otlp is not None:
            otlp.shutdown()  # the last push
        store.close()
    say = _echo_err
    say(f"vgpumon agent: {stats.ticks} ticks of {stats.gpus} GPU(s), {stats.rows_written} rows stored in {st['url']}")
    if stats.rows_duplicate:
        say(f"vgpumon agent: {stats.rows_duplicate} rows were stored already and skipped (a capture or spool replayed again)")
    if stats.ticks_skipped:
        say(f"vgpumon agent: {stats.ticks_skipped} slots had no tick because the tick before ran past them")
    if stats.rows_folded:
        say(f"vgpumon agent: {stats.rows_folded} ticks were kept only as 1-minute rollups (store away, spool/buffer full)")
    if stats.dead_letters:
        say(f"vgpumon agent: {stats.dead_letters} rows the store refused were set aside in {backlog.dead_letter_path}")
    if stats.rows_spooled:
        say(f"vgpumon agent: {stats.rows_spooled} rows wait in the spool {backlog.spool_dir} for the next run")
    return ExitCode.UNAVAILABLE if stats.rows_pending else ExitCode.OK




def _echo_err(line: str) -> None:
    print(mask_secrets(line), file=sys.stderr, flush=True)


def exporter_config(listen: str, metrics_file: str | None, *, header_timeout: float, keepalive_timeout: float,
                    max_connections: int) -> ExporterConfig:
    """The exporter's settings (``listen`` may be ``off``; the last three: its connection limits). A selection file that cannot be used is a usage error (64) before anything is sampled or stored.

    Raises:
        ConfigFileError: the metric selection file is missing, unreadable, malformed or selects
            nothing (an input file: exit 65, as a config file or a capture).
    """
    from pathlib import Path

    from vgpumon.base.errors import ConfigFileError
    from vgpumon.exporter import ExporterConfig
    from vgpumon.exporter.selection import SelectionError, read_selection

    path = None if metrics_file is None else Path(metrics_file)
    if path is not None:
        try:
            read_selection(path)
        except SelectionError as exc:
            raise ConfigFileError(f"--metrics-file: {exc}") from None
    return ExporterConfig(listen=listen, metrics_file=path, header_timeout=header_timeout,
                          keepalive_timeout=keepalive_timeout, max_connections=max_connections)


def api_config(plan: Plan) -> ApiConfig:
    """The agent's ``/api/v1`` settings (``[api]``; the report's window and the rules' thresholds)."""
    from vgpumon.config.thresholds import Thresholds
    from vgpumon.exporter.api import ApiConfig
    from vgpumon.rules.catalogue import rule_names

    a = plan["api"]
    return ApiConfig(
        enabled=a["enabled"], token=a["token"], stacks=a["stacks"], window_seconds=a["window"],
        thresholds=Thresholds.from_mapping(plan["rules"]["thresholds"], rule_names),
    )


async def run_until_signal(agent: Agent, exporter: ExporterConfig | None = None, api: ApiConfig | None = None) -> AgentStats:
    """Run ``agent`` (and ``/metrics`` with the API when ``exporter`` is set) until its duration
    ends or SIGINT/SIGTERM arrives; returns the agent's stats."""
    import asyncio

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    from vgpumon.agent import quiet_wakeup_fd

    quiet_wakeup_fd()  # a flood of signals must not warn from the handler, replays included (agent.py)
    if stop_asked():  # a stop whose KeyboardInterrupt was swallowed during start-up (a GC callback)
        stop.set()
    if exporter is None:
        return await agent.run(stop)
    from vgpumon.exporter.server import serving

    # the rules engine, when the agent runs one, feeds /metrics its alerts and leak slopes
    async with serving(agent, exporter, rules=getattr(agent, "rules", None), api=api):
        return await agent.run(stop)


def can_exec() -> bool:
    """True when this process may replace itself with the lean agent (Linux ``memfd``, a known
    interpreter, not switched off by ``VGPUMON_AGENT_EXEC=0``)."""
    return (
        hasattr(os, "memfd_create") and bool(sys.executable) and not getattr(sys, "frozen", False)
        and os.environ.get(EXEC_ENV, "1") != "0"
    )


def exec_agent(plan: Plan, argv: list[str]) -> NoReturn:
    """Replace this process with the lean agent (``_BOOT``, then ``main``) running ``plan``;
    ``argv`` (the original command line, passwords masked) is appended for ``ps``. Never returns.

    Raises:
        OSError: the memory file or the exec failed (the caller runs the plan in-process instead).
    """
    fd = os.memfd_create("vgpumon-agent-plan", 0)  # no MFD_CLOEXEC: the new image inherits it
    # A SIGINT/SIGTERM between the exec and the new image's handlers would kill the agent (143)
    # instead of stopping it (0), a stray SIGALRM would end it (-14): the signal mask survives
    # exec, so hold them until ``main`` has its handlers.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_ACROSS_EXEC)
    if stop_asked():
        # a stop whose KeyboardInterrupt a library swallowed while the CLI started: the flag dies
        # with this image, so honour it here (signals held: none can slip in between)
        os.close(fd)
        exit_interrupted(["agent"])
    try:
        os.write(fd, json.dumps(plan).encode())
        os.lseek(fd, 0, os.SEEK_SET)
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, [sys.executable, *_interpreter_options(), "-c", _BOOT, _package_root(), "--plan-fd", str(fd),  # noqa: S606  exec of this interpreter with our own boot code; the plan travels in a memfd
                                  "vgpumon", *(mask_secrets(a) for a in argv)])
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        os.close(fd)
        raise
    raise AssertionError("unreachable")  # pragma: no cover


#: Blocked across the exec, released by ``main`` once its handlers are in place.
_HELD_ACROSS_EXEC = {signal.SIGINT, signal.SIGTERM, signal.SIGALRM}

#: The new image's first lines. ``python -m`` or ``-c`` would put the working directory first on
#: ``sys.path``, so an agent started from a directory holding a ``vgpumon/`` (a checkout, ``/tmp``)
#: would run that directory's code: the working directory is taken off the path and the
#: directory the CLI's own ``vgpumon`` came from is put there instead, so the agent runs exactly
#: the install that checked its settings. Its argv (after the code) is that directory, then
#: ``--plan-fd N``, then ``vgpumon agent …`` as typed, passwords masked, for ``ps``/``pgrep -f``.
_BOOT = (
    "import sys\n"
    "root = sys.argv.pop(1)\n"
    "if sys.path and sys.path[0] in ('', '.'):\n"
    "    sys.path.pop(0)\n"
    "if root not in sys.path:\n"
    "    sys.path.insert(0, root)\n"
    "from vgpumon.agent.process import main\n"
    "main()\n"
)


def _package_root() -> str:
    """The directory holding the ``vgpumon`` package this process runs."""
    import vgpumon

    return os.path.dirname(os.path.dirname(os.path.abspath(vgpumon.__file__)))


def _interpreter_options() -> list[str]:
    """The interpreter's own options of this process (``-X dev``, ``-u``, ``-W error``...), for
    the exec'd one: ``sys.orig_argv`` minus the script or ``-m`` module and its arguments."""
    orig = getattr(sys, "orig_argv", None)
    if not orig:
        return []
    opts = list(orig[1 : len(orig) - len(sys.argv)])
    if opts and opts[-1] in ("-m", "-c"):  # the module or code run stands in sys.argv[0]
        opts.pop()
    return opts


def _read_plan(fd: int) -> Plan:
    with os.fdopen(fd, "rb") as f:
        plan = json.loads(f.read())
    if not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION:
        raise VgpumonError(
            f"agent plan of version {plan.get('version') if isinstance(plan, dict) else '?'}; this vgpumon reads "
            f"{PLAN_VERSION} (was vgpumon upgraded while it started? start it again)"
        )
    return cast("Plan", plan)  # written by make_plan of this version (checked above), key for key


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry point of the exec'd agent process (see the module docstring). Exit codes as
    ``vgpumon agent``'s: 0 on a clean stop (SIGINT/SIGTERM included), the error's code otherwise."""
    args = sys.argv[1:] if argv is None else argv
    # SIGTERM stops cleanly, like Ctrl-C, until the event loop takes both signals over
    signal.signal(signal.SIGTERM, ask_stop)
    signal.signal(signal.SIGINT, ask_stop)
    ignore_alarms()
    sys.unraisablehook = quiet_lost_interrupts
    try:
        # held across the exec (exec_agent): one that came meanwhile is delivered here, as a stop
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_ACROSS_EXEC)
        from vgpumon.base.workers import name_process

        name_process("vgpumon")  # `pgrep vgpumon`, `top` keep finding the agent after the exec
        if len(args) < 2 or args[0] != "--plan-fd":
            print("vgpumon.agent.process is started by `vgpumon agent`; run that instead", file=sys.stderr)
            sys.exit(ExitCode.USAGE)
        plan = _read_plan(int(args[1]))
        setup_logging(plan["log_level"])
        code = run(plan)
    except KeyboardInterrupt:  # before the event loop took the signals over: no tick yet
        exit_interrupted(["agent"])
    except VgpumonError as exc:
        print(f"vgpumon: {mask_secrets(one_line(str(exc)))}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Exception as exc:  # noqa: BLE001 - the one place an unexpected error becomes exit 70
        if caused_by_interrupt(exc):  # a stop that landed inside an import's class creation
            exit_interrupted(["agent"])
        exit_internal_error()
    sys.exit(int(code))




if __name__ == "__main__":
    main()
