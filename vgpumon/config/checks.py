"""The settings' value checks that need no settings model: host names, vLLM and alert URLs, store
URLs, listen addresses. Each takes the value as written and returns it as kept, or raises
``ValueError`` with the line the user reads; the sections (``vgpumon.config.sections``) run them as
validators, and other commands may call them on a value of their own."""

from __future__ import annotations

import re
from typing import Any

from vgpumon.base.masking import mask_secrets


def check_hostname(name: str) -> str:
    """A host name as stored: 1–255 characters (the ``hosts.hostname`` column), no control
    characters (they would break log lines and reports). Unicode and punctuation are fine.

    Raises:
        ValueError: empty, too long or with control characters.
    """
    if not name.strip():
        raise ValueError("empty host name")
    if len(name) > 255:
        raise ValueError(f"host name of {len(name)} characters; at most 255")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ValueError("host name with control characters")
    return name


def normalise_vllm_url(text: str) -> str:
    """A vLLM base URL: ``http(s)://host:port`` (``host:port`` means ``http://host:port``),
    without a trailing slash.

    Raises:
        ValueError: not a URL of a host (spaces, no host, a port that is not a number).
    """
    from urllib.parse import urlsplit

    raw = text.strip()
    url = raw if "://" in raw else f"http://{raw}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        raise ValueError(f"{raw!r} is not a URL (e.g. http://127.0.0.1:8000)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or not c.isprintable() for c in raw) or not raw:
        raise ValueError(f"{raw!r} is not an http(s) URL of a host (e.g. http://127.0.0.1:8000)")
    _check_url_host(parts.hostname)
    return url.rstrip("/")


def _check_url_host(host: str) -> None:
    """A URL's host as a resolver takes it: at most 253 characters, labels of 1 to 63 (IDNA).
    A longer one was accepted and failed every poll or delivery with a traceback (``label too
    long`` from the ``idna`` codec).

    Raises:
        ValueError: the host cannot be a host name.
    """
    if len(host) > 253:
        raise ValueError(f"a URL's host of {len(host)} characters; at most 253")
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise ValueError(f"{host[:80]!r} is not a host name ({exc})") from None


def check_otlp_url(text: str | None) -> str | None:
    """An OpenTelemetry collector's OTLP/HTTP URL (``http(s)://host:4318`` or its ``/v1/metrics``)."""
    return None if text is None else check_alert_url(text, example="http://otel-collector:4318")


def check_alert_url(text: str, example: str = "http://alertmanager:9093") -> str:
    """Where alerts are sent (a webhook, an Alertmanager): an ``http(s)://host[:port][/path]``
    URL, scheme written out (a typo must not become a host name that is never reached).

    Raises:
        ValueError: another scheme, no host, a bad port, spaces.
    """
    from urllib.parse import urlsplit

    raw = text.strip()
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in range
    except ValueError:
        raise ValueError(f"{raw!r} is not a URL (e.g. {example})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() or not c.isprintable() for c in raw):
        raise ValueError(f"{raw!r} is not an http(s) URL of a host (e.g. {example})")
    _check_url_host(parts.hostname)
    return raw


def check_store_url(url: str) -> str:
    """A store URL as ``--db`` takes it: a SQLAlchemy URL of SQLite or Postgres, or a plain path
    of a SQLite file.

    Raises:
        ValueError: empty, not parseable, another database, or a SQLite URL without a file.
    """
    if not url.strip():
        raise ValueError("empty store URL (e.g. sqlite:///vgpumon.db, or a file path)")
    if "://" not in url:
        return url  # a plain file path
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise ValueError(f"not a database URL: {mask_secrets(url)!r} (e.g. sqlite:///vgpumon.db)") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise ValueError(f"vgpumon stores into SQLite or Postgres, not {backend!r}")
    if backend == "sqlite" and not parsed.database:
        raise ValueError("a SQLite store needs a file: sqlite:///path/to/vgpumon.db")
    if backend == "sqlite" and (parsed.database == ":memory:" or str(parsed.query.get("mode", "")) == "memory"):
        raise ValueError("an in-memory SQLite store keeps nothing and no other command can read it; give a file: sqlite:///path/to/vgpumon.db")
    return url


def split_words(value: Any) -> Any:
    # VGPUMON_VLLM_URLS="http://a:8000 http://b:8000" (whitespace or commas between URLs)
    return [w for w in re.split(r"[\s,]+", value) if w] if isinstance(value, str) else value


def check_listen(v: str) -> str:
    """An address to listen on as ``[exporter] listen`` takes it (``vgpumon.base.listen``)."""
    from vgpumon.base.listen import ListenError, parse_listen

    try:
        parse_listen(v)
    except ListenError as exc:
        raise ValueError(str(exc)) from None
    return v.strip()


def check_alert_urls(v: list[str]) -> list[str]:
    """``check_alert_url`` of each URL of a list (``[rules] webhooks``, ``alertmanagers``)."""
    return [check_alert_url(u) for u in v]
