"""Stiff test models shared by the sparse, BDF and mass-matrix tests."""

import functools

import numpy as np

import sciml

from . import central


def robertson_groups(ng):
    """Robertson's kinetics copied ``ng`` times, rate constants of group i scaled by
    1 + 0.001 i (diffsol's benchmark)."""
    def f(u, p, t):
        out = []
        for i in range(ng):
            s = 1 + 0.001 * i
            a, b, c = u[3 * i], u[3 * i + 1], u[3 * i + 2]
            r1, r2, r3 = p.k1 * s * a, p.k2 * s * b * b, p.k3 * s * b * c
            out += [-r1 + r3, r1 - r2 - r3, r2]
        return out
    return sciml.Model(f, [f"{c}{i}" for i in range(ng) for c in "abc"], ["k1", "k2", "k3"])


def brusselator_1d(N):
    """The 1-D Brusselator on N cells (Hairer & Wanner II, IV.1), 2N states."""
    def f(u, p, t):
        x, y = u[:N], u[N:]
        c = p.alpha * (N + 1) ** 2
        dx, dy = [], []
        for i in range(N):
            xl, xr = (x[i - 1] if i > 0 else 1.0), (x[i + 1] if i < N - 1 else 1.0)
            yl, yr = (y[i - 1] if i > 0 else 3.0), (y[i + 1] if i < N - 1 else 3.0)
            dx.append(1 + x[i] ** 2 * y[i] - 4 * x[i] + c * (xl - 2 * x[i] + xr))
            dy.append(3 * x[i] - x[i] ** 2 * y[i] + c * (yl - 2 * y[i] + yr))
        return dx + dy
    return sciml.Model(f, [f"x{i}" for i in range(N)] + [f"y{i}" for i in range(N)], ["alpha"])



@functools.lru_cache(maxsize=1)
def bruss50():
    """The 1-D Brusselator on 25 cells (50 states), data 5% off its own solution."""
    m = brusselator_1d(25)
    u0 = np.concatenate([1 + np.sin(2 * np.pi * np.arange(1, 26) / 26), np.full(25, 3.0)])
    prob = sciml.ODEProblem(m, u0=u0, tspan=(0.0, 2.0), params=np.array([0.02]))
    ts = np.linspace(0.2, 2.0, 10)
    ref = sciml.solve(prob, sciml.Rodas5(), saveat=ts, rtol=1e-10, atol=1e-12)
    data = sciml.Data(ts, np.asarray(ref.u) * 1.05)
    theta = np.array([0.025])
    return prob.remake(params=theta), data, theta, central.loss_gradient(prob, data, theta)
