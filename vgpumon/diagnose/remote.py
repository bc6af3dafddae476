"""``vgpumon diagnose HOST[:PORT]`` asking the host's agent: one ``GET /api/v1/diagnose`` with the
bearer token, the answer (a report, or a JSON error) as data. Standard library only (``urllib``):
one request per command needs no event loop.

What can go wrong is told apart, because the caller decides on it (docs/diagnose.md): the agent
cannot be reached (refused, no route, name unknown, silent past the timeout) → ``AgentUnreachable``,
and ``diagnose`` falls back to the store; the agent answered with an error (a wrong token, a bad
query, a bug) → ``AgentRefused``, and ``diagnose`` says so, since the agent is up and the store
would only be older.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import cast

from vgpumon.base.errors import UsageError
from vgpumon.base.http import NoRedirects
from vgpumon.base.workers import within
from vgpumon.diagnose.schema import Report

_TARGET = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]/\s]+))(?::(?P<port>\d{1,5}))?$")


class AgentError(Exception):
    """The agent's API did not give a report."""


class AgentUnreachable(AgentError):
    """No answer from the agent at all: nothing listens there, the host is unknown or down."""


class AgentRefused(AgentError):
    """The agent answered with an error: ``status`` is its HTTP status, the message its word."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_target(text: str, default_port: int) -> tuple[str, int, bool]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port`` → ``(host, port, port_given)``.

    Raises:
        UsageError: anything else, or a port outside 1–65535.
    """
    from vgpumon.config.checks import check_hostname

    try:  # what a stored host name may be (1-255 characters, no control characters)
        check_hostname(text.strip().strip("[]"))
    except ValueError as exc:
        raise UsageError(f"host {text[:60]!r}{'…' if len(text) > 60 else ''}: {exc}") from None
    m = _TARGET.match(text.strip())
    if not m:
        raise UsageError(f"host {text!r} is not HOST or HOST:PORT (e.g. gpu-host-17, gpu-host-17:19400, [::1]:19400)")
    port = int(m.group("port")) if m.group("port") else default_port
    if not 1 <= port <= 65535:
        raise UsageError(f"port {port} of {text!r} is outside 1-65535")
    return (m.group("v6") or m.group("host")), port, m.group("port") is not None


def agent_url(host: str, port: int) -> str:
    """``http://host:port`` (IPv6 in brackets)."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def fetch_report(
    host: str,
    port: int,
    *,
    token: str | None,
    timeout: float,
    window: str | None = None,
    since: str | None = None,
    max_age: str | None = None,
    stacks: bool = False,
) -> Report:
    """The agent's ``/api/v1/diagnose`` report.

    Args:
        host, port: where the agent listens (its ``[exporter] listen``).
        token: the bearer token (``[api] token``); ``None`` sends none (an agent on loopback
            without a token needs none).
        timeout: seconds for connecting and for the whole answer.
        window, since, max_age: passed as typed (the agent parses them as the CLI would).
        stacks: ask for py-spy dumps of the host's vLLM servers.

    Returns:
        The report (the same data ``build_report`` returns on the agent's side), taken as a
        ``Report`` once it is a JSON object with ``status`` and ``host``: the agent is vgpumon
        (of its own version or another), and the renderer reads what an older agent left out
        with ``.get``.

    Raises:
        AgentUnreachable: nothing answered (connection refused, unknown name, timeout).
        AgentRefused: the agent answered with an HTTP error (its JSON message), or with
            something that is not a report.
    """
    query = {k: v for k, v in (("window", window), ("since", since), ("max_age", max_age)) if v}
    if stacks:
        query["stacks"] = "1"
    report = fetch_json(host, port, "/api/v1/diagnose" + (f"?{urllib.parse.urlencode(query)}" if query else ""), token=token, timeout=timeout)
    if not isinstance(report, dict) or "status" not in report or "host" not in report:
        raise AgentRefused(200, "the answer is not a diagnose report (is that port a vgpumon agent?)")
    return cast(Report, report)


def fetch_json(host: str, port: int, path: str, *, token: str | None, timeout: float) -> object:
    """``GET path`` of the agent's API as JSON (``fetch_report``; ``vgpumon top`` reads
    ``/api/v1/snapshot``).

    Raises:
        AgentUnreachable: nothing answered (connection refused, unknown name, timeout).
        AgentRefused: the agent answered with an HTTP error (its JSON message), or not JSON.
    """
    url = f"{agent_url(host, port)}{path}"
    request = urllib.request.Request(url, headers={"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})})  # noqa: S310  the URL is built here from a checked host and port, http only
    # proxies from the environment are for the web, not for a GPU host's agent; no redirects:
    # the token goes to the host named, never to one an answer points at
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirects())

    def fetch() -> bytes:
        with opener.open(request, timeout=timeout) as answer:
            return bytes(answer.read())

    def scrub(text: str) -> str:  # an answer may repeat the request's header: the token never shows
        return text.replace(token, "***") if token else text

    try:
        # the whole request within the timeout: urllib's bounds each read, and an agent's port
        # held by something that answers a byte every few seconds would hold diagnose for ever
        body = within(fetch, timeout + 1.0, lambda: AgentUnreachable(f"no answer within {timeout:g} s"))
    except AgentUnreachable:
        raise
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            where = str(exc.headers.get("Location", ""))[:100]
            raise AgentRefused(exc.code, scrub(f"HTTP {exc.code}: a redirect to {where!r}, not followed "
                                               "(the token goes to the host named only)")) from None
        raise AgentRefused(exc.code, scrub(_error_message(exc))) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AgentUnreachable(scrub(_why(reason))) from None
    except (http.client.HTTPException, ValueError) as exc:  # a broken status line, a reset mid-answer
        raise AgentUnreachable(scrub(f"{exc.__class__.__name__}: {exc}")) from None
    try:
        return cast(object, json.loads(body))
    except ValueError:
        raise AgentRefused(200, "the answer is not JSON (is that port a vgpumon agent?)") from None



def _error_message(exc: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(exc.read())
        return str(doc["error"]["message"])
    except Exception:  # noqa: BLE001 - not our JSON: whatever answered on that port is not an agent
        return f"HTTP {exc.code} {exc.reason} (is that port a vgpumon agent?)"


def _why(reason: object) -> str:
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "no answer in time"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, socket.gaierror):
        return "host name not known"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror.lower()
    return str(reason)
