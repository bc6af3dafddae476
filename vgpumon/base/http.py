"""What every HTTP client of vgpumon shares: a redirect is an answer, never followed, so that a
token goes to the host it was given for and to no host an answer points at."""

from __future__ import annotations

import urllib.request
from email.message import Message
from typing import IO


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx answer raises ``urllib.error.HTTPError`` with its status; it is never followed
    (urllib's default handler follows it and sends the request's headers, ``Authorization``
    included, to the new host)."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Message, newurl: str
    ) -> None:
        return None

