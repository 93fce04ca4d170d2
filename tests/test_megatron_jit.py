"""megatron-core's `torch.compile` decorations wait for the function's first call (mlmclm/megatron_jit.py): a
process importing megatron through us does not import torch's inductor, and `torch.compile` is torch's own after."""
import json
import subprocess
import sys

import torch

from mlmclm import megatron_jit

_FACTS = """
import json, sys, torch
import mlmclm.model.build, mlmclm.train.step  # megatron-core, as a training rank imports it
import megatron.core.jit as jit
from megatron.core.fusions.fused_bias_gelu import bias_gelu
print(json.dumps(dict(
    inductor="torch._inductor.compile_fx" in sys.modules,
    compile_is_torchs=getattr(torch.compile, "__module__", None) == "torch",
    jit_fuser_defers=getattr(jit.jit_fuser, "keywords", {}).get("torch_compile") is torch.compile,
    fused_is_python=bias_gelu.__wrapped__.__code__.co_name == "bias_gelu")))
"""


def test_importing_megatron_through_us_leaves_the_compiler_stack_unimported():
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", _FACTS], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.splitlines()[-1])
    assert facts == dict(inductor=False, compile_is_torchs=True, jit_fuser_defers=True, fused_is_python=True)


def test_a_deferred_function_is_compiled_once_at_its_first_call_with_its_options(monkeypatch):
    made = []
    real = torch.compile

    def spy(fn, **options):
        made.append((fn, options))
        return real(fn, **options)

    monkeypatch.setattr(torch, "compile", spy)

    def scaled_gelu(x, scale):
        return torch.nn.functional.gelu(x) * scale

    deferred = megatron_jit.compile_on_first_call(backend="eager")(scaled_gelu)
    assert made == [] and deferred.__wrapped__ is scaled_gelu
    x = torch.linspace(-3, 3, 7)
    for scale in (2.0, 3.0):
        assert torch.equal(deferred(x, scale), scaled_gelu(x, scale))
    assert made == [(scaled_gelu, {"backend": "eager"})]
