"""The project's imports point one way: no module reaches itself through others (lazy, in-function imports
included — a circle makes the order modules load in matter and hides which one owns what), and the library
(`mlmclm`) imports nothing from the layers built on it (`recipes`, `cluster`, `tools`, `benchmarks`), and the
evaluation's rooms (`mlmclm/eval/<room>/`) import only the rooms below them."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mlmclm", "recipes", "cluster", "tools", "benchmarks")
ABOVE_THE_LIBRARY = ("recipes", "cluster", "tools", "benchmarks")
# mlmclm/eval's sub-packages, lowest first: each may import itself and the ones before it, never one after it
# (the data the suite reads < fine-tuning and scoring < the grid's units, claims and workers < reports from run
# records < the demo's smoke checks).
EVAL_ROOMS = ("data", "finetune", "grid", "reports", "checks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module → the project's modules it imports (a package's `__init__` is the package's own module)."""
    paths = {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}

    def owner(name: str) -> str | None:  # the module that `name` (a module or a name inside one) lives in
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: up from this module's package
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets |= {owner(f"{base}.{alias.name}") or owner(base) for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args \
                    and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                targets.add(owner(node.args[0].value))
        graph[module] = {t for t in targets if t and t != module}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of modules that import each other (strongly connected components of more than one module)."""
    order, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in order:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], order[nxt])
        if low[node] == order[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in order:
            visit(node)
    return groups


def test_no_import_circle_anywhere_in_the_project():
    graph = _import_graph()
    assert "mlmclm.objectives.batch" in graph["mlmclm.objectives.clm"]  # the graph is the real one
    assert _circles(graph) == []


def test_circles_are_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]



def test_the_library_imports_nothing_built_on_it():
    upward = sorted(f"{module} -> {target}" for module, targets in _import_graph().items()
                    if module.split(".")[0] == "mlmclm" for target in targets
                    if target.split(".")[0] in ABOVE_THE_LIBRARY)
    assert upward == []


def _eval_room(module: str) -> str | None:
    """The sub-package of `mlmclm.eval` a module lives in (`mlmclm.eval.data.fetch` -> "data"); None outside."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["mlmclm", "eval"] and len(parts) > 2 else None


def _upward_eval_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {room: place for place, room in enumerate(EVAL_ROOMS)}
    return sorted(f"{module} -> {target}" for module, targets in graph.items() if _eval_room(module) in rank
                  for target in targets if rank.get(_eval_room(target), -1) > rank[_eval_room(module)])


def test_eval_rooms_import_only_the_rooms_below_them():
    graph = _import_graph()
    # every module of mlmclm/eval sits in a room of the order (a new room, or a module left flat, must be placed)
    assert {_eval_room(module) for module in graph} - {None} == set(EVAL_ROOMS)
    assert "mlmclm.eval.data.sources" in graph["mlmclm.eval.finetune.task_spec"]  # the real graph, lazy imports in
    assert _upward_eval_imports(graph) == []


def test_upward_eval_imports_are_found():
    graph = {"mlmclm.eval.data.splits": {"mlmclm.eval.finetune.metrics", "mlmclm.eval.data.hub_files"},
             "mlmclm.eval.reports.summary": {"mlmclm.eval.finetune.metrics", "mlmclm.eval.checks.smoke"},
             "mlmclm.eval.checks.smoke": {"mlmclm.eval.reports.summary", "mlmclm.atomic_write"},
             "recipes.demo": {"mlmclm.eval.checks.smoke"}}
    assert _upward_eval_imports(graph) == ["mlmclm.eval.data.splits -> mlmclm.eval.finetune.metrics",
                                           "mlmclm.eval.reports.summary -> mlmclm.eval.checks.smoke"]
