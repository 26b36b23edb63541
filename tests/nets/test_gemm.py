"""The matrix cores of the layer kernels (`nets.gemm`) against numpy, at sizes that reach
every leftover branch of their blocks, with overlapping windows for the `*_rows` forms."""

import numpy as np
import pytest

from nets import gemm

SIZES = [(1, 1, 1), (2, 4, 3), (5, 7, 9), (6, 25, 20), (16, 150, 17)]


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


@pytest.mark.parametrize("M, K, J", SIZES)
def test_window_cores_match_numpy(M, K, J, rng):
    step = max(1, J // 3)  # windows overlap whenever J > step
    src, offs, base, rows = _windows(rng, K, J, step)
    A = rng.normal(size=(M, K))
    C = rng.normal(size=(M, J))
    gemm.gemm_nn_rows(C, A, src, offs, base, step, False)
    np.testing.assert_allclose(C, A @ rows, rtol=1e-12, atol=1e-12)
    Z = rng.normal(size=(M, J))
    G0 = rng.normal(size=(M, K))
    G = G0.copy()
    gemm.gemm_nt_rows(G, Z, src, offs, base, step)
    np.testing.assert_allclose(G, G0 + Z @ rows.T, rtol=1e-12, atol=1e-12)
    # the adjoint: every window's share added into the source, overlaps summed, whichever
    # taps go together
    dst0 = rng.normal(size=src.shape)
    want = dst0.copy()
    for k, o in enumerate(offs):
        want[base + o * step:base + o * step + J] += A[:, k] @ Z
    for pair in (1, 2, 3, K):
        dst = dst0.copy()
        gemm.gemm_tn_rows(dst, base, offs, step, A, Z, pair)
        np.testing.assert_allclose(dst, want, rtol=1e-12, atol=1e-12)
    # and it is the adjoint of gemm_nn_rows: <A rows, Z> == <src, tn(A, Z)>
    lhs = np.sum((A @ rows) * Z)
    tn = np.zeros_like(src)
    gemm.gemm_tn_rows(tn, base, offs, step, A, Z, 2)
    np.testing.assert_allclose(lhs, src @ tn, rtol=1e-12)
