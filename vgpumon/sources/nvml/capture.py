"""Captures: ``RecordingBackend`` writes each call's answer per tick (JSON Lines, gzip), masked on
request; ``ReplayBackend`` answers from one, streamed a tick at a time, so a replay runs the
collector code that runs on hardware. Format version 1 (docs/architecture.md)."""

from __future__ import annotations

import datetime as _dt
import errno
import gzip
import io
import itertools
import json
import logging
import math
import os
import socket
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, TypeGuard, cast

from vgpumon.base.errors import CaptureFormatError
from vgpumon.base.files import FileRefused, open_regular
from vgpumon.sources.nvml.backend import (
    CAPTURE_FORMAT_VERSION,
    NOT_IN_CAPTURE,
    EndOfCapture,
    GpmValues,
    NvmlBackend,
    NvmlCallError,
)
from vgpumon.sources.nvml.shapes import (
    CaptureHeader,
    JsonValue,
    NvmlAnswer,
    NvmlArg,
    Outcome,
    PcieReading,
    RawXid,
    RecordedCall,
    Scope,
    Tick,
)

MASKED_HOST = "masked-host"

log = logging.getLogger(__name__)

#: The times a recorded tick may have (epoch seconds, 2000-01-01 to 2100-01-01): a tick outside
#: them (1e300, a negative time, milliseconds taken for seconds) is skipped with one warning and
#: costs only itself. Kept, it was every later tick's fate: ticks are stored in order, so each
#: one after it was stamped just after that impossible time and refused by the store.
PLAUSIBLE_TS = (946_684_800.0, 4_102_444_800.0)
#: The most GPUs one capture's host can hold: a recorded ``nvmlDeviceGetCount`` above it (or not
#: a count) makes the capture unusable (exit 65, one line), not a replay of a million devices.
MAX_DEVICES = 64

def _masked(fn: str, scope: Scope, value: NvmlAnswer) -> NvmlAnswer:
    """Replace identifying answers (UUID, serial) with stable neutral ones per device index."""
    if fn == "nvmlDeviceGetUUID" and isinstance(value, str):
        return f"GPU-00000000-0000-4000-8000-{int(scope):012d}"
    if fn == "nvmlDeviceGetSerial" and isinstance(value, str):
        return f"{int(scope):013d}"
    return value

def _open_text(path: Path, mode: str) -> IO[str]:
    if mode == "r":  # a capture to replay is a regular file: a FIFO's open would wait for ever
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "Is a directory")
        try:
            os.close(open_regular(path))
        except FileRefused as exc:
            raise CaptureFormatError(f"cannot read capture {path}: {str(exc).removeprefix(f'{path} is ')}") from None
    if path.suffix == ".gz":
        return io.TextIOWrapper(cast(IO[bytes], gzip.open(path, mode + "b")), encoding="utf-8")
    return open(path, mode, encoding="utf-8")

#: A call that took this long or more carries its duration in a capture (``"d"``, seconds); a
#: replay reproduces durations of ``REPLAY_DELAY_MIN_S`` or more (a slow or wedged call), not the
#: microseconds of ordinary calls.
RECORD_DURATION_MIN_S = 0.001

REPLAY_DELAY_MIN_S = 0.01

def _timed(outcome: Outcome, t0: float) -> Outcome:
    took = time.perf_counter() - t0
    if took >= RECORD_DURATION_MIN_S:
        outcome["d"] = round(took, 6)
    return outcome

def _encode_outcome(value: NvmlAnswer = None, error: NvmlCallError | None = None) -> Outcome:
    if error is not None:
        return {"e": error.code}
    return {"v": value}

class RecordingBackend:
    """Wraps a backend and writes every call's answer per tick to a capture file.

    Args:
        inner: the backend that really answers (``LiveBackend`` on hardware).
        path: capture file; ``.gz`` compresses.
        mask: replace GPU UUIDs, serials and the host name with neutral values.
        meta: extra header fields (interval, command line, ...).
    """

    def __init__(
        self,
        inner: NvmlBackend,
        path: str | Path,
        *,
        mask: bool = False,
        meta: Mapping[str, JsonValue] | None = None,
    ) -> None:
        self._inner = inner
        self._mask = mask
        self._file = _open_text(Path(path), "w")
        header = {
            "vgpumon_capture": CAPTURE_FORMAT_VERSION,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": MASKED_HOST if mask else socket.gethostname(),
            "masked": mask,
            **(meta or {}),
        }
        self._file.write(json.dumps(header) + "\n")
        self._tick = -1
        self._ts: float | None = None
        self._calls: list[RecordedCall] = []
        self.ticks_written = 0

    def _flush_tick(self) -> None:
        if self._calls or self._tick == -1:
            line: Tick = {"tick": self._tick, "ts": self._ts, "calls": self._calls}
            self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
            if self._tick >= 0:
                self.ticks_written += 1
        self._calls = []

    def _record(self, scope: Scope, fn: str, args: Sequence[NvmlArg], kwargs: Mapping[str, NvmlArg], call: Callable[[], NvmlAnswer]) -> NvmlAnswer:
        t0 = time.perf_counter()
        try:
            value = call()
        except NvmlCallError as exc:
            self._calls.append([scope, fn, list(args), dict(kwargs), _timed(_encode_outcome(error=exc), t0)])
            raise
        stored = _masked(fn, scope, value) if self._mask else value
        if fn == "gpm" and value is not None:
            stored = {
                str(k): ({"e": v.code} if isinstance(v, NvmlCallError) else v) for k, v in value.items()
            }
        self._calls.append([scope, fn, list(args), dict(kwargs), _timed(_encode_outcome(stored), t0)])
        return _masked(fn, scope, value) if self._mask else value

    def init(self) -> None:
        self._record("sys", "nvmlInit", (), {}, self._inner.init)

    def shutdown(self) -> None:
        # The file stays open: a re-initialisation mid-run (driver reload) shuts NVML down and
        # starts it again within one capture. ``close()`` ends the capture.
        self._inner.shutdown()

    def close(self) -> None:
        """Write the pending tick and close the file (idempotent)."""
        if not self._file.closed:
            self._flush_tick()
            self._file.close()

    def begin_tick(self, ts: float) -> float:
        ts = self._inner.begin_tick(ts)
        self._flush_tick()
        self._tick += 1
        self._ts = ts
        return ts

    def system(self, fn: str, *args: NvmlArg) -> NvmlAnswer:
        return self._record("sys", fn, args, {}, lambda: self._inner.system(fn, *args))

    def device(self, index: int, fn: str, *args: NvmlArg, **kwargs: NvmlArg) -> NvmlAnswer:
        return self._record(index, fn, args, kwargs, lambda: self._inner.device(index, fn, *args, **kwargs))

    def gpm(self, index: int, metric_ids: Sequence[int]) -> GpmValues | None:
        return self._record(index, "gpm", [list(metric_ids)], {}, lambda: self._inner.gpm(index, metric_ids))

    def forget_device(self, index: int) -> None:
        self._inner.forget_device(index)

    def xid_poll(self) -> list[RawXid]:
        return self._record("sys", "xid_poll", (), {}, self._inner.xid_poll)

    def pcie_throughput(self, index: int, period: float | None = None) -> PcieReading | None:
        # recorded as called: ``period`` among the kwargs only when the caller gave it
        kwargs: dict[str, NvmlArg] = {} if period is None else {"period": period}
        return self._record(index, "pcie_throughput", (), kwargs, lambda: self._inner.pcie_throughput(index, period))

def _key(scope: Scope, fn: str, args: Sequence[NvmlArg], kwargs: Mapping[str, NvmlArg]) -> str:
    return json.dumps([scope, fn, list(args), dict(kwargs)], separators=(",", ":"), sort_keys=True)

def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)

def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

def _shape_error(tick: JsonValue) -> str | None:
    """What is wrong with the shape of one tick line, ``None`` when nothing is."""
    if not isinstance(tick, dict):
        return "not a JSON object"
    number = tick.get("tick")
    if not _is_int(number):
        return '"tick" is not an integer'
    if number >= 0 and not _is_number(tick.get("ts")):
        return '"ts" is not a number of seconds'
    calls = tick.get("calls")
    if not isinstance(calls, list):
        return '"calls" is not a list'
    for call in calls:
        if not (isinstance(call, list) and len(call) == 5):
            return "a call is not [scope, function, args, kwargs, outcome]"
        scope, fn, args, kwargs, outcome = call
        if not (scope == "sys" or _is_int(scope)) or not isinstance(fn, str):
            return "a call's scope or function name has the wrong type"
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            return f"{fn}: args or kwargs have the wrong type"
        if not isinstance(outcome, dict) or not (("v" in outcome) ^ ("e" in outcome)):
            return f"{fn}: outcome is not {{\"v\": value}} or {{\"e\": code}}"
        if "d" in outcome and not _is_number(outcome["d"]):
            return f"{fn}: duration is not a number of seconds"
        if "e" in outcome and not _is_int(outcome["e"]):
            return f"{fn}: error code is not an integer"
    return None

def _check_header(path: Path, first: str | None) -> CaptureHeader:
    if not first or not first.strip():
        raise CaptureFormatError(f"{path} is empty, not a vgpumon capture")
    try:
        header = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        raise CaptureFormatError(f"{path} is not a vgpumon capture (line 1 is not JSON)") from None
    if not isinstance(header, dict) or "vgpumon_capture" not in header:
        raise CaptureFormatError(f"{path} is not a vgpumon capture (no header)")
    if header["vgpumon_capture"] != CAPTURE_FORMAT_VERSION:
        raise CaptureFormatError(
            f"{path} has capture format {header['vgpumon_capture']!r}, this vgpumon reads {CAPTURE_FORMAT_VERSION}"
        )
    if "slow_every" in header and not (_is_int(header["slow_every"]) and header["slow_every"] >= 1):
        raise CaptureFormatError(f"{path}:1: header \"slow_every\" is not a positive integer")
    return cast(CaptureHeader, header)  # its version and "slow_every" checked above

def _read_error(path: Path, exc: BaseException, where: str = "") -> CaptureFormatError:
    reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
    return CaptureFormatError(f"cannot read capture {path}{where}: {reason}")

#: The longest capture line read (characters). A recorded tick of 8 GPUs is about 40 kB and the
#: init block a few hundred; a longer line is not a vgpumon capture's, and reading it whole (a
#: multi-gigabyte file without a newline) would end in MemoryError instead of a clear error.
MAX_LINE_CHARS = 64 << 20

def _line(path: Path, f: IO[str], n: int) -> str:
    """Line ``n`` of an open capture ('' at the end), at most ``MAX_LINE_CHARS`` long.

    Raises:
        CaptureFormatError: the line is longer.
    """
    line = f.readline(MAX_LINE_CHARS + 1)
    if len(line) > MAX_LINE_CHARS:
        raise CaptureFormatError(
            f"{path}:{n}: a capture line over {MAX_LINE_CHARS >> 20} Mi characters: not a vgpumon capture, or damaged"
        )
    return line

def _tick_lines(path: Path, f: IO[str]) -> Iterator[Tick]:
    """The ticks of an open capture after its header line, one line at a time, each checked for
    its shape; a capture without a single tick is an error too (a header only: the recording was
    stopped at once)."""
    n = 1
    seen = False
    try:
        while line := _line(path, f, n + 1):
            n += 1
            if not line.strip():
                continue
            try:
                tick = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise CaptureFormatError(f"{path}:{n}: malformed capture line (not JSON)") from None
            problem = _shape_error(tick)
            if problem:
                raise CaptureFormatError(f"{path}:{n}: malformed capture line ({problem})")
            seen = seen or tick["tick"] >= 0
            yield tick
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise _read_error(path, exc, f" after line {n}") from None
    if not seen:
        raise CaptureFormatError(f"{path} holds no ticks (a header only: was the recording stopped at once?)")

def iter_capture(path: str | Path) -> tuple[CaptureHeader, Iterator[Tick]]:
    """Open a capture and read it as it is consumed: its header now, its ticks one line at a time.

    Replaying a capture this way takes the memory of one tick, whatever its length (an 8-GPU
    hour read whole took about 290 MB).

    Returns:
        ``(header, ticks)``; ``ticks`` yields in file order, the init block (``tick == -1``)
        first, and closes the file when exhausted (or garbage-collected).

    Raises:
        CaptureFormatError: the file is missing or unreadable, not a vgpumon capture or of an
            unknown format version; while iterating, a line that is not JSON or has fields of
            the wrong type (its number is named), a truncated file, or no tick at all.
    """
    path = Path(path)
    try:
        f = _open_text(path, "r")
        first = _line(path, f, 1) or None
    except (OSError, EOFError, UnicodeDecodeError, zlib.error) as exc:
        raise _read_error(path, exc) from None
    try:
        header = _check_header(path, first)
    except CaptureFormatError:
        f.close()
        raise

    def ticks() -> Iterator[Tick]:
        with f:
            yield from _tick_lines(path, f)

    return header, ticks()

def capture_end(path: str | Path) -> float:
    """The time of a capture's last tick (epoch seconds), read through the whole file once.

    Raises:
        CaptureFormatError: as ``iter_capture``.
    """
    _, ticks = iter_capture(path)
    last: float | None = None
    for tick in ticks:
        if tick["ts"] is not None:
            last = float(tick["ts"])
    if last is None:
        raise CaptureFormatError(f"{path}: the capture has no tick")
    return last


def read_capture(path: str | Path) -> tuple[CaptureHeader, list[Tick]]:
    """Read a whole capture file into memory (``iter_capture`` streams it instead).

    Returns:
        ``(header, ticks)``; ``ticks`` in file order, the init block (``tick == -1``) first.

    Raises:
        CaptureFormatError: as ``iter_capture``, for the whole file at once.
    """
    header, ticks = iter_capture(path)
    return header, list(ticks)

class ReplayBackend:
    """Answers NVML calls from a capture, one recorded tick per ``begin_tick``.

    A call is answered from the current tick's recorded answers for the same function and
    arguments (in recorded order when made several times), else from the init block; a call
    the capture never saw raises ``NvmlCallError(NOT_IN_CAPTURE)``.

    The capture is read as the replay goes (``iter_capture``), one tick at a time, so a replay's
    memory does not grow with its length; a malformed line therefore surfaces when the replay
    reaches it (``begin_tick`` raises ``CaptureFormatError``). ``replays_time`` tells the agent
    that tick times come from the capture.

    Args:
        path: capture file written by ``RecordingBackend`` (``vgpumon record``).
        ticks: ticks (with ``header``) instead of ``path``, for derived scenarios; any iterable,
            consumed once, the init block (``tick == -1``) first when there is one.
        shift_s: seconds added to every tick's time and every XID event's (``capture_end``:
            a replay made to end now, so that retention and freshness judge it as new data).
        anchor: the wall clock, for a replay at the recorded pace: the shift is then measured
            at the first tick, so that it lands at the moment it is replayed and each after it
            at its own (``shift_s`` is replaced). The replay then runs on the wall clock, the
            one a live source beside it (vLLM) and Prometheus read (docs/exporter.md).
    """

    replays_time = True

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        header: CaptureHeader | None = None,
        ticks: Iterable[Tick] | None = None,
        shift_s: float = 0.0,
        anchor: Callable[[], float] | None = None,
    ) -> None:
        self._where = str(path) if path is not None else "the capture"
        self.shift_s = float(shift_s)
        self._anchor = anchor
        if path is not None:
            header, ticks = iter_capture(path)
        if header is None or ticks is None:
            raise ValueError("ReplayBackend needs a path or header and ticks")
        self.header: CaptureHeader = header.copy()
        stream = iter(ticks)
        first = next(stream, None)
        self._init: dict[str, list[Outcome]] = {}
        if first is not None and first["tick"] < 0:
            self._init = self._index(first["calls"])
            first = next(stream, None)
        # The first tick is read now, so that a capture without ticks, or whose first tick is
        # malformed, is refused before the caller creates anything (a store); later lines are
        # read as the replay reaches them.
        #: the capture's first tick's time (before any shift), ``None`` for a capture without ticks
        self.first_ts: float | None = None
        if first is not None:
            stream = itertools.chain([first], stream)
            ts = first.get("ts")
            if isinstance(ts, (int, float)):
                self.first_ts = float(ts) + self.shift_s
        self._ticks: Iterator[Tick] = (t for t in stream if t["tick"] >= 0)
        self._current: dict[str, list[Outcome]] = {}
        self._started = False
        #: ticks skipped for an impossible time (``PLAUSIBLE_TS``)
        self.ticks_refused = 0

    @staticmethod
    def _index(calls: Sequence[RecordedCall]) -> dict[str, list[Outcome]]:
        out: dict[str, list[Outcome]] = {}
        for scope, fn, args, kwargs, outcome in calls:
            out.setdefault(_key(scope, fn, args, kwargs), []).append(outcome)
        return out

    def _answer(self, scope: Scope, fn: str, args: Sequence[NvmlArg], kwargs: Mapping[str, NvmlArg]) -> NvmlAnswer:
        key = _key(scope, fn, args, kwargs)
        queue = self._current.get(key) or self._init.get(key)
        if not queue:
            raise NvmlCallError(NOT_IN_CAPTURE, fn)
        outcome = queue.pop(0) if len(queue) > 1 else queue[0]
        delay = outcome.get("d")
        if isinstance(delay, (int, float)) and delay >= REPLAY_DELAY_MIN_S:
            time.sleep(delay)  # a slow or wedged call, as recorded (or as a scenario made it)
        if "e" in outcome:
            raise NvmlCallError(int(outcome["e"]), fn)
        return outcome["v"]

    def init(self) -> None:
        self._answer("sys", "nvmlInit", (), {})

    def shutdown(self) -> None:
        pass

    def begin_tick(self, ts: float) -> float:
        """Move to the next recorded tick with a plausible time (``PLAUSIBLE_TS``); each one
        skipped is counted in ``ticks_refused`` and said in one warning."""
        self._started = True
        lo, hi = PLAUSIBLE_TS
        while True:
            try:
                tick = next(self._ticks)
            except StopIteration:
                raise EndOfCapture from None
            recorded = tick["ts"]
            assert recorded is not None  # only the init block has none (``_shape_error`` checked the ticks)
            if lo <= recorded < hi:
                break
            self.ticks_refused += 1
            log.warning("capture tick %d skipped: its time %r s is not a plausible time (2000-01-01 to 2100-01-01)",
                        tick["tick"], recorded)
        self._current = self._index(tick["calls"])
        if self._anchor is not None:  # the first tick: the replay moves onto the wall clock
            self.shift_s = self._anchor() - float(recorded)
            self._anchor = None
        return float(recorded) + self.shift_s

    def system(self, fn: str, *args: NvmlArg) -> NvmlAnswer:
        value = self._answer("sys", fn, args, {})
        if fn == "nvmlDeviceGetCount" and not (_is_int(value) and 0 <= value <= MAX_DEVICES):
            if not self._started:  # the init block's: nothing of this capture can be replayed
                raise CaptureFormatError(f"{self._where}: nvmlDeviceGetCount answers {value!r:.40}: not a count of 0 to {MAX_DEVICES} GPUs")
            raise NvmlCallError(NOT_IN_CAPTURE, fn)  # one tick's: that read costs only itself
        return value

    def device(self, index: int, fn: str, *args: NvmlArg, **kwargs: NvmlArg) -> NvmlAnswer:
        return self._answer(index, fn, args, kwargs)

    def gpm(self, index: int, metric_ids: Sequence[int]) -> GpmValues | None:
        raw = self._answer(index, "gpm", [list(metric_ids)], {})
        if raw is None:
            return None
        if not isinstance(raw, dict):
            return {}  # an answer of the wrong shape answers no metric: each is missing, the tick kept
        out: GpmValues = {}
        for k, v in raw.items():
            if not (isinstance(k, str) and k.isdigit()):
                continue  # not a metric id: that entry costs only itself
            if isinstance(v, dict):
                code = v.get("e")
                out[int(k)] = NvmlCallError(code if _is_int(code) else NOT_IN_CAPTURE, "nvmlGpmMetricsGet")
            else:
                out[int(k)] = v  # the door takes or refuses it, as any recorded value
        return out

    def forget_device(self, index: int) -> None:
        pass

    def xid_poll(self) -> list[RawXid]:
        events = list(self._answer("sys", "xid_poll", (), {}) or [])
        if self.shift_s:
            events = [{**e, "ts": e["ts"] + self.shift_s} if isinstance(e.get("ts"), (int, float)) else e for e in events]
        return events

    def pcie_throughput(self, index: int, period: float | None = None) -> PcieReading | None:
        kwargs: dict[str, NvmlArg] = {} if period is None else {"period": period}
        try:
            return self._answer(index, "pcie_throughput", (), kwargs)
        except NvmlCallError as exc:
            if exc.code != NOT_IN_CAPTURE:
                raise
        # ``period`` is how often the live backend polls, not part of the answer: a capture
        # recorded while the cross-check polled at another cadence answers the same
        prefix = _key(index, "pcie_throughput", (), {})[:-3]  # the key without its "{}]"
        for key in self._current:
            if key.startswith(prefix):
                return self._answer(index, "pcie_throughput", (), json.loads(key)[3])
        raise NvmlCallError(NOT_IN_CAPTURE, "pcie_throughput")
