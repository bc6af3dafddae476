"""A one-thread executor whose thread can be abandoned.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, even after
``shutdown(wait=False)``: one thread stuck in a C call that never returns (a wedged NVML call, the
failure that makes other GPU exporters hang) then keeps the process from exiting on SIGTERM. This
executor runs on a daemon thread instead; ``abandon()`` leaves a stuck thread behind (it exits
when its call returns) and the interpreter does not wait for it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import queue
import sys
import threading
import time
from concurrent.futures import Executor, Future
from typing import Any, Callable, TypeVar

_PR_SET_NAME = 15
_libc: Any = None


def name_process(name: str) -> None:
    """Name the calling (main) thread, and so the process as ``ps``, ``top`` and ``pgrep`` show
    it, ``name`` (first 15 bytes; Linux ``prctl(PR_SET_NAME)``). Does nothing where it cannot."""
    _prctl_name(name)


def name_os_thread() -> None:
    """Give the calling thread's name (``vgpumon-nvml``, ``vgpumon-store_0``…) to the OS thread
    as well (Linux ``prctl(PR_SET_NAME)``, first 15 bytes), so ``top -H``, ``ps -L`` and
    ``/proc/<pid>/task/*/comm`` show which of the agent's threads uses the CPU. Python before
    3.14 leaves every thread named after the process. Does nothing where it cannot."""
    _prctl_name(threading.current_thread().name)


def _prctl_name(name: str) -> None:
    global _libc
    if not sys.platform.startswith("linux"):
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


_M_ARENA_MAX = -8  # glibc malloc.h


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas (``mallopt(M_ARENA_MAX)``, as ``MALLOC_ARENA_MAX`` would): by
    default each thread that calls ``malloc`` may get an arena of its own, and the agent's
    mostly idle threads then hold memory they rarely use. Call before the threads start; does
    nothing off glibc or when ``MALLOC_ARENA_MAX`` is set (the user's choice wins)."""
    import os

    global _libc
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _libc.mallopt(_M_ARENA_MAX, arenas)
    except (OSError, AttributeError):
        pass


class Latch:
    """A flag that is set once and that threads sleep on: ``threading.Event``'s use, for the
    agent's per-tick sleeps. ``wait`` is one lock acquire with a timeout instead of a
    ``Condition`` (a lock allocated, a waiter list, two more lock rounds): about 40 µs less CPU
    per wake-up on a 2-core VM, which a 1 Hz sampler and its watchdog each pay every tick.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()  # held until set: a waiter gets it only then
        self._set = False
        self._guard = threading.Lock()

    def set(self) -> None:
        with self._guard:
            if not self._set:
                self._set = True
                self._lock.release()

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float | None = None) -> bool:
        """Sleep until set or for ``timeout`` seconds (``None``: until set); True when set."""
        if self._set:
            return True
        if self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            self._lock.release()  # let the other waiters through too
            return True
        return self._set


class DaemonExecutor(Executor):
    """Runs submitted calls one at a time on one daemon thread.

    Args:
        name: the thread's name (shown by py-spy and in logs).
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]] | None] = (
            queue.SimpleQueue()
        )
        self._closed = False
        # [monotonic start of the call running now, or None while idle]: a list the thread sets,
        # so that the thread holds no reference to the executor
        self._since: list[float | None] = [None]
        self._thread = threading.Thread(target=self._run, args=(self._queue, self._since), name=name, daemon=True)
        self._thread.start()

    @staticmethod
    def _run(q: "queue.SimpleQueue[Any]", since: list[float | None]) -> None:
        name_os_thread()
        while True:
            item = q.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            since[0] = time.monotonic()
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                since[0] = None
                future.set_exception(exc)
            else:
                since[0] = None
                future.set_result(result)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)``; the future holds its result or exception.

        Raises:
            RuntimeError: the executor was shut down or abandoned.
        """
        if self._closed:
            raise RuntimeError(f"{self._name}: executor closed")
        future: Future[Any] = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop after the queued calls; with ``wait``, wait for them (never for an abandoned
        thread)."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
        if wait:
            self._thread.join()

    def abandon(self) -> None:
        """Leave the thread behind (it is stuck in a call): it exits when the call returns, and
        nothing waits for it, the interpreter included."""
        self._closed = True
        self._queue.put(None)

    @property
    def thread_id(self) -> int | None:
        """The thread's ``threading.get_ident()`` (``None`` before it started)."""
        return self._thread.ident

    @property
    def running_since(self) -> float | None:
        """``time.monotonic()`` when the call running now began; ``None`` while the thread waits
        for one."""
        return self._since[0]

    @property
    def busy(self) -> bool:
        """The thread is alive (running a call or waiting for one)."""
        return self._thread.is_alive()


_T = TypeVar("_T")


def within(fetch: Callable[[], _T], seconds: float, late: Callable[[], Exception]) -> _T:
    """``fetch()`` on a daemon thread, given ``seconds`` in all; past them the exception
    ``late()`` gives is raised and the thread is left to end on its own (it does not hold the
    process's exit). For calls whose own timeouts bound each step but not the whole: urllib's
    bounds each read of a socket (a server answering a byte every few seconds holds a request for
    ever), a database that accepts the connection and never answers holds a query for the
    kernel's TCP timeout.

    Raises:
        what ``fetch`` raised, or ``late()``.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fetch()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            box["error"] = exc

    worker = threading.Thread(target=run, name="vgpumon-bounded", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise late()
    if "error" in box:
        raise box["error"]
    return box["value"]
