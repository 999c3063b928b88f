"""The package's layout, read from its source: no import cycle between its modules, the runtime
below the ops, and no file over 500 lines (strict for the runtime)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tilefuse"
MAX_LINES = 500


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict:
    """``{module name: path}`` of every ``tilefuse/**/*.py``."""
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_graph(modules: dict) -> dict:
    """``{module: {module it imports}}`` over the package's own modules: absolute and relative
    imports, at module level and inside functions. ``from package import name`` is an edge to the
    submodule ``package.name`` where there is one, else to the package."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    targets.add(sub if sub in modules else source)
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def find_cycle(graph: dict) -> list | None:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or None."""
    state = {}  # module -> 1 on the current path, 2 done
    path: list = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph(_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_runtime_imports_nothing_above_it():
    graph = import_graph(_modules())
    above = ("tilefuse.ops", "tilefuse.tuning", "tilefuse.nn")
    bad = sorted(f"{m} -> {t}" for m, ts in graph.items() if m.startswith("tilefuse.runtime")
                 for t in ts if t.startswith(above))
    assert not bad, "the runtime imports from above it: " + ", ".join(bad)


def test_no_file_over_500_lines():
    long = sorted(f"{p.relative_to(PACKAGE.parent)}: {n}" for p in PACKAGE.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > MAX_LINES)
    assert not long, f"files over {MAX_LINES} lines: " + ", ".join(long)
