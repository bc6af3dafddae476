"""Secrets never reach the screen: one helper masks them in every line vgpumon prints or logs.

A store URL carries its password (``postgresql+psycopg://user:secret@host/db``), and so can a
libpq keyword string (``password=secret``) or a URL's query (``?password=secret``). Every path that
prints text built from such a value goes through ``mask_secrets``: the CLI's error line, the
agent's closing summary, ``vgpumon config show`` and, through ``MaskingFormatter``, every log line
and traceback.

Other programs' command lines carry secrets too (``vllm serve … --api-key sk-…``,
``HF_TOKEN=hf_… python …``): the agent reads every GPU process's, as root, and stores and shows
them; ``mask_command_line`` masks them at the door, before anything keeps them.
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
# An environment assignment whose name says it holds a secret: HF_TOKEN=…, OPENAI_API_KEY=….
_ENV_SECRET = re.compile(
    r"(?P<head>\b[A-Za-z_][A-Za-z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|CREDENTIALS?)"
    r"[A-Za-z0-9_]*=)(?P<secret>[^\s]+)",
    re.IGNORECASE,
)
# A command-line option whose name says it takes a secret, then its value (``--api-key X``,
# ``--api-key=X``, ``--hf-token X``, ``--password=X``); ``--token-budget 5`` is not one.
_OPTION_SECRET = re.compile(
    r"(?P<head>(?<!\S)--?[A-Za-z0-9-]*(?:api-?key|token|secret|password|passwd|credentials?|access-key)"
    r"(?:=|\s+))(?P<secret>[^\s-][^\s]*)",
    re.IGNORECASE,
)
# Bearer tokens and provider keys by their shape, wherever they appear.
_TOKEN_SHAPE = re.compile(r"\b(?:sk-[A-Za-z0-9_\-]{16,}|hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|xox[abpr]-[A-Za-z0-9\-]{10,})")
_BEARER = re.compile(r"(?i)(?P<head>\bbearer\s+)(?P<secret>[A-Za-z0-9._~+/\-]+=*)")
# Any other credentials of an Authorization header (``Authorization: Basic dXNlcjpwYXNz``,
# ``Authorization: token ghp_…``, a raw key): the word after a known scheme, or after the colon.
_AUTHORIZATION = re.compile(
    r"(?i)(?P<head>\bauthorization\s*[:=]\s*(?:(?:basic|digest|token|negotiate|ntlm|apikey|aws4-hmac-sha256)\s+)?)"
    r"(?P<secret>(?!bearer\b)[^\s'\"]+)"
)


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
    if "=" in text or "@" in text:
        text = _URL_USERINFO.sub(lambda m: m["head"] + (MASK if m["secret"] else "") + m["tail"], text)
        text = _KEY_VALUE.sub(lambda m: m["head"] + MASK, text)
        text = _ENV_SECRET.sub(lambda m: m["head"] + MASK, text)
    if "-" in text:
        text = _OPTION_SECRET.sub(lambda m: m["head"] + MASK, text)
        text = _TOKEN_SHAPE.sub(MASK, text)
    elif "_" in text:
        text = _TOKEN_SHAPE.sub(MASK, text)
    if "earer" in text:
        text = _BEARER.sub(lambda m: m["head"] + MASK, text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTHORIZATION.sub(lambda m: m["head"] + MASK, text)
    return text


def mask_command_line(argv: "list[str] | tuple[str, ...]") -> str:
    """Another program's command line as one string (space-joined, as ``ps`` shows it) with its
    secrets masked: the values of ``--api-key``, ``--hf-token``, ``--password`` and similar
    options, ``*_TOKEN=``-style assignments, URL passwords and provider keys by their shape."""
    return mask_secrets(" ".join(argv))


class MaskingFormatter(logging.Formatter):
    """A ``logging.Formatter`` whose output (message, arguments and traceback) has its secrets
    masked by ``mask_secrets``."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))
