"""mlmclm/eval imports point one way: no module reaches itself through the others, lazy (in-function) imports
included — an import circle makes the order modules load in matter and hides which one owns what."""
import ast
from pathlib import Path

import mlmclm.eval

PACKAGE = Path(mlmclm.eval.__file__).parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "mlmclm.eval":
                names |= {alias.name for alias in node.names}
            elif node.module.startswith("mlmclm.eval."):
                names.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[2] for a in node.names if a.name.startswith("mlmclm.eval.")}
    return names


def test_no_import_circle_in_mlmclm_eval():
    graph = {p.stem: _imports(p) for p in PACKAGE.glob("*.py")}

    def reaches(start, target, seen):
        for nxt in graph.get(start, ()):
            if nxt == target:
                return [start, nxt]
            if nxt not in seen:
                seen.add(nxt)
                path = reaches(nxt, target, seen)
                if path:
                    return [start] + path
        return None

    circles = [" -> ".join(path) for module in sorted(graph) if (path := reaches(module, module, set()))]
    assert not circles, f"import circles: {circles}"
