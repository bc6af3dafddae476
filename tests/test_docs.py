"""The docs cite files that exist: a module moved without its citations leaves a newcomer reading
about a file that is not there."""

from __future__ import annotations

import re

from conftest import ROOT

#: `path/to/module.py` in backticks, as the docs cite code and tests
_CITED = re.compile(r"`((?:vgpumon|tests|bench|sources|store|rules|exporter|agent|diagnose|capacity)/[\w/.-]*\.py)")


def _candidates(path: str) -> list[str]:
    # docs say `sources/nvml/source.py` inside vgpumon's own sections, `tests/...` for tests
    return [path, f"vgpumon/{path}"]


def test_every_cited_module_exists():
    missing = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            for path in _CITED.findall(line):
                if not any((ROOT / c).exists() for c in _candidates(path)):
                    missing.append(f"{doc.relative_to(ROOT)}:{n}: {path}")
    assert missing == [], "cited files that do not exist:\n" + "\n".join(missing)
