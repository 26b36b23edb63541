"""The floor analysis' peak (`benchmarks._harness.float32_peak`) per machine class."""

import pytest

from benchmarks import _harness as H

ZEN3 = "+avx,+avx2,+fma,+sse4.2"
AVX512 = ZEN3 + ",+avx512f,+avx512vl"


@pytest.mark.parametrize(
    "features, vendor, mhz, isa, peak",
    [  # README: Zen 3, "two 256-bit FMAs a cycle at 2.45 GHz on two cores" = 157 GFLOP/s
        (ZEN3, "AuthenticAMD", 2450.0, "AVX2+FMA", 156.8),
        # Zen 4 runs 512-bit FMAs as two halves: the same peak as 256-bit code
        (AVX512, "AuthenticAMD", 2450.0, "AVX-512", 156.8),
        # a Xeon's two 512-bit pipes: 2 x 16 lanes x 2 flops x 2.1 GHz x 2 cores
        (AVX512, "GenuineIntel", 2100.0, "AVX-512", 268.8),
        ("+sse2,+sse4.2", "GenuineIntel", 3000.0, "SSE", 48.0),
    ],
)
def test_peak_per_machine_class(features, vendor, mhz, isa, peak):
    p = H.float32_peak(2, features=features, vendor=vendor, mhz=mhz)
    assert p["isa"] == isa
    assert p["peak_gflops"] == pytest.approx(peak)
    note = H.peak_note(p, 2)
    assert isa in note and f"{peak:.0f} GFLOP/s" in note


def test_peak_of_this_machine_is_a_number():
    p = H.float32_peak(1)
    assert p["isa"] in ("AVX-512", "AVX2+FMA", "SSE") and p["peak_gflops"] > 0
    assert p["clock"] == "measured" and p["peak_gflops"] == pytest.approx(
        2 * (p["fma_bits"] // 32) * 2 * p["ghz"])
    assert f"{p['ghz']:.2f} GHz (measured; " in H.peak_note(p, 1)


def test_the_measured_clock_is_a_cores():
    # a chain of dependent one-cycle steps: what a core of 2026 runs at, even shared
    # with another process (best of five short windows)
    assert 0.8 < H.core_ghz() < 7.0


def test_blas_roof_is_measured_before_and_after_a_timing():
    calls = []
    impl = H.Impl("x", run=lambda: calls.append(1))
    machine = {}
    lines = H.time_measured([impl], 2, 2, machine)
    assert len(calls) == 2 and len(impl.times) == 2
    roof = machine["blas_roof"]
    for r in (roof["before"], roof["after"]):
        # two threads at once: their sum, never less than one thread alone by much
        assert r["one"] > 0 and r["all"] > 0.5 * r["one"] and r["n"] == 256
    assert "during the timing" in lines
    assert f"{roof['before']['one']:.0f} / {roof['after']['one']:.0f} GFLOP/s" in lines


def _in_avx2_environment(code, **env):
    """The standard output of ``python -c code`` under `H.avx2_environment` (and ``env``)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, **H.avx2_environment(), **env}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=True).stdout


_AVX2_CHECK = """
import numba, numpy as np
from benchmarks import _harness as H
from nets import tiles

@numba.njit(fastmath=True)
def axpy(a, x, y):
    for i in range(x.shape[0]):
        y[i] += a * x[i]

axpy(np.float32(2), np.ones(64, np.float32), np.ones(64, np.float32))
asm = next(iter(axpy.inspect_asm().values()))
print(H.AVX2_ONLY, tiles.VECTOR_BYTES, H.float32_peak(1, mhz=1000.0)["isa"], "zmm" in asm,
      "ymm" in asm, H.machine_info(1)["cpu"].endswith("(AVX2 code only: --avx2)"))
"""


def test_the_avx2_environment_compiles_avx2_code_only():
    """`--avx2` (matrix_exp, lenet5): numba's code, nets' tiles and the floor analysis
    keep to AVX2 on any machine that has it."""
    import llvmlite.binding as ll

    if not ll.get_host_cpu_features().get("avx2"):
        pytest.skip("no AVX2 on this machine")
    features = H.avx2_environment()["NUMBA_CPU_FEATURES"]
    assert "+avx512" not in features and "+avx2" in features
    out = _in_avx2_environment(_AVX2_CHECK).split()
    assert out == ["True", "32", "AVX2+FMA", "False", "True", "True"]


_TORCH_ISA = """
import torch
x = torch.randn(8, 1, 28, 28)
torch.nn.Conv2d(1, 6, 5)(x).sum().backward()  # oneDNN's convolution
a = torch.randn(256, 256)
a @ a  # MKL's sgemm
print("capability", torch.backends.cpu.get_cpu_capability())
"""


def test_the_avx2_environment_keeps_pytorchs_libraries_to_avx2():
    """PyTorch's convolutions (oneDNN) and products (MKL) choose their code apart from its
    own kernels: on an AVX-512 machine they used it under ``ATEN_CPU_CAPABILITY`` alone."""
    pytest.importorskip("torch")
    out = _in_avx2_environment(_TORCH_ISA, ONEDNN_VERBOSE="1", MKL_VERBOSE="1").splitlines()
    isa = [s for s in out if "isa:" in s or "MKL_VERBOSE oneMKL" in s or "capability" in s]
    assert len(isa) == 3, out
    assert all("512" not in s for s in isa), isa
    # MKL names the instructions it chose on Intel processors only (on an AMD EPYC its
    # line says "Intel(R) Architecture processors" and nothing more)
    named = [s for s in isa if "MKL_VERBOSE" not in s or "Intel(R) AVX" in s]
    assert len(named) >= 2 and all("AVX2" in s for s in named), isa
