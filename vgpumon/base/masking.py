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
# The scheme starts where a run of scheme characters starts (the lookbehind): tried at every
# letter of a long run, the match cost the square of its length (a 40 000-letter argument of
# any local user's GPU process took 10 s of the agent's time; every pattern here is linear).
_URL_USERINFO = re.compile(r"(?P<head>(?<![A-Za-z0-9+.\-])[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@]*:)(?P<secret>[^\s/]*)(?P<tail>@[^\s@/]*)")
# password=..., token=... in a query string or a libpq keyword/value string.
_KEY_VALUE = re.compile(r"(?i)(?P<head>\b(?:password|passwd|pwd|token|secret|api_key|apikey)\s*=\s*)(?P<secret>'[^']*'|[^\s&;,'\"]+)")
# An environment assignment whose name says it holds a secret: HF_TOKEN=…, OPENAI_API_KEY=….
# A name is matched first and its words looked at apart: one pattern for both ("a name, a
# secret word somewhere in it, more name, '='") backtracked through the whole name at every
# secret word in it, the square of its length (``TOKENTOKEN…`` of 200 000 letters: 215 s).
_ENV_NAME = re.compile(r"\b(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?=\S)")
_ENV_SECRET_WORD = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY|CREDENTIAL", re.IGNORECASE)
# A command-line option whose name says it takes a secret, then its value (``--api-key X``,
# ``--api-key=X``, ``--hf-token X``, ``--password=X``); ``--token-budget 5`` is not one (the
# secret word ends the name). Matched as the names above, for the same reason.
_OPTION_NAME = re.compile(r"(?<!\S)(?P<name>--?[A-Za-z0-9-]*)(?:=|\s+)(?=[^\s-])")
_OPTION_SECRET_WORD = re.compile(r"(?:api-?key|token|secret|password|passwd|credentials?|access-key)\Z", re.IGNORECASE)
_VALUE = re.compile(r"\S+")
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
        text = _mask_values(text, _ENV_NAME, _ENV_SECRET_WORD, after=1)  # a bare password= is _KEY_VALUE's
    if "-" in text:
        text = _mask_values(text, _OPTION_NAME, _OPTION_SECRET_WORD)
        text = _TOKEN_SHAPE.sub(MASK, text)
    elif "_" in text:
        text = _TOKEN_SHAPE.sub(MASK, text)
    if "earer" in text:
        text = _BEARER.sub(lambda m: m["head"] + MASK, text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTHORIZATION.sub(lambda m: m["head"] + MASK, text)
    return text


def _mask_values(text: str, names: re.Pattern[str], secret: re.Pattern[str], after: int = 0) -> str:
    """``text`` with the value (up to the next space) after each match of ``names`` whose
    ``name`` group holds a ``secret`` word (from its character ``after`` on) replaced by
    ``MASK``; other matches are passed over without taking their value, so that
    ``FOO=HF_TOKEN=…`` still masks the inner one."""
    out: list[str] = []
    pos = 0
    for m in names.finditer(text):
        if m.start() < pos or not secret.search(m["name"], after):
            continue
        value = _VALUE.match(text, m.end())
        if value is None:
            continue
        out += [text[pos : m.end()], MASK]
        pos = value.end()
    return "".join(out) + text[pos:] if out else text


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
