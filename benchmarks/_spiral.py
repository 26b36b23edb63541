"""The spiral neural-ODE problem of ../shared/BENCHMARKS.md item 2, and its reference
gradients.

Truth: du/dt = (u**3) @ A, A = [[-0.1, 2.0], [-2.0, -0.1]], u0 = [2, 0],
tspan (0, 1.5), 30 save points ``np.linspace(0, 1.5, 30)``. Model:
f(u) = W2 tanh(W1 u**3 + b1) + b2 (Dense(2 -> 50, tanh), Dense(50 -> 2)),
float64, 252 parameters in ``nets.Chain``'s flat layout: W1 (50, 2)
row-major, b1 (50,), W2 (2, 50) row-major, b2 (2,). Loss: sum of squares of
the model's trajectory minus the true one at the save points.

Everything here is plain NumPy / SciPy so that the peers and the checks run
whether or not our packages import.
"""

from __future__ import annotations

import numpy as np
from scipy.integrate import solve_ivp

U0 = np.array([2.0, 0.0])
TSPAN = (0.0, 1.5)
TS = np.linspace(0.0, 1.5, 30)
A = np.array([[-0.1, 2.0], [-2.0, -0.1]])
SIZES = (2, 50, 2)
N_PARAMS = SIZES[1] * SIZES[0] + SIZES[1] + SIZES[2] * SIZES[1] + SIZES[2]  # 252
INIT_SEED = 0
TIGHT = 1e-12  # tolerance of the truth and of the reference gradients


def true_trajectory() -> np.ndarray:
    """The true states at `TS`, (30, 2), from DOP853 at rtol = atol = `TIGHT`."""
    r = solve_ivp(lambda t, u: (u**3) @ A, TSPAN, U0, method="DOP853", t_eval=TS,
                  rtol=TIGHT, atol=TIGHT)
    if not r.success:
        raise RuntimeError(f"true trajectory: solve_ivp failed: {r.message}")
    return r.y.T.copy()


def initial_params(seed: int = INIT_SEED) -> np.ndarray:
    """The parameters ``nets.Chain.init_params(seed)`` draws for this network
    (`benchmarks._harness.dense_init`), so that the peers start from the same numbers
    even when ``nets`` cannot be imported."""
    from benchmarks._harness import dense_init

    return dense_init(SIZES, seed)


def unflatten(p: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(W1 (50, 2), b1 (50,), W2 (2, 50), b2 (2,)) views of the flat vector `p`."""
    p = np.asarray(p)
    if p.shape != (N_PARAMS,):
        raise ValueError(f"unflatten: `p` must have shape ({N_PARAMS},), got {p.shape}")
    n0, n1, n2 = SIZES
    k = 0
    W1 = p[k:k + n1 * n0].reshape(n1, n0)
    k += n1 * n0
    b1 = p[k:k + n1]
    k += n1
    W2 = p[k:k + n2 * n1].reshape(n2, n1)
    k += n2 * n1
    return W1, b1, W2, p[k:k + n2]


def rhs(p: np.ndarray):
    """NumPy right-hand side ``f(t, u)`` of the model with parameters `p`."""
    W1, b1, W2, b2 = unflatten(np.asarray(p, dtype=np.float64))
    return lambda t, u: W2 @ np.tanh(W1 @ u**3 + b1) + b2


def solve_model(p: np.ndarray, tol: float = TIGHT) -> np.ndarray:
    """The model's states at `TS`, (30, 2), by DOP853 at rtol = atol = `tol`."""
    r = solve_ivp(rhs(p), TSPAN, U0, method="DOP853", t_eval=TS, rtol=tol, atol=tol)
    if not r.success:
        raise RuntimeError(f"solve_model: solve_ivp failed: {r.message}")
    return r.y.T


def loss(p: np.ndarray, y_true: np.ndarray, tol: float = TIGHT) -> float:
    """Sum of squares of the model's trajectory minus `y_true` at the save points."""
    return float(np.sum((solve_model(p, tol) - y_true) ** 2))


def forward_sensitivity_grad(p: np.ndarray, y_true: np.ndarray,
                             tol: float = TIGHT) -> tuple[float, np.ndarray]:
    """Loss and gradient by forward sensitivities (2 + 2 * 252 states), DOP853 at `tol`.

    An independent reference that needs only SciPy: dS/dt = J_u S + df/dp,
    S(0) = 0, then dL/dp = sum over the save points of 2 (u - y)^T S.

    Returns
    -------
    value : float
    grad : ndarray, (252,)
    """
    W1, b1, W2, b2 = unflatten(np.asarray(p, dtype=np.float64))
    n0, n1, n2 = SIZES

    def f(t, x):
        u, S = x[:n2], x[n2:].reshape(n2, N_PARAMS)
        z = u**3
        h = np.tanh(W1 @ z + b1)
        Wd = W2 * (1.0 - h * h)  # (2, 50): W2 diag(tanh')
        fp = np.empty((n2, N_PARAMS))
        k = 0
        fp[:, k:k + n1 * n0] = (Wd[:, :, None] * z[None, None, :]).reshape(n2, n1 * n0)
        k += n1 * n0
        fp[:, k:k + n1] = Wd
        k += n1
        fp[:, k:k + n2 * n1] = 0.0
        for i in range(n2):  # d f_i / d W2[i, :] = h
            fp[i, k + i * n1:k + (i + 1) * n1] = h
        k += n2 * n1
        fp[:, k:] = np.eye(n2)
        J = (Wd @ W1) * (3.0 * u * u)[None, :]
        return np.concatenate([W2 @ h + b2, (J @ S + fp).ravel()])

    x0 = np.concatenate([U0, np.zeros(n2 * N_PARAMS)])
    r = solve_ivp(f, TSPAN, x0, method="DOP853", t_eval=TS, rtol=tol, atol=tol)
    if not r.success:
        raise RuntimeError(f"forward_sensitivity_grad: solve_ivp failed: {r.message}")
    u = r.y[:n2].T  # (30, 2)
    S = r.y[n2:].T.reshape(len(TS), n2, N_PARAMS)
    res = u - y_true
    return float(np.sum(res**2)), 2.0 * np.einsum("ti,tip->p", res, S)


def central_differences(p: np.ndarray, y_true: np.ndarray, coords, step: float = 1e-4,
                        tol: float = TIGHT) -> np.ndarray:
    """dL/dp[i] for i in `coords` by central differences of the DOP853 loss at `tol`.

    With ``step`` 1e-4 the truncation error (~step**2) and the solver noise
    (~tol / step) both stay near 1e-8, far below the errors being measured.
    """
    out = []
    for i in coords:
        e = np.zeros_like(p)
        e[i] = step
        out.append((loss(p + e, y_true, tol) - loss(p - e, y_true, tol)) / (2 * step))
    return np.array(out)


def rel_err(g: np.ndarray, ref: np.ndarray) -> float:
    """Relative 2-norm error ``|g - ref| / |ref|``."""
    return float(np.linalg.norm(np.asarray(g, dtype=np.float64) - ref) / np.linalg.norm(ref))
