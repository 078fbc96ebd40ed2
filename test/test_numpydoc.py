"""The library's docstrings: every public function of two or more parameters has
numpydoc ``Parameters`` naming each (and ``Returns`` or ``Yields`` where it gives
something back), as Earth2Studio's own do."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

PACKAGE = Path(__file__).resolve().parents[1] / "earth2studio_compile"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


_SECTION = re.compile(r"^\s*-{3,}\s*$")


def _sections(doc: str) -> dict[str, list[str]]:
    """A numpydoc docstring's sections: title -> the lines under it."""
    lines = inspect.cleandoc(doc).splitlines()
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for k, line in enumerate(lines):
        if _SECTION.match(line):
            continue
        if k + 1 < len(lines) and line.strip() and _SECTION.match(lines[k + 1]):
            current = found.setdefault(line.strip(), [])
        elif current is not None:
            current.append(line)
    return found


def _documented(doc: str | None) -> set[str] | None:
    """Names a docstring's Parameters section gives; None without that section."""
    body = _sections(doc or "").get("Parameters")
    if body is None:
        return None
    indents = [len(s) - len(s.lstrip()) for s in body if s.strip()]
    names: set[str] = set()
    for line in body:
        if line.strip() and len(line) - len(line.lstrip()) == min(indents):
            head = line.split(" : ")[0]
            names.update(n.strip().lstrip("*") for n in head.split(","))
    return names


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """The nodes of a function's own body, not of functions or lambdas in it."""
    out: list[ast.AST] = []
    todo = list(ast.iter_child_nodes(fn))
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


def _gives(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The section a function's result needs: "Returns", "Yields" or None."""

    def valued(node: ast.Return | ast.Yield | ast.YieldFrom) -> bool:
        value = node.value
        return value is not None and not (
            isinstance(value, ast.Constant) and value.value is None
        )

    nodes = _own_nodes(fn)
    yields = [n for n in nodes if isinstance(n, (ast.Yield, ast.YieldFrom))]
    if yields:
        return "Yields" if any(valued(n) for n in yields) else None
    returned = fn.returns is not None and ast.unparse(fn.returns) not in (
        "None",
        "NoReturn",
    )
    if returned or any(valued(n) for n in nodes if isinstance(n, ast.Return)):
        return "Returns"
    return None


def _is_stub(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = fn.body[1:] if ast.get_docstring(fn) is not None else fn.body
    return all(
        isinstance(s, ast.Expr)
        and isinstance(s.value, ast.Constant)
        and s.value.value is Ellipsis
        for s in body
    )


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    a = fn.args
    names = [p.arg for p in a.posonlyargs + a.args]
    static = any(ast.unparse(d) == "staticmethod" for d in fn.decorator_list)
    if method and not static and names and names[0] in ("self", "cls"):
        names = names[1:]
    names += [p.arg for p in a.kwonlyargs]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return names


Function = ast.FunctionDef | ast.AsyncFunctionDef
_METH = re.compile(r":meth:`~?([\w.]+)`")


def _public_functions() -> dict[str, tuple[Path, Function, ast.ClassDef | None]]:
    """The library's public functions and methods by qualified name (see the
    numpydoc test for what counts)."""
    found: dict[str, tuple[Path, Function, ast.ClassDef | None]] = {}

    def walk(path: Path, prefix: str, body: list[ast.stmt], owner: Any) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                walk(path, f"{prefix}.{node.name}", node.body, node)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not node.name.startswith("_") or node.name == "__init__":
                    found[f"{prefix}.{node.name}"] = (path, node, owner)

    for path in sorted(PACKAGE.rglob("*.py")):
        if "tools" not in path.relative_to(PACKAGE).parts:
            walk(path, _module_name(path), ast.parse(path.read_text()).body, None)
    return found


def _doc_offence(
    fn: Function,
    owner: ast.ClassDef | None,
    functions: dict[str, tuple[Path, Function, ast.ClassDef | None]],
) -> str | None:
    """What ``fn``'s docstring lacks (None: nothing)."""
    params = _params(fn, owner is not None)
    if len(params) < 2 or any(
        ast.unparse(d).endswith("overload") for d in fn.decorator_list
    ):
        return None
    doc = ast.get_docstring(fn)
    # An implementation documented where it is declared (a Protocol's method).
    refers = [m for m in _METH.findall(doc or "") if m.endswith(f".{fn.name}")]
    if refers and refers[0] in functions and _documented(doc) is None:
        _, fn_doc, owner_doc = functions[refers[0]]
        if _doc_offence(fn_doc, owner_doc, functions) is not None:
            return f"{refers[0]}, which it refers to, is not documented"
        doc = ast.get_docstring(fn_doc)
    have = _documented(doc)
    protocol = owner is not None and any(
        ast.unparse(b).endswith("Protocol") for b in owner.bases
    )
    if have is None and owner is not None:
        # numpydoc documents __init__ in the class docstring; a Protocol may
        # document its stubs' parameters there too.
        if fn.name == "__init__" or (protocol and _is_stub(fn)):
            have = _documented(ast.get_docstring(owner))
    if have is None:
        return "no Parameters section"
    missing = [p for p in params if p not in have]
    if missing:
        return f"Parameters lacks {', '.join(missing)}"
    gives = _gives(fn)
    if gives and fn.name != "__init__" and gives not in _sections(doc or ""):
        return f"no {gives} section"
    return None


def test_public_functions_of_two_or_more_parameters_have_numpydoc_parameters():
    """Every public function and method of the library (not the tooling) that takes
    two or more parameters has a numpydoc ``Parameters`` section naming each one,
    and ``Returns`` (``Yields`` for a generator) where it gives something back.

    Rules: public means a module-level function, or a method of a public class
    (nested classes too), whose name does not start with ``_``, plus ``__init__``;
    ``self``/``cls`` are not counted, ``*args``/``**kwargs`` are; an entry naming
    several (``args, kwargs : tuple, dict``) counts for each. A function gives
    something back when its return annotation is not ``None`` or it returns a
    value. ``@overload`` signatures are skipped. Documented elsewhere, and so
    passing: ``__init__``'s parameters in the class docstring (numpydoc's
    convention); a ``Protocol`` method stub's (a body of only a docstring and
    ``...``) in the Protocol's class docstring; and those of a method whose
    docstring has no Parameters section but a ``:meth:`` reference to a documented
    method of the same name (an implementation pointing to the Protocol method it
    implements), checked against that method's docstring.
    """
    functions = _public_functions()
    found = []
    for name, (path, fn, owner) in functions.items():
        why = _doc_offence(fn, owner, functions)
        if why:
            where = path.relative_to(PACKAGE.parent)
            found.append(f"{where}:{fn.lineno} {name}: {why}")
    assert not found, "\n".join(found)
