"""The shape of the code, read with ``ast`` from ``src/mmgate`` (no import runs):

* no import cycle between packages (each subpackage, and each top-level module, is one node), nor
  between the modules inside one package; imports under ``if TYPE_CHECKING:`` count (``ast.walk``
  finds every import statement, wherever it stands);
* the api package in layers: the HTTP layer (``HTTP_LAYER``: server wiring and client limits)
  imports no other api module and names no route; the pipeline (``PIPELINE``) imports no HTTP
  framework and nothing of the handlers;
* ``sim`` and ``bench`` — separate programs — import nothing from the gateway's packages;
* nothing in ``media``, ``reuse``, ``routing``, ``fleet``, ``backends``, ``store`` or ``anthropic_chat`` imports ``api`` or ``serve``;
* no private name (``_x``) imported from another package;
* no module over 350 lines.

Each rule is also run against a small made-up tree that breaks it, so a rule that cannot fail
fails here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
GATEWAY_PACKAGES = {"api", "media", "reuse", "routing", "fleet", "backends", "store", "serve"}
SEPARATE_PROGRAMS = {"sim", "bench"}
BELOW_API = {"media", "reuse", "routing", "fleet", "backends", "store", "anthropic_chat"}
MAX_LINES = 350
# The api package's layers (docs/ARCHITECTURE.md): the HTTP layer knows no route, the pipeline no
# HTTP framework; the handlers (every other api module) sit on both.
HTTP_LAYER = {"mmgate.api.edge", "mmgate.api.inflight_bodies"}
PIPELINE = {"mmgate.api.gateway", "mmgate.api.image_loads", "mmgate.api.chat_request", "mmgate.api.content_parts", "mmgate.api.police"}
HTTP_FRAMEWORKS = {"aiohttp", "multidict", "yarl", "starlette", "uvicorn", "granian", "h11", "httptools"}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted (mmgate.api.gateway)
    target: str  # the imported module, dotted (mmgate.reuse.plan)
    names: tuple[str, ...]  # names imported from it ("from X import a, b"); () for "import X"


def modules(root: Path) -> Iterator[tuple[str, Path]]:
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join(parts), path


def imports(root: Path) -> list[Import]:
    out = []
    for name, path in modules(root):
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                out += [Import(name, alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if node.level:
                    base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                    target = ".".join([*base, *([target] if target else [])])
                out.append(Import(name, target, tuple(a.name for a in node.names)))
    return [i for i in out if i.target.split(".")[0] == "mmgate"]


def node_of(module: str) -> str:
    """The package (or top-level module) a module belongs to: mmgate.api.gateway → api."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mmgate"


def package_graph(found: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for imp in found:
        src, dst = node_of(imp.module), node_of(imp.target)
        if src != dst and dst != "mmgate" and src != "mmgate":
            graph.setdefault(src, set()).add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def module_graph(found: list[Import], known: set[str]) -> dict[str, set[str]]:
    """Module → the modules of its own package it imports. ``from mmgate.api import edge`` is an
    import of the module ``mmgate.api.edge``; ``from mmgate.api import Gateway``, of the package's
    ``__init__`` (``mmgate.api``)."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        targets = [f"{imp.target}.{n}" for n in imp.names if f"{imp.target}.{n}" in known]
        if len(targets) < len(imp.names) or not imp.names:
            target = imp.target
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            targets.append(target)
        for dst in targets:
            if dst != imp.module and node_of(dst) == node_of(imp.module) != "mmgate":
                graph.setdefault(imp.module, set()).add(dst)
    return graph


def layer_faults(found: list[Import], root: Path) -> list[str]:
    bad = []
    for imp in found:
        if imp.module in HTTP_LAYER and imp.target.startswith("mmgate.api") and not any(
                imp.target == m or f"{imp.target}.{n}" == m for m in HTTP_LAYER for n in (*imp.names, "")):
            bad.append(f"{imp.module} imports {imp.target} (the HTTP layer reaching into the handlers)")
        if imp.module in PIPELINE and imp.target.startswith("mmgate.api") and not (
                imp.target in PIPELINE or all(f"{imp.target}.{n}" in PIPELINE for n in imp.names)):
            bad.append(f"{imp.module} imports {imp.target} (the pipeline reaching into the handlers)")
    for name, path in modules(root):
        dotted = f"mmgate.{name}" if name else "mmgate"
        if dotted not in HTTP_LAYER | PIPELINE:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if dotted in PIPELINE and isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                bad += [f"{dotted} imports {n} (the pipeline on an HTTP framework)" for n in names
                        if n.split(".")[0] in HTTP_FRAMEWORKS]
            if dotted in HTTP_LAYER and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and ROUTE.fullmatch(node.value):
                bad.append(f"{dotted} names the route {node.value} (the HTTP layer knows no route)")
    return bad


ROUTE = re.compile(r"/(v1|v2|health|metrics|ping|load|admin|invocations|tokenize|detokenize|pooling|score)\b[\w/.-]*")


def forbidden_imports(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        src, dst = node_of(imp.module), node_of(imp.target)
        if src in SEPARATE_PROGRAMS and dst in GATEWAY_PACKAGES:
            bad.append(f"{imp.module} imports {imp.target} (a separate program reaching into the gateway)")
        if src in BELOW_API and dst in {"api", "serve"}:
            bad.append(f"{imp.module} imports {imp.target} (the pipeline climbing back up)")
    return bad


def private_imports(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        if node_of(imp.module) == node_of(imp.target):
            continue
        private = [n for n in imp.names if n.startswith("_") and not n.endswith("__")]
        # The shared leaves mmgate._env and mmgate._settings are private to the package, not to
        # one subpackage: importing them is their purpose. A private module inside a subpackage is not.
        parts = imp.target.split(".")[2:]
        private += [p for p in parts if p.startswith("_")]
        if private:
            bad.append(f"{imp.module} imports private {', '.join(private)} from {imp.target}")
    return bad


def long_modules(root: Path) -> list[str]:
    return [f"{name}: {n} lines" for name, path in modules(root)
            if (n := len(path.read_text().splitlines())) > MAX_LINES]


def test_no_import_cycle_between_packages() -> None:
    assert find_cycle(package_graph(imports(SRC))) is None


def test_no_import_cycle_inside_a_package() -> None:
    known = {f"mmgate.{m}" if m else "mmgate" for m, _ in modules(SRC / "mmgate")}
    assert find_cycle(module_graph(imports(SRC), known)) is None


def test_the_api_package_is_in_layers() -> None:
    assert layer_faults(imports(SRC), SRC / "mmgate") == []


def test_separate_programs_and_lower_layers_import_only_downwards() -> None:
    assert forbidden_imports(imports(SRC)) == []


def test_no_private_name_imported_across_packages() -> None:
    assert private_imports(imports(SRC)) == []


def test_no_module_over_the_limit() -> None:
    assert long_modules(SRC) == []


def test_every_package_shows_one_face() -> None:
    """Each subpackage's ``__init__`` names its public API in ``__all__``."""
    root = SRC / "mmgate"
    missing = [str(p.relative_to(root)) for p in sorted(root.rglob("__init__.py"))
               if p.parent != root and "__all__" not in p.read_text()]
    assert missing == []


# --- each rule fails on a tree that breaks it ---------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = tmp_path / "mmgate" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_rules_catch_a_broken_tree(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "api/__init__.py": "from mmgate.reuse.plan import render\n",
        "reuse/__init__.py": "",
        "reuse/plan.py": "from mmgate.api import Gateway\nfrom mmgate.store.lru import _Entry\n",
        "store/__init__.py": "",
        "store/lru.py": "\n" * (MAX_LINES + 1),
        "sim/__init__.py": "",
        "sim/engine.py": "from ..media import loader\nfrom mmgate.backends._http import x\n",
    })
    found = imports(root)
    assert find_cycle(package_graph(found)) in (["api", "reuse", "api"], ["reuse", "api", "reuse"])
    bad = forbidden_imports(found)
    assert any("mmgate.reuse.plan imports mmgate.api" in b for b in bad)
    assert any("mmgate.sim.engine imports mmgate.media" in b for b in bad)  # relative import resolved
    assert any("mmgate.sim.engine imports mmgate.backends._http" in b for b in bad)
    private = private_imports(found)
    assert any("_Entry" in p for p in private) and any("_http" in p for p in private)
    assert long_modules(root) == [f"mmgate.store.lru: {MAX_LINES + 1} lines"]


def test_a_cycle_through_a_type_checking_import_is_caught(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "__init__.py": "",
        "api/__init__.py": "from mmgate.api.app import build_app\n",
        "api/app.py": "from mmgate.api import forward\n",
        "api/forward.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mmgate.api.app import X\n",
        "api/edge.py": "from aiohttp import web\nfrom mmgate.api.forward import deliver\nCHAT = '/v1/chat/completions'\n",
        "api/gateway.py": "from aiohttp import web\nfrom mmgate.api import app\n",
    })
    found = imports(root)
    known = {f"mmgate.{m}" if m else "mmgate" for m, _ in modules(root / "mmgate")}
    assert find_cycle(module_graph(found, known)) in (
        ["mmgate.api.app", "mmgate.api.forward", "mmgate.api.app"],
        ["mmgate.api.forward", "mmgate.api.app", "mmgate.api.forward"])
    faults = layer_faults(found, root / "mmgate")
    assert any("mmgate.api.edge imports mmgate.api.forward" in f for f in faults)
    assert any("mmgate.api.edge names the route /v1/chat/completions" in f for f in faults)
    assert any("mmgate.api.gateway imports aiohttp" in f for f in faults)
    assert any("mmgate.api.gateway imports mmgate.api (the pipeline" in f for f in faults)


@pytest.mark.parametrize("line", ["from mmgate._settings import Frozen", "import mmgate._env"])
def test_shared_leaves_may_be_imported(tmp_path: Path, line: str) -> None:
    root = _tree(tmp_path, {"__init__.py": "", "_settings.py": "", "_env.py": "",
                            "sim/__init__.py": line + "\n"})
    assert private_imports(imports(root)) == []
