"""The package's import graph against the layer table of docs/architecture.md ("Packages and the
direction of imports"): no import runs against the ranks, none between siblings of one rank, no
cycle between modules. Every import counts — module-level, lazy inside a function, and under
``TYPE_CHECKING`` (a type is a dependency too) — read with ``ast``, so nothing is imported."""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vgpumon"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
#: generated code: protobuf stubs and Alembic revisions, neither written nor imported by hand
GENERATED = ("vgpumon/sources/podresources/", "vgpumon/store/migrations/versions/")


#: Imports against the table that docs/architecture.md names as open exceptions, each with its
#: reason: (importing module, imported module). Keep it short; a new entry needs its paragraph there.
EXCEPTIONS: set[tuple[str, str]] = set()


def layer_table(text: str) -> dict[str, int]:
    """``{package: rank}`` from the table under "Packages and the direction of imports"."""
    section = text.split("## Packages and the direction of imports", 1)[1].split("\n## ", 1)[0]
    ranks: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for name in re.findall(r"`(vgpumon[\w.]*)`", cells[1]):
                ranks[name] = int(cells[0])
    return ranks


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = PACKAGE) -> dict[str, Path]:
    return {
        module_name(p): p
        for p in sorted(root.rglob("*.py"))
        if not any(str(p.relative_to(ROOT)).startswith(g) for g in GENERATED)
    }


def imports(path: Path, name: str, known: set[str]) -> list[tuple[str, int]]:
    """``(imported module, line)`` for every vgpumon import in the file, resolved to the deepest
    module of the package that it names."""
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in known else prefix for a in node.names]
        for target in targets:
            if target != "vgpumon" and not target.startswith("vgpumon."):
                continue
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target != name:
                out.append((target, node.lineno))
    return out


def package_of(module: str, ranks: dict[str, int]) -> str:
    """The longest entry of the layer table that the module belongs to."""
    best = ""
    for pkg in ranks:
        # the root entry is the package's own __init__ only: a loose module at the top is in no package
        inside = module == pkg or (pkg != "vgpumon" and module.startswith(pkg + "."))
        if inside and len(pkg) > len(best):
            best = pkg
    return best


def violations(root: Path, ranks: dict[str, int]) -> list[str]:
    """Every import against the table, and every module outside it."""
    mods = modules(root)
    known = set(mods)
    bad: list[str] = []
    for name, path in mods.items():
        own = package_of(name, ranks)
        if not own:
            bad.append(f"{path.relative_to(ROOT)}: module {name} is in no package of the layer table")
            continue
        for target, line in imports(path, name, known):
            other = package_of(target, ranks)
            if not other or other == own or (name, target) in EXCEPTIONS:
                continue
            where = f"{path.relative_to(ROOT)}:{line}: {name} imports {target}"
            if ranks[other] > ranks[own]:
                bad.append(f"{where}: upward ({own} is rank {ranks[own]}, {other} rank {ranks[other]})")
            elif ranks[other] == ranks[own]:
                bad.append(f"{where}: a sibling of the same rank {ranks[own]}")
        if own == "vgpumon.exporter":
            bad += [f"{path.relative_to(ROOT)}:{line}: the exporter imports {t}: it reads snapshots, not sources"
                    for t, line in imports(path, name, known) if t.startswith("vgpumon.sources")]
        if own == "vgpumon.config":
            bad += [f"{path.relative_to(ROOT)}:{line}: config imports {t}: nothing above rank 2"
                    for t, line in imports(path, name, known)
                    if package_of(t, ranks) != own  # the config package's own modules
                    and ranks.get(package_of(t, ranks), 0) > 2 and (name, t) not in EXCEPTIONS]
    return sorted(set(bad))


def cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    mods = modules(root)
    known = set(mods)
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for target, _ in imports(path, name, known):
            # a package's __init__ re-exporting its modules is not a cycle with them
            if not target.startswith(name + "."):
                graph[name].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return found


RANKS = layer_table(ARCHITECTURE.read_text())


def test_the_layer_table_names_every_package_once() -> None:
    assert RANKS["vgpumon.base"] == 0
    assert RANKS["vgpumon.__main__"] == max(RANKS.values())
    top = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
    top.discard("__init__")
    missing = sorted(f"vgpumon.{t}" for t in top if f"vgpumon.{t}" not in RANKS)
    assert not missing, f"packages or modules at the top of vgpumon/ missing from the layer table: {missing}"


def test_imports_run_down_the_layers() -> None:
    bad = violations(PACKAGE, RANKS)
    assert not bad, "imports against docs/architecture.md's layer table:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    found = cycles(PACKAGE)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        f = tmp_path / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp_path


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from vgpumon.agent import Agent\n", "upward"),
        ("def f():\n    from vgpumon.agent.scheduler import Agent\n", "upward"),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vgpumon.cli import app\n", "upward"),
        ("from vgpumon.sources import nvml\n", "a sibling"),
        ("from vgpumon.model import Snapshot\n", None),
    ],
)
def test_the_check_fails_on_an_upward_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                             expected: str | None) -> None:
    """The checker itself: a store module that imports the agent (at module level, lazily or only
    for types) or a source is caught; one that imports the model is not."""
    me = sys.modules[__name__]  # the checker is this module's own code
    root = _tree(tmp_path, {
        "vgpumon/__init__.py": "",
        "vgpumon/model/__init__.py": "Snapshot = 1\n",
        "vgpumon/sources/__init__.py": "",
        "vgpumon/sources/nvml.py": "",
        "vgpumon/agent/__init__.py": "",
        "vgpumon/agent/scheduler.py": "",
        "vgpumon/cli/__init__.py": "",
        "vgpumon/store/__init__.py": "",
        "vgpumon/store/writes.py": source,
    })
    monkeypatch.setattr(me, "ROOT", root)
    bad = violations(root / "vgpumon", RANKS)
    if expected is None:
        assert bad == []
    else:
        assert len(bad) == 1 and expected in bad[0] and "vgpumon/store/writes.py" in bad[0], bad


def test_the_check_finds_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    me = sys.modules[__name__]
    root = _tree(tmp_path, {
        "vgpumon/__init__.py": "",
        "vgpumon/rules/__init__.py": "",
        "vgpumon/rules/a.py": "from vgpumon.rules import b\n",
        "vgpumon/rules/b.py": "def f():\n    from vgpumon.rules.a import x\n",
    })
    monkeypatch.setattr(me, "ROOT", root)
    assert cycles(root / "vgpumon") == [["vgpumon.rules.a", "vgpumon.rules.b"]]
