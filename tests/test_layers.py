"""The import graph of the ``queen`` package: no cycle, no module imports a layer above its own
(the layers are described in ``docs/architecture.md``, "Layers"), and inside a layer no package
imports one it must not know (auth knows no HTTP; HTTP calls services, never storage).

Imports are read with :mod:`ast` from every module's source, including imports inside functions
and under ``TYPE_CHECKING``: a layer violation is one wherever it is written.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "queen"

# Lowest first. A module belongs to the layer of the longest prefix that names it ("queen"
# names the package's own __init__ only, so a new module must be placed here).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "foundation",
        (
            "queen.model",
            "queen.records",
            "queen.primitives",
            "queen.names",
            "queen.ids",
            "queen.frames",
            "queen.intake",
            "queen.cipher",
            "queen.settings",
            "queen.metrics",
            "queen.supervision",
            "queen.gctune",
            "queen.errors",
            "queen.budget",
            "queen.flow",
        ),
    ),
    ("storage", ("queen.storage",)),
    ("shared services", ("queen.health", "queen.maintenance", "queen.encryption")),
    ("actors", ("queen.actors",)),
    ("spool", ("queen.spool",)),
    ("push service", ("queen.push",)),
    ("consume", ("queen.consume", "queen.retention")),
    ("streams", ("queen.streams",)),
    ("operations", ("queen.operations",)),
    ("admin", ("queen.admin",)),
    ("import", ("queen.migrate",)),
    ("broker", ("queen", "queen.broker", "queen.lifecycle")),
    (
        "edge",
        (
            "queen.auth",
            "queen.http",
            "queen.serving",
            "queen.server",
            "queen.preflight",
            "queen.ctl",
            "queen.cli",
            "queen.__main__",
        ),
    ),
)


# Inside a layer, packages that must not know each other: (importer, imported, why). A module
# is covered by a prefix when it is the prefix or below it.
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("queen.auth", "queen.http", "access control knows nothing of HTTP"),
    ("queen.auth", "queen.serving", "access control knows nothing of HTTP"),
    ("queen.serving", "queen.http", "serving runs any ASGI app and knows none of its routes"),
    ("queen.serving", "queen.auth", "serving runs any ASGI app and knows none of its routes"),
    ("queen.http", "queen.storage", "HTTP calls services only, never storage"),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The ``queen`` modules ``name`` imports (``from pkg import mod`` counts as ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if sub in known else target)
    return {m for m in found if m in known and m != name}


def _layer(module: str) -> int:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            covers = module == prefix or (prefix != "queen" and module.startswith(prefix + "."))
            if covers and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    if best is None:
        raise LookupError(module)
    return best[1]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for dep in sorted(graph[node]):
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in on_stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in _modules():
        try:
            _layer(module)
        except LookupError:
            unplaced.append(module)
    assert unplaced == []


def test_the_import_graph_has_no_cycle() -> None:
    assert _cycles(_graph()) == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} ({LAYERS[_layer(module)][0]}) imports {dep} ({LAYERS[_layer(dep)][0]})"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if _layer(dep) > _layer(module)
    ]
    assert upward == []


def _covers(prefix: str, module: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _forbidden_imports(graph: dict[str, set[str]]) -> dict[tuple[str, str], str]:
    """Every import a rule of :data:`FORBIDDEN` forbids, with the rule's reason."""
    return {
        (module, dep): why
        for module, deps in graph.items()
        for dep in deps
        for importer, imported, why in FORBIDDEN
        if _covers(importer, module) and _covers(imported, dep)
    }


def test_no_package_imports_one_it_must_not_know() -> None:
    found = _forbidden_imports(_graph())
    assert [f"{module} imports {dep}: {why}" for (module, dep), why in sorted(found.items())] == []


# Packages that are clients of the broker, not parts of it: each imports only itself.
CLIENTS: tuple[tuple[str, str], ...] = (
    ("queen.ctl", "the operator commands speak to a broker over HTTP only"),
)


def _client_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{module} imports {dep}: {why}"
        for client, why in CLIENTS
        for module, deps in graph.items()
        if _covers(client, module)
        for dep in deps
        if not _covers(client, dep)
    )


def test_client_packages_import_nothing_of_the_broker() -> None:
    assert "queen.ctl.client" in _graph()["queen.ctl.options"]  # the reader sees queen.ctl
    assert _client_imports(_graph()) == []


def test_the_client_imports_finder() -> None:
    graph = {
        "queen.ctl.queues": {"queen.ctl.client", "queen.records"},
        "queen.ctl.client": set(),
        "queen.cli": {"queen.ctl", "queen.settings"},
    }
    assert _client_imports(graph) == [
        "queen.ctl.queues imports queen.records: "
        "the operator commands speak to a broker over HTTP only"
    ]


def test_the_forbidden_imports_finder() -> None:
    graph = {
        "queen.auth.policy": {"queen.http.app", "queen.settings"},
        "queen.http.push": {"queen.storage.base", "queen.auth.policy"},
        "queen.httpx": {"queen.storage.base"},  # not below queen.http
        "queen.serving.accept": {"queen.metrics"},
    }
    assert set(_forbidden_imports(graph)) == {
        ("queen.auth.policy", "queen.http.app"),
        ("queen.http.push", "queen.storage.base"),
    }


@pytest.mark.parametrize(
    ("graph", "cycle"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, []),
    ],
)
def test_the_cycle_finder(graph: dict[str, set[str]], cycle: list[list[str]]) -> None:
    assert _cycles(graph) == cycle


def test_the_import_reader_sees_what_a_module_imports() -> None:
    graph = _graph()
    assert "queen.storage.pool" in graph["queen.storage.consume"]
    assert "queen.records" in graph["queen.consume.requests"]
    assert "queen.spool.files" in graph["queen.spool.writer"]  # `from queen.spool import files`


# The statements a string may open; a literal that starts with one of them (then a space) is SQL.
_SQL = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|SHOW|CREATE|ALTER|DROP|TRUNCATE|LOCK|COPY|LISTEN"
    r"|NOTIFY|ANALYZE|VACUUM)\s"
)


def _sql_literals(path: Path) -> list[str]:
    """The string literals of ``path`` that are SQL statements, as ``line: text``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
            text = node.value.decode() if isinstance(node.value, bytes) else node.value
            if _SQL.match(text):
                found.append(f"{node.lineno}: {text.strip().splitlines()[0][:60]}")
    return found


def test_sql_is_written_only_in_storage() -> None:
    """Storage is the only place with SQL: no module outside ``queen/storage`` holds a
    statement (the schema's files are there too)."""
    outside = {
        name: _sql_literals(path)
        for name, path in _modules().items()
        if not _covers("queen.storage", name)
    }
    assert {name: found for name, found in outside.items() if found} == {}
    assert sorted(p.name for p in ROOT.rglob("*.sql") if "storage" not in p.parts) == []


def test_the_sql_finder_sees_a_statement(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('Q = "SELECT 1"\nB = b"SHOW server_version"\nD = "Select the queue"\n')
    assert _sql_literals(module) == ["1: SELECT 1", "2: SHOW server_version"]
    assert "queen.storage.postgres" in _modules()  # the walk sees the storage modules
    assert _sql_literals(_modules()["queen.storage.postgres"])  # and their SQL
