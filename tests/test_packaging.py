"""What pip reads: the package metadata, and the extras that every install hint names.

A hint that names an extra pyproject.toml does not define sends a user to ``pip install``
something that installs nothing (pip only warns that the extra does not exist)."""

from __future__ import annotations

import re
import sys

from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

#: an extra as a hint names it: ``vgpumon[postgres]``, ``'.[postgres,html]'``, ``/src[kubernetes,postgres]``,
#: "the postgres extra", "the `html` extra", "needs the otlp extra"
_BRACKETS = re.compile(r"(?:\bvgpumon|['\"]\.|/src)\[([a-z][a-z0-9_,-]*)\]")
_WORDED = re.compile(r"\bthe [`']*([A-Za-z0-9_-]+)[`']* extra\b")


def _hint_sources() -> list:
    files = [ROOT / "README.md", ROOT / "Containerfile", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "vgpumon").rglob("*.py")), *sorted(p for p in (ROOT / "exporters").rglob("*") if p.is_file())]
    return [p for p in files if p.suffix not in (".png", ".gz")]


def _hinted_extras() -> list[tuple[str, str]]:
    """(where, extra) for every extra named by a hint in the code, the docs and the deploy files."""
    out = []
    for path in _hint_sources():
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{n}"
            for group in _BRACKETS.findall(line):
                out += [(where, name) for name in group.split(",")]
            out += [(where, name) for name in _WORDED.findall(line)]
    return out


def test_every_install_hint_names_an_extra_that_pyproject_defines():
    extras = set(PYPROJECT["project"]["optional-dependencies"])
    hinted = _hinted_extras()
    # the hints of every optional part are found (the scan itself works)
    assert {"postgres", "html", "kubernetes", "dashboards", "otlp", "dev"} <= {name for _, name in hinted}
    unknown = [f"{where}: {name}" for where, name in hinted if name not in extras]
    assert unknown == [], "hints naming an extra that pyproject.toml does not define:\n" + "\n".join(unknown)


def test_the_license_is_an_spdx_expression():
    # the table form ({ text = ... }) is deprecated by setuptools and refused from 2027-02-18
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    requires = PYPROJECT["build-system"]["requires"]
    assert "setuptools>=77" in requires, requires  # the first setuptools that reads an SPDX string
