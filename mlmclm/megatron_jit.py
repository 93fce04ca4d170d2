"""megatron-core's `torch.compile` decorations compile when the function is first called, not at import.

megatron-core decorates functions with `torch.compile` while it imports (`megatron.core.jit.jit_fuser` is
`torch.compile`; MoE's router uses it directly). Decorating is what imports torch's compiler stack (dynamo,
inductor): ~1.7 CPU-s of every process that imports megatron-core (measured on 2 cores: megatron + our model 2.5 s
→ 0.8 s), though `torch.compile` compiles nothing until the function is called, and a CPU run never calls one
(mlmclm.model.fusions turns them off without CUDA). Installed from `mlmclm/__init__.py`, so before any of our
modules imports megatron: while `megatron.core` runs its imports, `torch.compile` is `compile_on_first_call`, which
calls the real `torch.compile` the first time the function runs — the same compiled function, the same first-call
compile on a GPU, minus the import at start-up. `torch.compile` is itself again once megatron-core has imported.
"""
import functools
import importlib.abc
import importlib.machinery
import sys

MEGATRON_CORE = "megatron.core"


def compile_on_first_call(fn=None, *, torch_compile=None, **options):
    """`torch_compile(fn, **options)` (default: `torch.compile` as it is then), made the first time the function is
    called (torch.compile compiles then). Takes both forms megatron uses: `@torch.compile` and
    `@torch.compile(**options)`."""
    if fn is None:
        return functools.partial(compile_on_first_call, torch_compile=torch_compile, **options)
    compiled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal compiled
        if compiled is None:
            import torch
            compiled = (torch_compile or torch.compile)(fn, **options)
        return compiled(*args, **kwargs)

    return call


class _DeferringLoader(importlib.abc.Loader):
    """megatron-core's own loader, run with `torch.compile` deferring its decorations to the real one."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        import torch
        real = torch.compile
        torch.compile = functools.partial(compile_on_first_call, torch_compile=real)
        try:
            self._loader.exec_module(module)
        finally:
            torch.compile = real


class _MegatronFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != MEGATRON_CORE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _DeferringLoader(spec.loader)
        return spec


def install() -> None:
    """Defer megatron-core's `torch.compile` decorations, if it has not been imported yet (else too late)."""
    if MEGATRON_CORE not in sys.modules and not any(isinstance(f, _MegatronFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MegatronFinder())
