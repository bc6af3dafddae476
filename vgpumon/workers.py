"""A one-thread executor whose thread can be abandoned.

``concurrent.futures.ThreadPoolExecutor`` joins its threads when the interpreter exits, even after
``shutdown(wait=False)``: one thread stuck in a C call that never returns (a wedged NVML call, the
failure that makes other GPU exporters hang) then keeps the process from exiting on SIGTERM. This
executor runs on a daemon thread instead; ``abandon()`` leaves a stuck thread behind (it exits
when its call returns) and the interpreter does not wait for it.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Executor, Future
from typing import Any, Callable


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
        self._thread = threading.Thread(target=self._run, args=(self._queue,), name=name, daemon=True)
        self._thread.start()

    @staticmethod
    def _run(q: "queue.SimpleQueue[Any]") -> None:
        while True:
            item = q.get()
            if item is None:
                return
            future, fn, args, kwargs = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                future.set_exception(exc)
            else:
                future.set_result(result)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:  # type: ignore[override]
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
    def busy(self) -> bool:
        """The thread is alive (running a call or waiting for one)."""
        return self._thread.is_alive()
