"""Nothing a user names is loaded with remote code: every call of `datasets.load_dataset`, a `from_pretrained` or
`transformers.pipeline` in the project passes `trust_remote_code=False` itself. The installed versions refuse
remote code by default, but an older `datasets` (>= 3.0 is allowed) with HF_DATASETS_TRUST_REMOTE_CODE=1 set on a
cluster would run a dataset's script; the explicit False wins over that setting."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("mlmclm", "recipes", "tools", "benchmarks", "cluster")
LOADERS = ("load_dataset", "from_pretrained", "pipeline")


def _calls():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
                    if name in LOADERS:
                        yield f"{path.relative_to(REPO)}:{node.lineno}", node


def test_every_loader_call_refuses_remote_code_explicitly():
    calls = list(_calls())
    assert len(calls) >= 15   # the scan sees the real calls (convert, data, eval, recipes, benchmarks)
    missing = [where for where, node in calls
               if not any(k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False
                          for k in node.keywords)]
    assert missing == []
