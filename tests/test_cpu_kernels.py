"""The demo's kernel pin: torch really runs its AVX2 kernels after `pin()`, and a user's own choice is kept."""
import os
import subprocess
import sys

from mlmclm import cpu_kernels

PROBE = ("from mlmclm import cpu_kernels; cpu_kernels.pin(); import torch, os; "
         "print(torch.backends.cpu.get_cpu_capability(), os.environ['MKL_CBWR'], os.environ['ONEDNN_MAX_CPU_ISA'])")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in cpu_kernels.PINNED}
    env.update(extra)
    return env


def test_pin_makes_torch_use_avx2_kernels():
    out = subprocess.run([sys.executable, "-c", PROBE], env=_clean_env(), capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["AVX2", "AVX2", "AVX2"]


def test_pin_keeps_a_value_the_user_set():
    out = subprocess.run([sys.executable, "-c", PROBE], env=_clean_env(ATEN_CPU_CAPABILITY="default"),
                         capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "DEFAULT"


def test_the_demo_pins_before_anything_imports_torch():
    probe = ("import sys, recipes.demo, os; "
             "print(os.environ.get('ATEN_CPU_CAPABILITY'), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", "import sys; import mlmclm.cpu_kernels as k; "
                          "import builtins; real = builtins.__import__\n"
                          "def guard(name, *a, **kw):\n"
                          "    if name == 'torch' and 'ATEN_CPU_CAPABILITY' not in __import__('os').environ:\n"
                          "        raise SystemExit('torch imported before the pin')\n"
                          "    return real(name, *a, **kw)\n"
                          "builtins.__import__ = guard\n" + probe.replace('; ', '\n')],
                         env=_clean_env(), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "avx2"
