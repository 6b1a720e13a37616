"""Imports flow one way through Stoke's rooms, read from the source with `ast` (lazy imports
inside functions count too): a room imports only rooms below it, so a change to a low room
never needs a high one, and nothing imports the UI but the entry point and its benchmark.
Within a room too, no module imports itself back through others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import app

APP = Path(app.__file__).parent

# Highest first. A module belongs to the room of the longest prefix naming it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("app.__main__",),  # `stoke`: the table of subcommands, and the window
    ("app.cli",),  # one module per subcommand
    ("app.bench",),  # benchmarks: they drive the window, the server and the engines
    ("app.ui",),  # Qt only
    ("app.doctor", "app.service"),  # `stoke doctor`s report; `stoke serve` as a system service
    ("app.server", "app.tool_loop"),  # the local API; the chat's turns with tools
    ("app.session", "app.launch"),  # one turn end to end; how a model loads
    ("app.pool",),  # the engines loaded now: models on demand, below server and window
    ("app.toolcalls",),  # the tool-call mechanism the server and the session share
    ("app.remote_config",),
    ("app.settings", "app.presets", "app.models"),  # settings, prompt presets; the library
    ("app.hardware",),  # detection and the offload planner
    ("app.engine",),  # protocol, host, worker, backends, GGUF reading
    ("app.conversations", "app.mcp"),  # storage: knows nothing of engines; MCP servers
    ("app.stored",),  # Stoke's own JSON files, checked as they are read back
    ("app.paths", "app.resources", "app.units", "app.qt_check"),  # ground
)
LEVEL = {room: len(LAYERS) - i for i, rooms in enumerate(LAYERS) for room in rooms}


def _module(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _room(module: str) -> str | None:
    matches = [r for r in LEVEL if module == r or module.startswith(r + ".")]
    return max(matches, key=len) if matches else None


def _is_module(name: str) -> bool:
    """Whether `name` is a module or package of the app, not a name defined in one."""
    path = APP.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every import of the app in `path`: a package stands for its `__init__`."""
    module = _module(path)
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package, up level - 1
                base = ".".join([*package[: len(package) - node.level + 1], *base.split(".")])
                base = base.rstrip(".")
            # `from app.pkg import module` imports the module; any other name, the package
            full = [f"{base}.{a.name}" for a in node.names]
            names = [n for n in full if _is_module(n)]
            if len(names) < len(full):
                names.append(base)
        else:
            continue
        for name in names:
            if name == "app" or not name.startswith("app."):
                continue
            yield node.lineno, name


def _edges() -> Iterator[tuple[str, int, str, str, str]]:
    """(file, line, imported module, importer's room, imported room) across rooms."""
    for path in sorted(APP.rglob("*.py")):
        if path == APP / "__init__.py":
            continue
        here = _room(_module(path))
        assert here is not None, f"{path}: in no room of LAYERS; place it there"
        for line, name in _imports(path):
            there = _room(name)
            assert there is not None, f"{path}:{line} imports {name}, in no room of LAYERS"
            if there != here:
                yield str(path.relative_to(APP.parent)), line, name, here, there


def test_imports_point_down() -> None:
    upward = [
        f"{file}:{line} ({here}) imports {name} ({there})"
        for file, line, name, here, there in _edges()
        if LEVEL[there] >= LEVEL[here]
    ]
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_nothing_imports_the_ui_and_storage_knows_no_engine() -> None:
    edges = list(_edges())
    ui_users = {here for _, _, _, here, there in edges if there == "app.ui"}
    assert ui_users <= {"app.__main__", "app.bench"}
    storage = {there for _, _, _, here, there in edges if here == "app.conversations"}
    assert storage <= {"app.paths", "app.units"}
    mcp = {there for _, _, _, here, there in edges if here == "app.mcp"}
    assert mcp <= {"app.paths", "app.stored", "app.units"}


def test_every_room_says_what_it_owns_and_may_import() -> None:
    for init in sorted(APP.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse(init.read_text("utf-8"))) or ""
        assert "May import" in doc, f"{init}: the docstring says what the room may import"


def _graph() -> dict[str, set[str]]:
    """Every module of the app and the modules it imports; a package is its `__init__`."""
    graph: dict[str, set[str]] = {}
    for path in sorted(APP.rglob("*.py")):
        graph[_module(path)] = {name for _, name in _imports(path)}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as its path (first module last again), or None: a depth-first walk."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        trail = [root]
        pending = [iter(sorted(graph[root]))]
        while pending:
            step = next(pending[-1], None)
            if step is None:
                done.add(trail.pop())
                pending.pop()
            elif step in trail:
                return [*trail[trail.index(step) :], step]
            elif step not in done:
                trail.append(step)
                pending.append(iter(sorted(graph[step])))
    return None


def test_no_import_cycles() -> None:
    """Modules in a circle can be read, tested and changed only together; an import made lazy
    or for type checking only hides the circle, so those count too."""
    cycle = _cycle(_graph())
    assert cycle is None, "an import cycle: " + " -> ".join(cycle or [])
