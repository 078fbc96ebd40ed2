"""The package's shape: no import circle, the library never imports its tooling,
only ``earth2studio_compile._torch`` reaches PyTorch's internals, and the tests
mirror the package (a test module per library module, none reaching another
module's private names). The docstrings' audit is test_numpydoc.py."""

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


# The one package that touches PyTorch internals ---------------------------

ADAPTOR = PACKAGE / "_torch"  # the only place allowed torch's internals


def _outside_the_adaptor() -> list[Path]:
    """The package's modules, less those of ``earth2studio_compile._torch``."""
    return [p for p in PACKAGE.rglob("*.py") if not p.is_relative_to(ADAPTOR)]


def test_the_adaptor_is_the_torch_package_and_only_it():
    # Guards the two tests below against exempting too much (or nothing).
    assert ADAPTOR == PACKAGE / "_torch"
    outside = {p.relative_to(PACKAGE).as_posix() for p in _outside_the_adaptor()}
    assert "region.py" in outside and "executors/dynamo.py" in outside
    assert not any(p.startswith("_torch/") for p in outside), outside
    assert len(list(ADAPTOR.glob("*.py"))) > 1


def test_only_the_adaptor_imports_torch_internals():
    private = ("torch._dynamo", "torch._inductor", "torch._subclasses", "torch.utils._")
    offenders = []
    for path in _outside_the_adaptor():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith(private)]
    assert not offenders, offenders


def _torch_private_names() -> set[str]:
    """Private attribute names of torch's module, ``nn.Module``, ``Tensor`` and
    compiled modules: what only ``_torch``'s modules may reach."""
    import torch
    from torch._dynamo.eval_frame import OptimizedModule

    objects = (torch, torch.nn.Module, torch.nn.Module(), torch.Tensor, OptimizedModule)
    names = {
        n
        for obj in objects
        for n in dir(obj)
        if n.startswith("_") and not n.startswith("__")
    }
    # Set in OptimizedModule.__init__, so absent from dir() of the class.
    return names | {"_orig_mod", "dynamo_ctx"}


def test_only_the_adaptor_reaches_private_torch_attributes():
    """By attribute (``x._version``), or by name (``__dict__["_compiled_call_impl"]``,
    ``hasattr(m, "_orig_mod")``), not only by import."""
    private = _torch_private_names()
    offenders = []
    for path in _outside_the_adaptor():
        for node in ast.walk(ast.parse(path.read_text())):
            name = None
            if isinstance(node, ast.Attribute) and node.attr in private:
                owner = node.value
                if not (isinstance(owner, ast.Name) and owner.id in ("self", "cls")):
                    name = node.attr
            elif isinstance(node, ast.Constant) and node.value in private:
                name = node.value
            if name is not None:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {name}")
    assert not offenders, offenders


# The tests mirror the package ----------------------------------------------

TESTS = PACKAGE.parent / "test"

# Library modules without a test module of their own, and why. Everything else
# outside tools/ (and ``__init__.py`` files) has one at the mirrored path.
UNMIRRORED = {
    # The adaptor's modules: their features are tested through _torch/test_probes.py
    # (each one missing) and through every compile the suite runs.
    "_torch/caches.py": "test_cache.py",
    "_torch/cudagraphs.py": "test_gpu.py",
    "_torch/dynamo.py": "executors/test_executors_dynamo.py, test_options.py",
    "_torch/fp32_scope.py": "test_precision.py",
    "_torch/inductor.py": "test_options.py",
    "_torch/modules.py": "test_session.py (models restored exactly)",
    "_torch/precision_flags.py": "test_precision.py",
    "_torch/pytree.py": "test_region.py",
}

# Private names a test reaches that it should not, left for a follow-up (files
# others were editing when the rule came): "test path: module.name".
REACHES_LEFT: set[str] = set()


def _mirror(module: Path) -> list[Path]:
    """The paths a library module's test may have: ``test/<dir>/test_<m>.py``, or
    ``test/<dir>/test_<dir>_<m>.py`` where ``<m>`` names modules of two packages
    (test module basenames are unique: pytest imports them by basename)."""
    rel = module.relative_to(PACKAGE)
    where = TESTS / rel.parent
    stem = rel.stem.strip("_")  # __main__.py: test_main.py
    paths = [where / f"test_{stem}.py"]
    if rel.parent.parts:
        paths.append(where / f"test_{rel.parent.name.lstrip('_')}_{stem}.py")
    return paths


def _mirrored(test: Path) -> str | None:
    """The library module a test module mirrors (None: a cross-cutting test)."""
    for module in PACKAGE.rglob("*.py"):
        if test in _mirror(module):
            return _module_name(module)
    return None


def _library_modules() -> list[Path]:
    return [
        p
        for p in sorted(PACKAGE.rglob("*.py"))
        if p.name != "__init__.py" and "tools" not in p.relative_to(PACKAGE).parts
    ]


def test_every_library_module_has_a_test_module_at_the_mirrored_path():
    missing = [
        f"{p.relative_to(PACKAGE).as_posix()}: {_mirror(p)[0].relative_to(TESTS)}"
        for p in _library_modules()
        if p.relative_to(PACKAGE).as_posix() not in UNMIRRORED
        and not any(t.exists() for t in _mirror(p))
    ]
    assert not missing, "\n".join(missing)
    # An exemption for a module that is gone, or that has a test now, is stale.
    stale = [
        m
        for m in UNMIRRORED
        if not (PACKAGE / m).exists() or any(t.exists() for t in _mirror(PACKAGE / m))
    ]
    assert not stale, stale


def test_test_module_basenames_are_unique():
    names = [p.name for p in TESTS.rglob("*.py")]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_test_modules_share_code_through_helpers_never_through_one_another():
    # A class moved between test modules broke a GPU test's import, which no CPU run
    # executes: helpers (conftest, *_helpers, tiny_cores) are the only shared code.
    tests = {p.stem for p in TESTS.rglob("test_*.py")}
    found = []
    for path in TESTS.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in tests:
                found.append(f"{path.relative_to(TESTS)}:{node.lineno} {node.module}")
            elif isinstance(node, ast.Import):
                found += [
                    f"{path.relative_to(TESTS)}:{node.lineno} {a.name}"
                    for a in node.names
                    if a.name in tests
                ]
    assert not found, found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches(path: Path, modules: set[str]) -> list[tuple[int, str]]:
    """Private names of library modules ``path`` reaches: ``(line, module.name)``.

    By import (``from pkg.mod import _x``, ``import pkg._sub``), by attribute of a
    name bound to a library module (``mod._x``, ``pkg.mod._x``), or by name in
    ``setattr``/``delattr``/``monkeypatch.setattr(mod, "_x", ...)`` and dotted
    strings (``monkeypatch.setattr("pkg.mod._x", ...)``).
    """
    tree = ast.parse(path.read_text())
    bound: dict[str, str] = {}  # local name -> library module
    found: list[tuple[int, str]] = []

    def dotted(name: str, line: int) -> None:
        parts = name.split(".")
        for k in range(1, len(parts)):
            owner, attr = ".".join(parts[:k]), parts[k]
            if owner in modules and _private(attr):
                found.append((line, f"{owner}.{attr}"))

    def resolve(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return bound.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = resolve(node.value)
            if owner is not None and f"{owner}.{node.attr}" in modules:
                return f"{owner}.{node.attr}"
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == NAME:
                    dotted(a.name, node.lineno)
                    local = a.asname or a.name.split(".")[0]
                    bound[local] = a.name if a.asname else NAME
        elif isinstance(node, ast.ImportFrom) and node.module in modules:
            dotted(node.module, node.lineno)
            for a in node.names:
                dotted(f"{node.module}.{a.name}", node.lineno)
                if f"{node.module}.{a.name}" in modules:
                    bound[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = resolve(node.value)
            if owner is not None:
                found.append((node.lineno, f"{owner}.{node.attr}"))
        elif isinstance(node, ast.Call) and node.args:
            fn = node.func
            name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if name not in ("setattr", "delattr", "setitem", "patch"):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                dotted(first.value, node.lineno)
            elif len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                owner, attr = resolve(first), node.args[1].value
                if owner is not None and isinstance(attr, str) and _private(attr):
                    found.append((node.lineno, f"{owner}.{attr}"))
    return sorted(set(found))


def test_no_test_reaches_a_private_name_of_a_module_it_does_not_mirror():
    """A test module ``test/<dir>/test_<m>.py`` may use the private names (``_x``)
    of ``earth2studio_compile/<dir>/<m>.py`` (and, in a private package, the
    package's modules: ``test/_torch/`` imports ``earth2studio_compile._torch``);
    no other test module or helper reaches a private name of the library."""
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        mine = _mirrored(path)
        for line, name in _reaches(path, modules):
            owner = name.rsplit(".", 1)[0]
            if mine is not None and (
                owner == mine or mine.startswith(f"{name}.") or name == mine
            ):
                continue
            if f"{path.relative_to(TESTS)}: {name}" not in REACHES_LEFT:
                found.append(f"{path.relative_to(TESTS)}:{line}: {name}")
    assert not found, "\n".join(found)


def test_the_private_name_check_catches_each_way_of_reaching_one(tmp_path):
    modules = {NAME, f"{NAME}.cache", f"{NAME}._torch", f"{NAME}._torch.probes"}
    test = tmp_path / "test_x.py"
    test.write_text(
        "import earth2studio_compile\n"
        f"from {NAME}.cache import _root\n"
        f"from {NAME} import cache, _torch\n"
        "cache._lock\n"
        "earth2studio_compile.cache._key\n"
        'monkeypatch.setattr(cache, "_now", 1)\n'
        f'monkeypatch.setattr("{NAME}.cache._then", 1)\n'
        "cache.public\n"
    )
    names = [n for _, n in _reaches(test, modules)]
    assert names == [
        f"{NAME}.cache._root",
        f"{NAME}._torch",
        f"{NAME}.cache._lock",
        f"{NAME}.cache._key",
        f"{NAME}.cache._now",
        f"{NAME}.cache._then",
    ]


def _report_writes(path: Path) -> list[str]:
    """Lines of ``path`` that write or hold a report: assign to ``report.<x>``,
    ``r.<x>``, ``<...>.report`` or anything under them (item assignments such as
    ``r.phases[k] =`` too), or change one of their lists or dicts in place."""

    def on_report(node: ast.expr) -> bool:
        while isinstance(node, (ast.Attribute, ast.Subscript)):
            if isinstance(node, ast.Attribute) and node.attr == "report":
                return True
            node = node.value
        return isinstance(node, ast.Name) and node.id in ("report", "r")

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            mutators = ("update", "append", "extend", "setdefault", "pop", "clear")
            targets = [node.func.value] if node.func.attr in mutators else []
        else:
            continue
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, (ast.Attribute, ast.Subscript)) and on_report(t):
                    found.append(f"{path.name}:{node.lineno}: {ast.unparse(t)}")
    return found


def test_only_the_region_writes_the_report():
    """Executors measure (``Measured``); the region copies it into the report."""
    executors = sorted((PACKAGE / "executors").glob("*.py"))
    # The check sees the writes where they belong.
    assert executors and _report_writes(PACKAGE / "region.py")
    writes = [w for path in executors for w in _report_writes(path)]
    assert not writes, f"executors write or hold a report: {writes}"


def test_each_test_worker_compiles_into_an_inductor_cache_of_its_own():
    """Two xdist workers compiling the same graph for AOTInductor at once wrote the
    same cache files; one packaged the other's half-written JSON (CI, 2026-11-30).
    The README's test command runs two workers."""
    import os

    import pytest

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        pytest.skip("one process: no other worker shares its cache")
    assert Path(os.environ["TORCHINDUCTOR_CACHE_DIR"]).name == worker
