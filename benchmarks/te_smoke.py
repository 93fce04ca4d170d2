#!/usr/bin/env python
"""Transformer Engine works on this GPU: versions, then a bf16 and an FP8 `te.Linear` forward and backward.

    python benchmarks/te_smoke.py      # exits non-zero on any failure

torch.backends.cudnn.version() is not asked: with the cuDNN mismatch seen on an H200 image (TE loading a cuDNN
older than torch's) it raises; TE's own view of cuDNN is printed instead.
"""
import torch
import transformer_engine
import transformer_engine.pytorch as te
import transformer_engine_torch as tex

print("transformer_engine", transformer_engine.__version__, "torch", torch.__version__,
      "cudnn (TE)", tex.get_cudnn_version())
layer = te.Linear(256, 256, params_dtype=torch.bfloat16).cuda()
x = torch.randn(32, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
layer(x).float().pow(2).mean().backward()
with te.fp8_autocast(enabled=True):
    y = layer(x)
y.float().sum().backward()
print("TE bf16 and FP8 Linear forward/backward ok", tuple(y.shape))
