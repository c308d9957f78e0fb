"""The package's layout rules: no import circle, imports run down the layers (all but
the few listed), a package's internal modules are imported only inside it, no private
name imported across modules, no module over 700 lines.

The import graph has an edge for every ``import`` of a rho_actors module anywhere in a
module (inside functions and under ``if TYPE_CHECKING:`` too: a type-only import is a
dependency all the same), except a submodule's import of its own package (Python
initializes a package before any of its submodules, so that import never decides an
order)."""

from __future__ import annotations

import ast
import functools
import inspect
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


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The module at ``path`` parsed, once a run (each check walks every module)."""
    return ast.parse(path.read_text())


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
        for node in _imports(_tree(path)):
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


LAYERS: tuple[tuple[str, ...], ...] = (
    # 1. the tool contract
    ("rho_actors.errors", "rho_actors.encoding", "rho_actors.bounded_json", "rho_actors.tool",
     "rho_actors.function_tool", "rho_actors.cancel", "rho_actors.files", "rho_actors.events", "rho_actors.results",
     "rho_actors.declarations", "rho_actors.lifecycle"),
    # 2. OTP and telemetry; 3. child processes; 4. calls; 5. the agent loop (a model driving a Session)
    ("rho_actors.otp", "rho_actors.telemetry"),
    ("rho_actors.sandbox",),
    ("rho_actors.isolation",),
    ("rho_actors.agent",),
    # 6. the runtime core
    ("rho_actors.registry", "rho_actors.loop", "rho_actors.runtime", "rho_actors.budgets", "rho_actors.governor",
     "rho_actors.tasks"),
    # 7. what the system puts together: sources, selftests, the live view, foreign tools taken in
    ("rho_actors.sources", "rho_actors.selftest", "rho_actors.observe", "rho_actors.integrations.adopt",
     "rho_actors.integrations.host_side", "rho_actors.integrations.langgraph.langchain_tool",
     "rho_actors.integrations.openai_agents.sdk_tool", "rho_actors.integrations.pydantic_ai.pydantic_tool"),
    # 8. the system; 9. on top
    ("rho_actors.system",),
    ("rho_actors.mcp", "rho_actors.integrations", "rho_actors.cli", "rho_actors"),
)
"""The layers of DESIGN §7, lowest first: a module is in the layer of the longest
prefix listed (a package stands for every module in it)."""

UPWARD: frozenset[tuple[str, str]] = frozenset()
"""The imports that run from a layer to a higher one, all of them (none now: a lazy import
made inside a function counts too): a new one fails."""


def _layer(module: str) -> int:
    best, found = -1, len(LAYERS) - 1
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    return found


def _upward(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, t) for m, targets in graph.items() for t in targets if _layer(t) > _layer(m)}


def test_only_the_listed_imports_run_up_the_layers() -> None:
    assert _upward(_graph()) <= UPWARD, sorted(_upward(_graph()) - UPWARD)


def test_the_layer_check_finds_an_upward_import() -> None:
    assert _upward({"rho_actors.tool": {"rho_actors.system"}, "rho_actors.system": {"rho_actors.tool"}}) == {
        ("rho_actors.tool", "rho_actors.system")}


def test_the_agent_loop_needs_no_runtime() -> None:
    """The agent loop drives a ``Session`` (DESIGN §7): nothing of the agent layer imports
    the sandbox, the isolations or the runtime core above it."""
    graph = _graph()
    runtime = ("rho_actors.sandbox", "rho_actors.isolation", "rho_actors.registry", "rho_actors.loop",
               "rho_actors.runtime", "rho_actors.system")
    found = {(m, t) for m in graph if m.startswith("rho_actors.agent") for t in graph[m]
             if any(_inside(t, package) for package in runtime)}
    assert found == set()


def test_at_most_15_modules_stand_at_the_package_root() -> None:
    root = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root) <= 15, root


def test_no_private_name_is_imported_across_modules() -> None:
    offenders = []
    for name, path in _modules().items():
        for node in _imports(_tree(path)):
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
        if name in ("rho_actors.results", "rho_actors.declarations.arguments"):
            continue
        for node in ast.walk(_tree(path)):
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


FACES: tuple[str, ...] = ("rho_actors.sandbox",)
"""Packages whose submodules are internal: every module under one (its subpackages'
included, as ``sandbox/confine/``) is imported only by modules inside that package;
anything outside imports the package's face, the names its ``__init__.py`` re-exports
(DESIGN §7). Importing a submodule through the face (``from rho_actors.sandbox import
wire``), under another name, or by its dotted name as text (``import_module``) counts
the same."""


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _internal_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every import of a :data:`FACES` package's submodule from outside the package."""
    return {(m, t) for m, targets in graph.items() for t in targets for face in FACES
            if t.startswith(face + ".") and not _inside(m, face)}


def _named_internals() -> set[tuple[str, str]]:
    """Internal modules named as text (an ``import_module("rho_actors.sandbox.pool")``)
    outside their package."""
    modules = _modules()
    found = set()
    for name, path in modules.items():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
                found |= {(name, node.value) for face in FACES
                          if node.value.startswith(face + ".") and not _inside(name, face)}
    return found


def test_internal_modules_are_imported_only_inside_their_package() -> None:
    assert sorted(_internal_imports(_graph()) | _named_internals()) == []


def test_the_internals_check_finds_an_import_from_outside() -> None:
    graph = {"rho_actors.system": {"rho_actors.sandbox.pool", "rho_actors.sandbox"},
             "rho_actors.sandbox.pool": {"rho_actors.sandbox.confine.enclosure"},
             "rho_actors.sandbox": {"rho_actors.sandbox.pool"}}
    assert _internal_imports(graph) == {("rho_actors.system", "rho_actors.sandbox.pool")}


def test_every_name_of_a_face_is_its_own() -> None:
    """A face lists what it re-exports in ``__all__``, and each name is importable from it
    (no name of the face stands for one of its submodules: that would be the module)."""
    import importlib

    for face in FACES:
        package = importlib.import_module(face)
        exported = list(package.__all__)
        assert len(set(exported)) == len(exported), face
        for name in exported:
            value = getattr(package, name)
            assert not (inspect.ismodule(value)), f"{face}.{name} is a module, not a name of the face"


def test_raw_http_answers_are_written_in_one_place() -> None:
    """An HTTP answer a connection writes itself (``503`` past a client's connections,
    ``408`` past a read deadline) is made by :mod:`rho_actors.mcp.plain_answers` alone:
    no other module spells out a status line."""
    writers = []
    for name, path in _modules().items():
        if name == "rho_actors.mcp.plain_answers":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                text = node.value.decode("latin-1") if isinstance(node.value, bytes) else node.value
                if text.startswith("HTTP/1."):
                    writers.append(f"{name}:{node.lineno}")
    assert writers == []
