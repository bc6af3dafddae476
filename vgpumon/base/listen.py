"""The exporter's settings: where ``/metrics`` listens, which families it serves, when a reading is
too old to serve. One small dataclass, so that it becomes the ``[exporter]`` section of the
settings file once the settings object lands (docs/exporter.md).

The default port, 19400, is outside the 9100–9999 block that Prometheus' default port
allocations page hands out to exporters: that block has been fully allocated since 2023 (so any
number in it is some exporter's), and allocations continue from 10000 upwards. 19400 is neither,
nor a port of the neighbours an agent meets on a GPU host: dcgm-exporter 9400, nvidia_gpu_exporter
9835, node_exporter 9100, Prometheus 9090, Alertmanager 9093, Pushgateway 9091, Grafana 3000,
vLLM 8000, the kubelet 10250/10255, kube-proxy 10256.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PORT = 19400
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"
#: A GPU whose newest reading is older than this many tick intervals is not served as fresh.
STALE_AFTER_INTERVALS = 3.0
#: Seconds a connection has from its accept (or from a later request's first byte) to the end of
#: its request's headers; a request body is drained for at most this long after the answer.
HEADER_TIMEOUT = 10.0
#: Seconds an idle keep-alive connection is kept: above Prometheus' default scrape interval (1 m),
#: so that a scrape reuses its connection.
KEEPALIVE_TIMEOUT = 75.0
#: Connections open at once; one more sheds the oldest that waits for a request (else is closed).
MAX_CONNECTIONS = 64

_LISTEN = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\[\]]*)):(?P<port>\d{1,5})$")


class ListenError(ValueError):
    """A ``--listen`` value that is not ``host:port``, ``[v6]:port``, ``:port`` or ``off``."""


def parse_listen(text: str) -> tuple[str, int] | None:
    """``"127.0.0.1:19400"`` → ``("127.0.0.1", 19400)``; ``"[::1]:19400"`` → ``("::1", 19400)``;
    ``":19400"`` → all interfaces (``"0.0.0.0"``); ``"off"`` → ``None`` (no HTTP server).

    Raises:
        ListenError: anything else, or a port outside 1–65535.
    """
    text = text.strip()
    if text.lower() == "off":
        return None
    m = _LISTEN.match(text)
    if not m:
        raise ListenError(f"{text!r} is not host:port (e.g. 127.0.0.1:{DEFAULT_PORT}, [::1]:{DEFAULT_PORT}, :{DEFAULT_PORT}) or off")
    port = int(m.group("port"))
    if not 1 <= port <= 65535:
        raise ListenError(f"port {port} is outside 1-65535")
    if m.group("v6") is not None:
        try:
            ipaddress.IPv6Address(m.group("v6"))
        except ValueError:
            raise ListenError(f"{m.group('v6')!r} is not an IPv6 address") from None
        return m.group("v6"), port
    return (m.group("host") or "0.0.0.0"), port  # noqa: S104  '--listen :PORT' means every interface, as the operator asked


@dataclass(frozen=True)
class ExporterConfig:
    """Settings of ``/metrics`` and ``/healthz``.

    Attributes:
        listen: ``host:port`` to serve on, or ``off``; loopback by default, so that a host
            exposes nothing until its deployment says so (the deployment files set
            ``0.0.0.0:19400``). Neither endpoint asks for a token: they are read-only and hold
            no secrets.
        metrics_file: the metric selection file (``exporters/metrics.csv`` format); ``None``
            serves every family of the catalogue.
        stale_after_intervals: a GPU whose newest reading is older than this many tick intervals
            is served as down, without readings.
        header_timeout: seconds from a connection's accept (or a later request's first byte) to
            the end of the request's headers; then the connection is closed (docs/security.md).
        keepalive_timeout: seconds an idle keep-alive connection is kept open.
        max_connections: connections open at once; the next one closes the oldest connection
            that waits for a request, or itself when every one is being answered.
    """

    listen: str = DEFAULT_LISTEN
    metrics_file: Path | None = None
    stale_after_intervals: float = STALE_AFTER_INTERVALS
    header_timeout: float = HEADER_TIMEOUT
    keepalive_timeout: float = KEEPALIVE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS

    @property
    def address(self) -> tuple[str, int] | None:
        """``(host, port)``, or ``None`` when serving is off.

        Raises:
            ListenError: ``listen`` is malformed.
        """
        return parse_listen(self.listen)
