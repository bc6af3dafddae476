"""The metrics reference is generated from the catalogue and covers every field."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from vgpumon.catalogue import FIELDS, render_markdown
from vgpumon.model import GpuIdentity, GpuSample

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
NOT_METRICS = {"ts", "uuid", "index", "up", "missing"}


def test_every_sample_and_identity_field_is_in_the_catalogue():
    names = {f.name for f in FIELDS}
    wanted = {f.name for f in fields(GpuSample)} | {f.name for f in fields(GpuIdentity)}
    assert sorted(wanted - NOT_METRICS - names) == []
    assert sorted(names - wanted - {"uuid"}) == []


def test_units_are_base_units_in_names():
    for f in FIELDS:
        if f.name.endswith("_bytes"):
            assert f.unit == "bytes", f.name
        if f.name.endswith("_ratio"):
            assert f.unit == "ratio", f.name
        if f.name.endswith("_hertz"):
            assert f.unit == "Hz", f.name
        assert not f.name.endswith(("_percent", "_milliwatts", "_mib", "_mhz")), f.name


def test_docs_metrics_md_is_generated_from_the_catalogue():
    assert DOC.read_text() == render_markdown(), "run: python -m vgpumon.catalogue > docs/metrics.md"


def test_the_store_imports_no_source():
    """History must not depend on the code that reads hardware: what crosses from a source to the
    store is model (``vgpumon.model``). Checked on the source text, so a lazy import counts too."""
    import ast

    store_dir = Path(__file__).resolve().parents[1] / "vgpumon" / "store"
    offenders = []
    for path in sorted(store_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("vgpumon.sources")]
    assert offenders == []
