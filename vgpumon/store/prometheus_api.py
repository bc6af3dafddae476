"""A client of the Prometheus HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics): the history of
the agents' exported series when a fleet keeps it in a Prometheus-compatible engine instead of a
vgpumon store.

Standard library only (one request at a time; the reports ask a few dozen). Every answer is
bounded in size and time, and every way it can go wrong is one ``PrometheusUnavailableError``
with one line saying what: unreachable, no answer in time, not a Prometheus API, not JSON, too
large, an error the API reported. The bearer token, when given, goes in the ``Authorization``
header and never into a message.
"""

from __future__ import annotations

import http.client
import json
import math
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from vgpumon.base.errors import StoreUnavailableError, StoreUnreachableError
from vgpumon.base.http import NoRedirects
from vgpumon.base.masking import mask_secrets
from vgpumon.base.workers import within

#: The largest answer read (bytes): a query of one family of one host over 11 000 points per
#: series stays far below it; anything larger is refused rather than held in memory.
MAX_ANSWER_BYTES = 64 * 2**20
#: Points per series a query may return: Prometheus refuses a range query of more than 11 000
#: points per series (``exceeded maximum resolution of 11,000 points per timeseries``).
MAX_POINTS = 11_000
#: Label values are at most this long (a host name, a UUID, a bus id, an alert name).
MAX_LABEL = 255

#: Matrix: ``[(labels, [(ts, value), ...]), ...]``; values are floats, NaN left out.
Matrix = list[tuple[dict[str, str], list[tuple[float, float]]]]


class PrometheusUnavailableError(StoreUnavailableError):
    """The Prometheus API cannot answer: its answer is wrong or refused (exit 69; ``diagnose``
    UNKNOWN 3)."""


class PrometheusUnreachableError(PrometheusUnavailableError, StoreUnreachableError):
    """The Prometheus API cannot be reached or did not answer in time (exit 75; ``diagnose``
    UNKNOWN 3)."""


def quote(value: str) -> str:
    """A PromQL string literal of ``value`` (a label value in a selector)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class PrometheusApi:
    """One Prometheus-compatible HTTP API.

    Args:
        url: its base URL (``http://prometheus:9090``; a path prefix such as Mimir's
            ``/prometheus`` is kept).
        token: a bearer token for the ``Authorization`` header, or ``None``.
        timeout: seconds one request may take.
        max_bytes: the largest answer read.
    """

    def __init__(self, url: str, *, token: str | None = None, timeout: float = 10.0, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        try:
            parts = urllib.parse.urlsplit(url)
        except ValueError:
            parts = urllib.parse.urlsplit("")
        if parts.scheme not in ("http", "https") or not parts.netloc or any(c.isspace() or not c.isprintable() for c in url):
            raise PrometheusUnavailableError(f"--prometheus {mask_secrets(url)!r} is not an http:// or https:// URL")
        self.url = url.rstrip("/")
        self.where = mask_secrets(self.url)
        self._token = token
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.requests = 0

    def get(self, path: str, params: dict[str, str | list[str]]) -> Any:
        """The ``data`` of a successful answer to ``GET path?params``.

        Raises:
            PrometheusUnreachableError: no connection, or no answer within the timeout.
            PrometheusUnavailableError: an answer that is not the API's (HTML, other JSON, too
                large) or an error it reported (a bad query, a limit).
        """
        query = urllib.parse.urlencode(params, doseq=True)
        req = urllib.request.Request(f"{self.url}{path}?{query}", headers={"Accept": "application/json"})  # noqa: S310  the scheme is checked to be http(s)
        if self._token:
            req.add_header("Authorization", f"Bearer {self._token}")
        self.requests += 1
        try:
            return self._answer(path, *within(lambda: self._fetch(req), self.timeout + 1.0, self._late))
        except PrometheusUnavailableError as exc:
            # a server may repeat the request's header in what it says: the token never shows
            raise type(exc)(self._scrub(str(exc))) from None

    def _late(self) -> Exception:
        return PrometheusUnreachableError(f"Prometheus at {self.where} did not answer within {self.timeout:g} s")

    def _scrub(self, text: str) -> str:
        return text.replace(self._token, "***") if self._token else text

    def _answer(self, path: str, body: bytes, status: int) -> Any:
        try:
            doc = json.loads(body)
        except RecursionError:
            raise PrometheusUnavailableError(f"Prometheus at {self.where} answered {path} with JSON nested too deep to be a Prometheus API answer") from None
        except (ValueError, UnicodeDecodeError):
            hint = f" (HTTP {status})" if status != 200 else ""
            raise PrometheusUnavailableError(f"Prometheus at {self.where} answered {path} with something that is not JSON{hint}: is it a Prometheus API?") from None
        if not isinstance(doc, dict) or doc.get("status") not in ("success", "error"):
            raise PrometheusUnavailableError(f"Prometheus at {self.where} answered {path} with JSON that is not a Prometheus API answer")
        if doc["status"] == "error":
            error = str(doc.get("error", "no message"))[:300]
            raise PrometheusUnavailableError(f"Prometheus at {self.where} refused {path} (HTTP {status}): {error}")
        return doc.get("data")

    def _fetch(self, req: urllib.request.Request) -> tuple[bytes, int]:
        try:
            # no redirects: the token goes to the URL given, never to a host an answer points at
            with urllib.request.build_opener(NoRedirects()).open(req, timeout=self.timeout) as r:
                return self._read(r), r.status
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = str(exc.headers.get("Location", ""))[:100]
                raise PrometheusUnavailableError(f"Prometheus at {self.where} answered HTTP {exc.code}, a redirect to {where!r}: "
                                                 "not followed (the token goes to the URL given only); give the URL it names") from None
            if exc.code in (401, 403):
                raise PrometheusUnavailableError(f"Prometheus at {self.where} refused the request (HTTP {exc.code}): "
                                                 "set VGPUMON_PROMETHEUS_TOKEN to a token it accepts") from None
            if exc.code in (400, 422, 503):  # the API's own errors carry its JSON
                return self._read(exc), exc.code
            raise PrometheusUnavailableError(f"Prometheus at {self.where} answered HTTP {exc.code} ({exc.reason}): is it a Prometheus API?") from None
        except (TimeoutError, socket.timeout):
            raise PrometheusUnreachableError(f"Prometheus at {self.where} did not answer within {self.timeout:g} s") from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, (TimeoutError, socket.timeout)):
                raise PrometheusUnreachableError(f"Prometheus at {self.where} did not answer within {self.timeout:g} s") from None
            why = getattr(reason, "strerror", None) or str(reason)
            if isinstance(reason, socket.gaierror):
                why = "host name not known"
            raise PrometheusUnreachableError(f"Prometheus at {self.where} unreachable ({str(why).lower()})") from None
        except http.client.InvalidURL:
            raise PrometheusUnavailableError(f"--prometheus {self.where!r} is not a URL that can be asked") from None
        except (OSError, ValueError, http.client.HTTPException) as exc:  # a reset connection, a broken status line
            raise PrometheusUnreachableError(f"Prometheus at {self.where} unreachable ({exc.__class__.__name__}: {exc})") from None

    def _read(self, r: Any) -> bytes:
        body = r.read(self.max_bytes + 1)
        if len(body) > self.max_bytes:
            raise PrometheusUnavailableError(f"Prometheus at {self.where} answered more than {self.max_bytes / 2**20:.3g} MiB: "
                                             "ask for a shorter window")
        return bytes(body)

    # --- the calls the reports make ---------------------------------------------------------

    def label_values(self, label: str, match: str, start: float, end: float) -> list[str]:
        """The values of ``label`` on series matching ``match`` between ``start`` and ``end``."""
        data = self.get(f"/api/v1/label/{urllib.parse.quote(label)}/values", {"match[]": match, "start": _t(start), "end": _t(end)})
        if not isinstance(data, list):
            raise self._shape("label values")
        return [v for v in data if isinstance(v, str)]

    def instant(self, expr: str, at: float) -> Matrix:
        """An instant query: a vector as one point per series, a matrix (range selector) as its
        raw samples."""
        data = self.get("/api/v1/query", {"query": expr, "time": _t(at)})
        return self._matrix(data)

    def range(self, expr: str, start: float, end: float, step: float) -> Matrix:
        """A range query at ``step`` seconds."""
        data = self.get("/api/v1/query_range", {"query": expr, "start": _t(start), "end": _t(end), "step": f"{step:g}"})
        return self._matrix(data)

    def _shape(self, what: str) -> PrometheusUnavailableError:
        return PrometheusUnavailableError(f"Prometheus at {self.where} answered a {what} query in a shape the API does not have")

    def _matrix(self, data: Any) -> Matrix:
        if not isinstance(data, dict) or not isinstance(data.get("result"), list):
            raise self._shape("data")
        kind = data.get("resultType")
        out: Matrix = []
        for item in data["result"]:
            if not isinstance(item, dict) or not isinstance(item.get("metric"), dict):
                raise self._shape(str(kind))
            labels = {str(k): v for k, v in item["metric"].items() if isinstance(v, str) and len(v) <= MAX_LABEL and "\x00" not in v}
            raw: Any
            if kind == "vector":
                raw = [item.get("value")]
            elif kind == "matrix":
                raw = item.get("values")
            else:
                raise self._shape(str(kind))
            if not isinstance(raw, list):
                raise self._shape(str(kind))
            points = []
            for p in raw:
                point = _point(p)
                if point is not None:
                    points.append(point)
            out.append((labels, points))
        return out


def _t(ts: float) -> str:
    return f"{ts:.3f}"


def _point(p: Any) -> tuple[float, float] | None:
    """``[ts, "value"]`` as floats; ``None`` for NaN and anything else (skipped, as a malformed line)."""
    if not isinstance(p, list) or len(p) != 2 or not isinstance(p[1], str) or isinstance(p[0], bool):
        return None
    ts = p[0]
    if not isinstance(ts, (int, float)) or not math.isfinite(ts) or not 0 <= ts < 2**34:
        return None
    try:
        value = float(p[1])
    except ValueError:
        return None
    if math.isnan(value):  # a staleness marker (VictoriaMetrics returns them in raw samples), or no value
        return None
    return float(ts), value
