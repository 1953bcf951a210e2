"""The rooms' import rules (docs/architecture.md), read from the source: no import cycle
anywhere in the product code, and no room reaching into one it must not."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("serve", "traces", "feedback", "envs", "kernels", "loop", "deploy")


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """module -> the product modules it imports (at the top or inside a function)."""
    files = {_module(p): p for room in PRODUCT for p in (ROOT / room).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" for a in node.names] + [base]
            else:
                continue
            for target in targets:
                while target and target not in files:  # `from pkg import name`: the module that defines it
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


GRAPH = import_graph()


def test_there_is_no_import_cycle_in_the_product_code():
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    cycles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(GRAPH[module]):
            if state.get(dep) == 1:
                cycles.append(path[path.index(dep) :] + [dep])
            elif dep not in state:
                visit(dep, path + [dep])
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def breaches(source: str, forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    return sorted(
        f"{m} imports {d}"
        for m, deps in GRAPH.items()
        if m == source or m.startswith(source + ".")
        for d in deps
        if d.startswith(forbidden) and not d.startswith(allowed)
    )


def test_each_room_imports_only_what_it_may():
    ours = tuple(f"{room}" for room in PRODUCT)
    found = (
        breaches("kernels", ours, ("kernels",))
        + breaches("traces", ("serve", "feedback", "envs", "loop"))
        + breaches("serve", ("feedback.train", "feedback.grpo", "envs", "loop", "deploy"))
        + breaches("feedback", ("loop", "deploy"))
        + breaches("loop", ("serve", "deploy"))
        + breaches("envs", ours, ("envs",))
        + breaches("deploy.engine", ours)
        + breaches("deploy.stack", ("deploy.cli",))
    )
    assert not found, found


def test_the_graph_sees_the_imports_it_checks():
    """The rules above are only as good as the graph: it must see ordinary, lazy and relative imports."""
    assert "deploy.stack.run_state" in GRAPH["deploy.stack.launcher"]
    assert "deploy.stack.launcher" in GRAPH["deploy.stack.supervisor"]  # inside main()
    assert "serve.errors" in GRAPH["serve.app"]
    assert "loop.algorithms" in GRAPH["loop.phases"] and "feedback.grpo" in GRAPH["loop.algorithms"]
