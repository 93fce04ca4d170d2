"""The demo's kernel pin: torch really runs its AVX2 kernels and MKL its vendor-independent branch after `pin()`,
and a user's own choice is kept."""
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
    assert out.stdout.split() == ["AVX2", "COMPATIBLE", "AVX2"]


def test_pin_makes_mkl_multiply_on_its_vendor_independent_branch():
    # MKL says which branch ran each product; its AVX2 branch would be ignored on a non-Intel CPU (CI's figures moved)
    probe = "from mlmclm import cpu_kernels; cpu_kernels.pin(); import torch; torch.ones(64, 64) @ torch.ones(64, 64)"
    out = subprocess.run([sys.executable, "-c", probe], env=_clean_env(MKL_VERBOSE="1"), capture_output=True,
                         text=True, check=True)
    branches = {word for word in out.stdout.split() if word.startswith("CNR:")}
    assert branches == {"CNR:COMPATIBLE"}, out.stdout[-2000:]


def test_host_names_vendor_model_and_avx512(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
                    "model name\t: AMD EPYC 9R14\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\n"
                    "vendor_id\t: AuthenticAMD\n")
    assert cpu_kernels.host(info).startswith("AuthenticAMD, AMD EPYC 9R14 (family 25 model 17), ")
    assert cpu_kernels.host(info).endswith("AVX-512 yes")
    assert cpu_kernels.host(tmp_path / "absent") == "unknown"


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


def test_a_test_that_imports_the_demo_leaves_the_pytest_worker_unpinned():
    """tests/conftest.py imports recipes.demo before any test, without its pin: a test importing it must not pin this
    process, whose first MKL product fixes MKL's mode for the whole session (CNR:COMPATIBLE after the environment
    is put back, MKL_VERBOSE) while its subprocesses run unpinned."""
    before = {name: os.environ.get(name) for name in cpu_kernels.PINNED}
    import recipes.demo  # noqa: F401

    assert {name: os.environ.get(name) for name in cpu_kernels.PINNED} == before
