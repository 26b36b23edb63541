"""The matrix cores of the layer kernels (`nets.gemm`) against numpy, at sizes that reach
every tile shape and partial tile of their register tiles (`nets.tiles`), with
overlapping windows for the `*_rows` forms."""

import os
import subprocess
import sys

import numpy as np
import pytest

from nets import gemm, tiles
from nets._config import jit


@jit
def _total(a, i, n):
    return tiles.total(a, i, n)

# rows M: 8-, 6-, 4-, 2- and 1-row tiles and their mixes; columns J: within, at and past one
# and two vectors of either width (8 or 16 float32, 4 or 8 float64)
SIZES = [(1, 1, 1), (2, 4, 3), (5, 7, 9), (6, 25, 20), (16, 150, 17), (15, 6, 70), (9, 5, 64)]


def _windows(rng, K, J, step):
    """A 1-D source and offsets whose windows of J overlap (offsets step apart, as a
    convolution's taps along W are), and the windows as a (K, J) matrix."""
    offs = rng.permutation(K).astype(np.int64)
    src = rng.normal(size=K * step + J + 3)
    base = 2
    rows = np.stack([src[base + o * step:base + o * step + J] for o in offs])
    return src, offs, base, rows


@pytest.mark.parametrize("M, K, J", SIZES)
def test_cores_match_numpy(M, K, J, rng):
    A = rng.normal(size=(M, K))
    Bm = rng.normal(size=(K, J))
    C0 = rng.normal(size=(M, J))
    C = C0.copy()
    gemm.gemm_nn(C, A, Bm, True)
    np.testing.assert_allclose(C, C0 + A @ Bm, rtol=1e-12, atol=1e-12)
    gemm.gemm_nn(C, A, Bm, False)
    np.testing.assert_allclose(C, A @ Bm, rtol=1e-12, atol=1e-12)
    gemm.gemm_nn(C, A.T.copy().T, Bm, False)  # a strided left factor (W.T in Dense)
    np.testing.assert_allclose(C, A @ Bm, rtol=1e-12, atol=1e-12)
    X = rng.normal(size=(M, J))
    D0 = rng.normal(size=(M, K))
    D = D0.copy()
    gemm.gemm_nt(D, X, Bm)
    np.testing.assert_allclose(D, D0 + X @ Bm.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("M, K, J", SIZES)
def test_window_cores_match_numpy(M, K, J, dtype, rng):
    step = max(1, J // 3)  # windows overlap whenever J > step
    src, offs, base, rows = _windows(rng, K, J, step)
    taps = np.zeros((K, 8), np.int64)  # the offsets as the convolutions pass them: a
    taps[:, 7] = offs                  # column of their taps table (strided)
    offs = taps[:, 7]
    src, rows = src.astype(dtype), rows.astype(np.float64)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-4, atol=1e-4)
    A = rng.normal(size=(M, K)).astype(dtype)
    C0 = rng.normal(size=(M, J)).astype(dtype)
    C = C0.copy()
    none = src[:0]
    gemm.gemm_nn_rows(C, A, src, offs, base, step, True, none)
    np.testing.assert_allclose(C, C0 + A @ rows, **tol)
    gemm.gemm_nn_rows(C, A, src, offs, base, step, False, none)
    np.testing.assert_allclose(C, A @ rows, **tol)
    bias = rng.normal(size=M).astype(dtype)  # overwrites, whatever `accumulate`
    for accumulate in (True, False):
        gemm.gemm_nn_rows(C, A, src, offs, base, step, accumulate, bias)
        np.testing.assert_allclose(C, bias[:, None] + A @ rows, **tol)
    # a plane (Z, l) as the output, its neighbours untouched
    Z3 = rng.normal(size=(M, 3, J)).astype(dtype)
    want = Z3.copy()
    want[:, 1] = A @ rows
    gemm.gemm_nn_rows((Z3, np.int64(1)), A, src, offs, base, step, False, none)
    np.testing.assert_allclose(Z3, want, **tol)
    Z = rng.normal(size=(M, J)).astype(dtype)
    G0 = rng.normal(size=(M, K)).astype(dtype)
    G = G0.copy()
    gemm.gemm_nt_rows(G, Z.reshape((M, 1, J)), src, offs, base, step, 0)
    np.testing.assert_allclose(G, G0 + Z @ rows.T, **tol)
    # the adjoint: every window's share added into the source, overlaps summed, whichever
    # taps go together
    dst0 = rng.normal(size=src.shape).astype(dtype)
    want = dst0.astype(np.float64)
    for k, o in enumerate(offs):
        want[base + o * step:base + o * step + J] += A[:, k] @ Z
    packs = (src[:0], np.full(M * J + 3, np.nan, dtype))  # none, or room for Z's rows
    for pair in (1, 2, 3, K):
        for pack in packs:
            dst = dst0.copy()
            gemm.gemm_tn_rows(dst, base, offs, step, A, Z, pair, pack)
            np.testing.assert_allclose(dst, want, **tol)
    # Z as a plane (Z3, l) whose rows lie a plane apart
    Z3 = rng.normal(size=(M, 2, J)).astype(dtype)
    Z3[:, 1] = Z
    for pack in packs:
        dst = dst0.copy()
        gemm.gemm_tn_rows(dst, base, offs, step, A, (Z3, np.int64(1)), 2, pack)
        np.testing.assert_allclose(dst, want, **tol)
    # and it is the adjoint of gemm_nn_rows: <A rows, Z> == <src, tn(A, Z)>
    lhs = np.sum((A @ rows) * Z)
    tn = np.zeros_like(src)
    gemm.gemm_tn_rows(tn, base, offs, step, A, Z, 2, src[:0])
    np.testing.assert_allclose(lhs, src.astype(np.float64) @ tn, rtol=tol["rtol"])


@pytest.mark.parametrize("M, K, J", SIZES)
def test_weight_gradient_over_planes(M, K, J, rng):
    """`gemm_nt_rows` over L planes at once, read through a strided view (a run of a
    convolution's output rows, `Z[:, l0:l0 + L]`), windows `lstride` apart per plane."""
    L, step, lstride, base = 3, max(1, J // 3), J + 5, 4
    offs = rng.permutation(K).astype(np.int64)
    src = rng.normal(size=base + (L - 1) * lstride + K * step + J)
    Z = rng.normal(size=(M, L + 2, J))
    G0 = rng.normal(size=(M, K))
    G = G0.copy()
    gemm.gemm_nt_rows(G, Z[:, 1:1 + L], src, offs, base, step, lstride)
    want = G0.copy()
    for l in range(L):
        rows = np.stack([src[base + l * lstride + o * step:][:J] for o in offs])
        want += Z[:, 1 + l] @ rows.T
    np.testing.assert_allclose(G, want, rtol=1e-12, atol=1e-12)


def test_buffers_start_on_a_vector_boundary():
    for shape, dtype in [(1, np.float32), (37, np.float64), ((5, 3), np.float32)]:
        a = tiles.zeros(shape, dtype)
        assert a.ctypes.data % 64 == 0
        assert a.shape == np.zeros(shape).shape and a.dtype == dtype and not a.any()


@pytest.mark.skipif(tiles.VECTOR_BYTES == 32, reason="this machine runs the 32-byte tiles")
def test_32_byte_tiles_on_an_avx2_target(tmp_path):
    """The tiles of AVX2 machines (6 x 2 and 4 x 2 products, 6 x 2 and 2 x 4 dot
    products): this file's checks again in a process that targets an AVX2 core (numba's
    ``NUMBA_CPU_NAME``)."""
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CACHE_DIR=str(tmp_path),
               NUMBA_CPU_FEATURES="+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+cx8,+f16c,+fma,"
               "+fxsr,+lzcnt,+mmx,+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,+sse4.2,+ssse3,+xsave")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "-k", "not avx2_target", __file__],
        env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "passed" in run.stdout


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_total_matches_numpy(dtype, rng):
    """`tiles.total` (a bias gradient's sum) over runs that end inside, at and past its
    four-vector blocks, from any start."""
    a = rng.normal(size=300).astype(dtype)
    for i, n in [(0, 0), (0, 1), (3, 15), (5, 16), (1, 64), (7, 100), (0, 300), (17, 283)]:
        got = _total(a, i, n)
        np.testing.assert_allclose(got, a[i:i + n].astype(np.float64).sum(),
                                   rtol=1e-5 if dtype == np.float32 else 1e-12, atol=1e-5)
