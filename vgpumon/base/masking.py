"""Secrets never reach the screen: one helper masks them in every line vgpumon prints or logs.

A store URL carries its password (``postgresql+psycopg://user:secret@host/db``), and so can a
libpq keyword string (``password=secret``) or a URL's query (``?password=secret``). Every path that
prints text built from such a value goes through ``mask_secrets``: the CLI's error line, the
agent's closing summary, ``vgpumon config show`` and, through ``MaskingFormatter``, every log line
and traceback.
"""

from __future__ import annotations

import logging
import re

MASK = "***"

# scheme://user:password@host — the password is everything between the first ':' after the
# user name and the last '@' before the host (passwords may contain '@' and ':' themselves).
_URL_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s/]*)(?P<tail>@[^\s@/]*)")
# password=..., token=... in a query string or a libpq keyword/value string.
_KEY_VALUE = re.compile(r"(?i)(?P<head>\b(?:password|passwd|pwd|token|secret|api_key|apikey)\s*=\s*)(?P<secret>'[^']*'|[^\s&;,'\"]+)")


def mask_secrets(text: str) -> str:
    """Replace the passwords and tokens inside ``text`` with ``***``.

    Masks the password of every ``scheme://user:password@host`` URL and the value of every
    ``password=``, ``token=``, ``secret=`` (and similar) key; the rest of the text is unchanged, so
    a masked URL still names its user, host and database.

    Args:
        text: any text: a URL, an error message, a whole traceback.

    Returns:
        The text with each secret replaced by ``***`` (the same text when it holds none).
    """
    if "=" not in text and "@" not in text:  # the common case: nothing that can hold a secret
        return text
    text = _URL_USERINFO.sub(lambda m: m["head"] + (MASK if m["secret"] else "") + m["tail"], text)
    return _KEY_VALUE.sub(lambda m: m["head"] + MASK, text)


class MaskingFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose output (message, arguments and traceback) has its secrets
    masked by ``mask_secrets``."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))
