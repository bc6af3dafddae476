"""Label sets built once and the Prometheus text format (0.0.4) written straight from them.

prometheus-client's ``generate_latest`` sorts and escapes every label of every sample at every
scrape: 6.4 ms for 960 samples of three labels on the 2-core development machine, above the
5 ms budget for 8 GPUs and 8 vLLM servers (docs/benchmarks.md). A GPU's or server's labels change
only when its identity or owner does, so ``Labels`` escapes and joins them once and keeps the
variants with one more label (``reason``, ``xid``, ``percentile``, ``state``) beside them. The
text written here is byte for byte what ``generate_latest`` writes for the same families
(``tests/exporter/test_exporter.py`` holds the two equal).
"""

from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    # The text format's label-value escaping: backslash, newline, double quote.
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


class Labels:
    """An immutable label set, sorted by name, with its text form computed once.

    Attributes:
        items: ``((name, value), ...)`` sorted by name.
        text: ``name="value",...`` as the text format writes it (empty for no labels).
    """

    __slots__ = ("items", "text", "_more")

    def __init__(self, items: Iterable[tuple[str, str]]) -> None:
        self.items: tuple[tuple[str, str], ...] = tuple(sorted(items))
        self.text = ",".join(f'{k}="{_escape(v)}"' for k, v in self.items)
        self._more: dict[tuple[str, str], Labels] = {}

    def plus(self, name: str, value: str) -> "Labels":
        """This set with one more label; the result is kept, so a later call costs a lookup."""
        key = (name, value)
        out = self._more.get(key)
        if out is None:
            out = self._more[key] = Labels((*self.items, key))
        return out

    def as_dict(self) -> dict[str, str]:
        return dict(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Labels({self.text})"


class Family:
    """One metric family as served: name, type, help and its samples.

    Attributes:
        name: the family's name as exposed (counters with their ``_total``).
        type: ``gauge`` or ``counter``.
        help: the HELP text.
        samples: ``(labels, value)`` pairs in the order they are served.
    """

    __slots__ = ("name", "type", "help", "samples")

    def __init__(self, name: str, type_: str, help_: str) -> None:
        self.name = name
        self.type = type_
        self.help = help_
        self.samples: list[tuple[Labels, float]] = []

    def add(self, labels: Labels, value: float) -> None:
        self.samples.append((labels, value))

    def metric(self) -> Metric:
        """The family as a prometheus-client ``Metric`` (for ``generate_latest`` and registries)."""
        base = self.name[: -len("_total")] if self.type == "counter" else self.name
        m = Metric(base, self.help, self.type)
        for labels, value in self.samples:
            m.add_sample(self.name, labels.as_dict(), value)
        return m


def render(families: Sequence[Family]) -> bytes:
    """The text exposition (format 0.0.4) of ``families``, skipping those without samples."""
    out: list[str] = []
    append = out.append
    for fam in families:
        if not fam.samples:
            continue
        help_ = fam.help.replace("\\", r"\\").replace("\n", r"\n")
        append(f"# HELP {fam.name} {help_}\n# TYPE {fam.name} {fam.type}\n")
        name = fam.name
        for labels, value in fam.samples:
            if labels.text:
                append(f"{name}{{{labels.text}}} {floatToGoString(value)}\n")
            else:
                append(f"{name} {floatToGoString(value)}\n")
    return "".join(out).encode("utf-8")


def metrics(families: Sequence[Family]) -> Iterator[Metric]:
    """The families with samples as prometheus-client ``Metric`` objects."""
    for fam in families:
        if fam.samples:
            yield fam.metric()
