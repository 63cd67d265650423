"""The lab apart from the product, read with ``ast`` (nothing runs): no benchmark edits ``sys.path``
(``benchmarks`` and ``tests.support`` import through the venv's path, ``make install-test``), no
test imports a benchmark (they run one as a process), every script sits in ``regression/``,
``studies/`` or ``servers/``, every regression run takes ``--quick`` and is either run by
``test_quick.py`` or named there as left out, so a new one cannot go untested unnoticed, and every
study that takes ``--quick`` is run there too."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.benchmarks.test_quick import QUICK

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "benchmarks"
# Regression runs test_quick.py leaves out (its docstring says why), and those without --quick yet.
NOT_QUICK_TESTED = {"fleet_faults", "sim_fidelity", "agent_capacity"}
NO_QUICK_YET: set[str] = set()


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def scripts(group: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((BENCHMARKS / group).glob("*.py")) if p.stem != "__init__"}


def test_no_benchmark_edits_sys_path() -> None:
    edits = [f"{p.relative_to(ROOT)}:{node.lineno}" for p in BENCHMARKS.rglob("*.py")
             for node in ast.walk(tree(p))
             if isinstance(node, ast.Attribute) and node.attr == "path"
             and isinstance(node.value, ast.Name) and node.value.id == "sys"]
    assert edits == []


def test_no_test_imports_a_benchmark() -> None:
    found = []
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(tree(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "benchmarks"]
    assert found == []


def test_every_script_has_its_group() -> None:
    loose = [p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")]
    assert loose == [], "a script goes under regression/, studies/ or servers/"


def has_quick(path: Path) -> bool:
    """Whether the script assigns a module-level ``QUICK`` (its ``--quick`` workload)."""
    return "QUICK" in {t.id for node in tree(path).body if isinstance(node, ast.Assign) for t in node.targets
                       if isinstance(t, ast.Name)}


def quick_runs(group: str) -> set[str]:
    return {name for name, spec in QUICK.items() if spec.group == group}


def test_every_regression_run_has_a_quick_mode_that_a_test_runs() -> None:
    runs = scripts("regression")
    assert {name for name, path in runs.items() if not has_quick(path)} == NO_QUICK_YET
    assert set(runs) == quick_runs("regression") | NOT_QUICK_TESTED
    assert not set(QUICK) & NOT_QUICK_TESTED


def test_every_study_with_a_quick_mode_is_run() -> None:
    studies = scripts("studies")
    assert {name for name, path in studies.items() if has_quick(path)} == quick_runs("studies")
    assert set(QUICK) <= set(scripts("regression")) | set(studies)
