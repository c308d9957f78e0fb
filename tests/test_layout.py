"""The package's layout rules: no import circle, nothing below the agent layer imports
it, no private name imported across modules, no module over 700 lines.

The import graph has an edge for every ``import`` of a rho_actors module anywhere in a
module (inside functions and under ``if TYPE_CHECKING:`` too: a type-only import is a
dependency all the same), except a submodule's import of its own package (Python
initializes a package before any of its submodules, so that import never decides an
order)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "rho_actors"
MAX_LINES = 700
OVER_MAX: dict[str, int] = {}
"""Modules still over the limit, each with the most lines it may have until it is split."""


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (functions and ``if TYPE_CHECKING:`` too)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for sub_node in ast.iter_child_nodes(node):
            visit(sub_node)

    visit(tree)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.module is None or node.level:
                continue
            else:
                targets = [
                    f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name and not name.startswith(t + "."))
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return found


def test_no_import_circle() -> None:
    assert _cycles(_graph()) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nothing_below_the_agent_layer_imports_it() -> None:
    graph = _graph()
    agent_layer = {"rho_actors.agent", "rho_actors.model", "rho_actors.providers", "rho_actors.provider_rules",
                   "rho_actors.provider_schemas",
                   "rho_actors.transcript", "rho_actors.prompt_events"}
    core = {"rho_actors.call", "rho_actors.registry", "rho_actors.system", "rho_actors.loop_actor",
            "rho_actors.declarations", "rho_actors.declaration_actor", "rho_actors.results"}
    core |= {name for name in graph if name.startswith(("rho_actors.isolation", "rho_actors.sandbox"))}
    assert {(m, t) for m in core for t in graph[m] if t in agent_layer} == set()


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = []
    for name, path in _modules().items():
        for node in _imports(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rho_actors"):
                offenders += [f"{name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []


def test_no_module_is_over_700_lines() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert {name: n for name, n in sizes.items() if n > OVER_MAX.get(name, MAX_LINES)} == {}


def _call_name(node: ast.Call) -> str | None:
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _written_text(node: ast.expr) -> bool:
    """Whether ``node`` is text written in place: a string literal or an f-string."""
    return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant) and isinstance(node.value, str))


def test_model_visible_text_is_written_only_in_the_results_table() -> None:
    """Every error text a model sees comes from ``results.TEXTS`` (DESIGN §4): outside
    ``results.py`` (and ``arguments.py``, whose per-violation texts live with the checks),
    an error result's or a ``ToolFailure``'s message is never a literal written in place,
    and every key given to ``failure``/``text`` is in the table."""
    from rho_actors.results import TEXTS

    written, unknown = [], []
    for name, path in _modules().items():
        if name in ("rho_actors.results", "rho_actors.arguments"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = _call_name(node)
            message = {"error_result": 3, "ToolFailure": 1}.get(called or "")
            if message is not None and len(node.args) > message and _written_text(node.args[message]):
                written.append(f"{name}:{node.lineno}")
            if called in ("failure", "text") and node.args and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
                if isinstance(key, str) and key not in TEXTS:
                    unknown.append(f"{name}:{node.lineno}: {key!r}")
    assert written == [] and unknown == []
