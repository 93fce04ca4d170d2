"""Test-only stand-ins for GPU components that cannot run on CPU (apex's softmax kernels, Transformer Engine).

Each enforces the real component's contract as read from its source and computes with torch. Nothing here is on
`sys.path` by default: a test installs a stand-in explicitly (`apex_softmax.installed()`, `transformer_engine_path()`),
so none can ever shadow a real installation outside the test that asked for it.
"""
