"""Benchmark ``solve``: forward ODE solves, ours vs scipy ``solve_ivp`` vs jitted diffrax.

Problems (../shared/BENCHMARKS.md items 2 and 3 setups, forward only):

- ``lotka_volterra``: alpha, beta, gamma, delta = 1.3, 0.9, 0.8, 1.8,
  u0 = [0.44249296, 4.6280594], tspan (0, 3), saveat every 0.1;
- ``spiral``: the neural ODE f(u) = Dense(50 -> 2)(tanh(Dense(2 -> 50)(u^3))),
  u0 = [2, 0], tspan (0, 1.5), 30 save points, parameters init_params(seed=0);
- ``vdp_stiff``: Van der Pol x'' - mu (1 - x^2) x' + x = 0, mu = 1000 (the
  standard stiff test, MATLAB's vdp1000), u0 = [2, 0], tspan (0, 3000), 101
  save points; ours Rodas5, scipy Radau and BDF (with the exact Jacobian),
  diffrax Kvaerno5.

Non-stiff: ours Tsit5 (default PI step-size controller, and ``ours-I`` with
diffrax's I controller: the same steps as diffrax), scipy RK45 and DOP853
(right-hand side in numpy), diffrax Tsit5 (jitted, second call). Ours is
timed in its steady state, past the switch to its fused entry point (`settle`).
Each timed round lasts ~50 ms (calls per round calibrated on warm calls). All at
rtol = atol = 1e-6 (the stiff one too); the error column is the max abs error at the save
points against a reference solved by scipy DOP853 (Radau for the stiff one)
at rtol = atol = 1e-12 (1e-10 stiff).

Run as ``python -m benchmarks.solve [--quick] [--json PATH] [--problem NAME]``.
"""

import numpy as np
from scipy.integrate import solve_ivp

from benchmarks import _harness as H

RTOL = ATOL = 1e-6


# ----------------------------------------------------------------------------- problems


def lotka_volterra():
    import sciml

    def f(u, p, t, nets):
        x, y = u
        return [p.alpha * x - p.beta * x * y, -p.delta * y + p.gamma * x * y]

    model = sciml.Model(f, states=["x", "y"], params=["alpha", "beta", "gamma", "delta"])
    theta = model.init_params(alpha=1.3, beta=0.9, gamma=0.8, delta=1.8)
    a, b, c, d = 1.3, 0.9, 0.8, 1.8
    return dict(
        model=model, theta=theta, u0=[0.44249296, 4.6280594], tspan=(0.0, 3.0),
        saveat=np.linspace(0, 3, 31), stiff=False,
        np_rhs=lambda t, u: np.array([a * u[0] - b * u[0] * u[1], -d * u[1] + c * u[0] * u[1]]),
        jax_rhs=lambda t, u, args: __import__("jax.numpy").numpy.stack(
            [a * u[0] - b * u[0] * u[1], -d * u[1] + c * u[0] * u[1]]),
    )


def spiral():
    import sciml
    from nets import Chain, Dense

    chain = Chain(2, Dense(50, "tanh"), Dense(2))

    def f(u, p, t, nets):
        return nets.U([u[0] ** 3, u[1] ** 3])

    model = sciml.Model(f, states=["x", "y"], params=[], nets={"U": chain})
    theta = model.init_params(seed=0)
    (W1, b1), (W2, b2) = ((v.W, v.b) for v in chain.views(theta.copy()))

    def jax_rhs(t, u, args):
        import jax.numpy as jnp

        return jnp.asarray(W2) @ jnp.tanh(jnp.asarray(W1) @ u**3 + b1) + b2

    return dict(
        model=model, theta=theta, u0=[2.0, 0.0], tspan=(0.0, 1.5),
        saveat=np.linspace(0, 1.5, 30), stiff=False,
        np_rhs=lambda t, u: W2 @ np.tanh(W1 @ u**3 + b1) + b2, jax_rhs=jax_rhs,
    )


def vdp_stiff():
    import sciml

    mu = 1000.0

    def f(u, p, t, nets):
        x, y = u
        return [y, p.mu * (1 - x**2) * y - x]

    model = sciml.Model(f, states=["x", "y"], params=["mu"])

    def jac(t, u):
        return np.array([[0.0, 1.0], [-2 * mu * u[0] * u[1] - 1, mu * (1 - u[0] ** 2)]])

    def jax_rhs(t, u, args):
        import jax.numpy as jnp

        return jnp.stack([u[1], mu * (1 - u[0] ** 2) * u[1] - u[0]])

    return dict(
        model=model, theta=model.init_params(mu=mu), u0=[2.0, 0.0], tspan=(0.0, 3000.0),
        saveat=np.linspace(0, 3000, 101), stiff=True,
        np_rhs=lambda t, u: np.array([u[1], mu * (1 - u[0] ** 2) * u[1] - u[0]]),
        np_jac=jac, jax_rhs=jax_rhs,
    )


PROBLEMS = {"lotka_volterra": lotka_volterra, "spiral": spiral, "vdp_stiff": vdp_stiff}


# ------------------------------------------------------------------------ implementations


def reference(pb):
    method, tol = ("Radau", 1e-10) if pb["stiff"] else ("DOP853", 1e-12)
    kw = {"jac": pb["np_jac"]} if pb["stiff"] else {}
    r = solve_ivp(pb["np_rhs"], pb["tspan"], pb["u0"], method=method, t_eval=pb["saveat"],
                  rtol=tol, atol=tol, **kw)
    assert r.success, r.message
    return r.y.T


def settle(solver, fn):
    """Ours in its steady state: ``sciml.solve`` switches a (solver, model) pair to a
    fused entry point (the model's right-hand side linked into the loop) after
    ``sciml.solvers.erk.FUSE_AFTER`` lean solves, compiling it in a background thread
    (~10 s once per model and machine, then cached on disk); waited for here."""
    from sciml.solvers import erk

    for _ in range(erk.FUSE_AFTER):
        fn()
    thread = getattr(solver, "_fusing", None)
    if thread is not None:
        thread.join()


def impls(pb):
    """[(Impl, solve() -> (T, n) array)] for ours and every installed peer."""
    out = []
    import sciml

    prob = sciml.ODEProblem(pb["model"], pb["u0"], pb["tspan"], pb["theta"])
    solver = sciml.Rodas5() if pb["stiff"] else sciml.Tsit5()

    def ours():
        return sciml.solve(prob, solver, rtol=RTOL, atol=ATOL, saveat=pb["saveat"]).u

    ours.settle = lambda: settle(solver, ours)
    out.append(("ours", ours))
    if not pb["stiff"]:
        # The same method with diffrax's step-size controller (PIDController's default is
        # an I controller: beta2 = 0, err**(-1/5)): the same steps, so the time compares
        # the implementations alone. Our default is Hairer's PI controller (beta2 = 0.04),
        # a few more steps and a smaller error.
        i_solver = sciml.Tsit5(beta2=0.0)

        def ours_i():
            return sciml.solve(prob, i_solver, rtol=RTOL, atol=ATOL, saveat=pb["saveat"]).u

        ours_i.settle = lambda: settle(i_solver, ours_i)

        out.append(("ours-I", ours_i))
    for method in (("Radau", "BDF") if pb["stiff"] else ("RK45", "DOP853")):
        kw = {"jac": pb["np_jac"]} if pb["stiff"] else {}

        def run(method=method, kw=kw):
            r = solve_ivp(pb["np_rhs"], pb["tspan"], pb["u0"], method=method,
                          t_eval=pb["saveat"], rtol=RTOL, atol=ATOL, **kw)
            return r.y.T

        out.append((f"scipy-{method}", run))
    diffrax, err = H.optional_import("diffrax")
    if err is None:
        import jax

        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp

        dsolver = diffrax.Kvaerno5() if pb["stiff"] else diffrax.Tsit5()
        ts = jnp.asarray(pb["saveat"])

        @jax.jit
        def dsolve(y0):
            return diffrax.diffeqsolve(
                diffrax.ODETerm(pb["jax_rhs"]), dsolver, pb["tspan"][0], pb["tspan"][1],
                None, y0, saveat=diffrax.SaveAt(ts=ts), max_steps=1_000_000,
                stepsize_controller=diffrax.PIDController(rtol=RTOL, atol=ATOL)).ys

        y0 = jnp.asarray(pb["u0"], dtype=jnp.float64)
        out.append(("diffrax", lambda: np.asarray(dsolve(y0).block_until_ready())))
    else:
        out.append(("diffrax", err))
    return out


def main(argv=None):
    ap = H.make_parser(__doc__.splitlines()[0])
    ap.add_argument("--problem", choices=sorted(PROBLEMS), action="append")
    args = ap.parse_args(argv)
    rows_all = {}
    for name in args.problem or PROBLEMS:
        pb = PROBLEMS[name]()
        ref = reference(pb)
        entries, quality = [], {}
        for label, fn in impls(pb):
            if isinstance(fn, str):
                entries.append(H.Impl(label, error=fn))
                continue

            def warm(fn=fn, label=label, quality=quality, ref=ref):
                quality[label] = {"max_abs_err": float(np.max(np.abs(fn() - ref)))}

            # rounds of ~50 ms each (calls per round calibrated on warm calls)
            target_s = 0.01 if args.quick else 0.05
            entries.append(H.Work(label, fn, target_s, max_units=100_000, warmup=warm,
                                  settle=getattr(fn, "settle", None)).impl)
        H.time_alternating(entries, repeats=3 if args.quick else 7)
        rows = [H.result_row(e, "solve", quality.get(e.name)) for e in entries]
        print(f"\n== {name}  (rtol = atol = {RTOL:g}; error vs a tight reference)")
        H.print_table(rows, ours="ours")
        med = {r["impl"]: r["median_s"] for r in rows if r.get("median_s")}
        if "ours-I" in med:
            print("same controller as diffrax (ours-I): " + "  ".join(
                f"{k}/ours-I {v / med['ours-I']:.2f}x" for k, v in med.items()
                if not k.startswith("ours")))
        rows_all[name] = rows
    if args.json:
        import json

        with open(args.json, "w") as fh:
            json.dump({"bench": "solve", "machine": H.machine_info(args.threads),
                       "results": [dict(r, problem=k) for k, v in rows_all.items() for r in v],
                       "ratios": {k: H.ratios(v, ours="ours") for k, v in rows_all.items()}},
                      fh, indent=2)


if __name__ == "__main__":
    main()
