"""What every HTTP client of vgpumon shares: a redirect is an answer, never followed, so that a
token goes to the host it was given for and to no host an answer points at."""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import IO, TypeVar

T = TypeVar("T")


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx answer raises ``urllib.error.HTTPError`` with its status; it is never followed
    (urllib's default handler follows it and sends the request's headers, ``Authorization``
    included, to the new host)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Message, newurl: str
    ) -> None:
        return None


def within(fetch: Callable[[], T], seconds: float, late: Callable[[], Exception]) -> T:
    """``fetch()`` on a thread of its own, given ``seconds`` in all. urllib's timeout bounds each
    read of the socket, not the request: a server that sends a byte every few seconds would hold
    it for ever. Past ``seconds`` the exception ``late()`` gives is raised and the thread is left
    to end with its socket (a daemon: it does not hold the process's exit).

    Raises:
        what ``fetch`` raised, or ``late()``.
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fetch()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread as it is
            box["error"] = exc

    worker = threading.Thread(target=run, name="vgpumon-http", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise late()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
