"""The package's shape: no import circle, the library never imports its tooling."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "earth2studio_compile"
NAME = "earth2studio_compile"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Package modules ``path`` imports anywhere in it, inside functions too."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import mod` imports the module pkg.mod where there is one
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        # A package's __init__ is run by every import of its modules: importing
        # a parent is not an edge of its own.
        graph[name] = {m for m in _imports(path, modules) if m != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_circle_even_through_imports_inside_functions():
    graph = _graph()
    # The top-level package re-exports the library; its modules never import it.
    graph = {k: {m for m in v if m != NAME} for k, v in graph.items() if k != NAME}
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_library_never_imports_its_tooling():
    graph = _graph()
    library = [m for m in graph if not m.startswith(f"{NAME}.tools")]
    wrong = {
        m: sorted(x for x in graph[m] if x.startswith(f"{NAME}.tools")) for m in library
    }
    assert not {m: v for m, v in wrong.items() if v}
