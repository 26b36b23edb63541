"""Benchmark 3, ``ude_lotka_volterra``: gradients and the whole fit of the Lotka-Volterra UDE.

Scenario 1 of the UDE paper (Rackauckas et al. 2020): alpha, beta, gamma,
delta = 1.3, 0.9, 0.8, 1.8; u0 = [0.44249296, 4.6280594]; tspan (0, 3); the
full model observed at t = 0, 0.1, ..., 3 (31 points, SciPy DOP853 at rtol =
atol = 1e-12) plus noise 0.05 * mean(state over time) * randn (NumPy
``default_rng(1234)``). The UDE, as in the paper, keeps the known linear
terms and starts from the first noisy observation:

    dx/dt = alpha x + U1(x, y),    dy/dt = -delta y + U2(x, y),

U = Dense(2 -> 5, rbf), Dense(5 -> 5, rbf), Dense(5 -> 5, rbf), Dense(5 -> 2),
rbf(z) = exp(-z^2), fed the raw states (the paper's setup), 87 weights in
nets' flat layout (``Chain.init_params(seed=0)``, copied into the peer).
Loss: sum of squared errors against the noisy data.

Two work units:

- ``grad``: one loss + gradient at the initial weights, Tsit5, rtol = atol =
  1e-6: ours with every ``adjoints`` method, and diffrax (jitted
  ``value_and_grad``, RecursiveCheckpointAdjoint, Tsit5, PIDController, the
  same flat parameters through a pure-JAX MLP). Quality: the loss and the
  relative 2-norm error of the gradient against a reference from diffrax at
  rtol = atol = 1e-12 (cross-checked by central differences of a SciPy
  DOP853 loss at 1e-12 on a few weights; central differences on every weight
  when JAX is missing).
- ``fit``: our whole fit, ``sciml.fit`` with Adam(0.1) x 200 then L-BFGS to
  convergence (at most 20,000 iterations), default adjoint (DiscreteAdjoint
  here: the exact gradient of the computed loss), two ways: ``ours-fit``,
  the paper's setup above (raw inputs, plain SSE), and ``ours-fit-decay``,
  the configuration of ``examples/lotka_volterra_ude.py`` (inputs scaled by
  their largest observed value rounded up, weight decay 0.005 on U's
  hidden-layer weight matrices through ``sciml.fit(penalty=)``). Quality:
  the final loss (SSE, without the penalty), the noise level (sum of the
  squared noise: what the true model leaves from the true u0), and the
  relative error of the learned U against the missing terms (-beta x y,
  gamma x y) at the 31 times along the true trajectory (``u_rel_err``, the
  headline) and along the fitted one (``u_rel_err_fitted``).
- ``--seeds N`` (default 5; 0 with ``--quick``): both fits again on N noise
  draws (seeds 1234, 1235, ...), untimed, with the spread (mean, min, max)
  of the U error and of loss / noise, beside a reference: the true form
  with beta and gamma fitted to the same data (what knowing the missing
  terms' form recovers; at 5 % noise it misses U by ~5 % on average).

Run as ``python -m benchmarks.ude_lotka_volterra [--quick] [--json PATH] [--threads N]
[--seeds N]``.
"""

from __future__ import annotations

import os

# scipy's L-BFGS-B (the fit) calls OpenBLAS on tiny arrays: several BLAS threads only add
# hand-off latency (up to 100x per step on a busy 2-core machine). Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import io  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

from benchmarks import _harness as H  # noqa: E402

ALPHA, BETA, GAMMA, DELTA = 1.3, 0.9, 0.8, 1.8
U0 = np.array([0.44249296, 4.6280594])
TSPAN = (0.0, 3.0)
TS = np.linspace(0.0, 3.0, 31)
NOISE, NOISE_SEED, INIT_SEED = 0.05, 1234, 0
SIZES = (2, 5, 5, 5, 2)
N_PARAMS = sum(i * o + o for i, o in zip(SIZES[:-1], SIZES[1:]))  # 87
RTOL = ATOL = 1e-6
TIGHT = 1e-12
# Our rows: (row name, adjoints class name, constructor keywords).
OUR_METHODS = [
    ("ours-interp", "InterpolatingAdjoint", {}),
    ("ours-backsolve", "BacksolveAdjoint", {}),
    ("ours-gauss", "GaussAdjoint", {}),
    ("ours-quadrature", "QuadratureAdjoint", {}),
    ("ours-forward", "ForwardSensitivity", {}),
    ("ours-discrete", "DiscreteAdjoint", {}),
]


# --------------------------------------------------------------------------- problem (NumPy)


def full_rhs(t, u):
    x, y = u
    return [ALPHA * x - BETA * x * y, GAMMA * x * y - DELTA * y]


def data() -> tuple[np.ndarray, np.ndarray]:
    """(truth (31, 2) at rtol = atol = 1e-12, noisy observations (31, 2))."""
    r = solve_ivp(full_rhs, TSPAN, U0, method="DOP853", t_eval=TS, rtol=TIGHT, atol=TIGHT)
    if not r.success:
        raise RuntimeError(f"truth: solve_ivp failed: {r.message}")
    X = r.y.T.copy()
    rng = np.random.default_rng(NOISE_SEED)
    return X, X + NOISE * X.mean(axis=0) * rng.standard_normal(X.shape)


def initial_params(seed: int = INIT_SEED) -> np.ndarray:
    """The draw of ``nets.Chain.init_params(seed)`` for U (`benchmarks._harness.dense_init`),
    for the peer when ours cannot run."""
    return H.dense_init(SIZES, seed)


def mlp(p, x, xp=np):
    """U(x) for one state (2,) or a batch (N, 2); rbf hidden layers, linear output."""
    return H.dense_forward(p, SIZES, x, lambda h: xp.exp(-h * h), xp)


def ude_rhs(p):
    def f(t, u):
        z = mlp(p, u)
        return [ALPHA * u[0] + z[0], -DELTA * u[1] + z[1]]

    return f


def scipy_loss(p, Xn, tol=TIGHT) -> float:
    r = solve_ivp(ude_rhs(p), TSPAN, Xn[0], method="DOP853", t_eval=TS, rtol=tol, atol=tol)
    if not r.success:
        raise RuntimeError(f"scipy_loss: solve_ivp failed: {r.message}")
    return float(np.sum((r.y.T - Xn) ** 2))


def central_differences(p, Xn, coords, h=1e-5) -> np.ndarray:
    out = []
    for i in coords:
        e = np.zeros_like(p)
        e[i] = h * max(1.0, abs(p[i]))
        out.append((scipy_loss(p + e, Xn) - scipy_loss(p - e, Xn)) / (2 * e[i]))
    return np.array(out)


def missing_terms(X):
    xy = X[:, 0] * X[:, 1]
    return np.stack([-BETA * xy, GAMMA * xy], axis=1)


def rel_err(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


# --------------------------------------------------------------------------- timing helper


# --------------------------------------------------------------------------- ours


def paper_model():
    """(model, chain): the UDE as the paper writes it, U fed the raw states."""
    import sciml
    from nets import Chain, Dense

    chain = Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(5, "rbf"), Dense(2))

    def lv_ude(u, p, t, nets):
        x, y = u
        z = nets.U(u)
        return [ALPHA * x + z[0], -DELTA * y + z[1]]

    return sciml.Model(lv_ude, states=["x", "y"], params=[], nets={"U": chain}), chain


def our_setup(Xn):
    """(sciml, nets, model, chain, prob, data, theta, note) or raises."""
    import nets
    import sciml

    model, chain = paper_model()
    theta = model.init_params(seed=INIT_SEED)
    prob = sciml.ODEProblem(model, Xn[0], TSPAN, theta)
    d = sciml.Data(t=TS, y=Xn)
    # Our traced model must be the network the peer runs.
    u = sciml.solve(prob, sciml.Tsit5(), rtol=1e-10, atol=1e-10, saveat=TS).u
    r = solve_ivp(ude_rhs(theta), TSPAN, Xn[0], method="DOP853", t_eval=TS, rtol=1e-10,
                  atol=1e-10)
    err = float(np.abs(u - r.y.T).max())
    note = f"our traced model vs the NumPy network: max |u diff| {err:.2g} at rtol 1e-10"
    if not np.array_equal(theta, initial_params()):
        note += " [WARNING: init_params differs from the draw the peers assume; peers get ours]"
    if not err < 1e-7:
        note += " [WARNING: not the same network]"
    return sciml, nets, model, chain, prob, d, theta, note


def our_grad_impls(ours, target_s):
    names = [n for n, _, _ in OUR_METHODS]
    if isinstance(ours, str):
        return [H.Impl(n, error=ours) for n in names]
    sciml, _, _, _, prob, d, theta, _ = ours
    return H.sciml_grad_works(OUR_METHODS, sciml, prob, d, theta, RTOL, ATOL, target_s)


DECAY = 0.005  # the example's weight decay on U's hidden-layer weights at 5 % noise
LBFGS_ITERS = 20_000


def fit_setup(Xn, decay):
    """(sciml, nets, prob, data, U(theta, X), penalty or None) for one data set.

    ``decay`` None: the paper's setup (raw inputs, plain SSE); a number: the
    example's (scaled inputs, hidden-layer weight decay of that strength).
    """
    import nets
    import sciml

    if decay is None:
        model, chain = paper_model()
        scale, penalty = np.ones(2), None
    else:
        from examples import lotka_volterra_ude as ex

        scale = np.ceil(np.abs(Xn).max(axis=0))
        model, chain = ex.ude_model(scale)
        penalty = ex.hidden_weight_decay(model, chain, decay)
    prob = sciml.ODEProblem(model, Xn[0], TSPAN, model.init_params(seed=INIT_SEED))

    def U_of(theta, X):
        return chain(X / scale, theta[model.param_slices["U"]])

    return sciml, nets, prob, sciml.Data(t=TS, y=Xn), U_of, penalty


def one_fit(X, Xn, decay, quick):
    """Fit once; (quality dict, evaluations)."""
    import warnings

    sciml, nets, prob, d, U_of, penalty = fit_setup(Xn, decay)
    iters = (50, 100) if quick else (200, LBFGS_ITERS)
    with warnings.catch_warnings():
        # a long step can land where the ODE blows up: the stage ends, the best point stays
        warnings.simplefilter("ignore", sciml.SolveWarning)
        warnings.simplefilter("ignore", sciml.FitWarning)
        res = sciml.fit(prob, d, optimizers=[nets.Adam(0.1, iters=iters[0]),
                                             sciml.LBFGS(iters=iters[1])],
                        rtol=RTOL, atol=ATOL, penalty=penalty, progress=False)
    X_fit = sciml.solve(prob.remake(params=res.params), sciml.Tsit5(), rtol=1e-8, atol=1e-8,
                        saveat=TS).u
    noise = float(np.sum((Xn - X) ** 2))
    q = dict(final_loss=res.loss, noise_sse=noise, loss_over_noise=res.loss / noise,
             u_rel_err=rel_err(U_of(res.params, X), missing_terms(X)),
             u_rel_err_fitted=rel_err(U_of(res.params, X_fit), missing_terms(X_fit)),
             n_iters=res.n_iters, n_evals=res.n_evals, ms_per_eval=None)
    return q, res.n_evals


def our_fit_impl(ours, X, Xn, quick, name="ours-fit", decay=None):
    """The whole fit as one unit of work; quality filled in by each run.

    ``decay``: None for the paper's setup, a number for the example's configuration.
    """
    if isinstance(ours, str):
        return H.Impl(name, error=ours), {}
    quality = {}

    def run():
        q, n_evals = one_fit(X, Xn, decay, quick)
        quality.update(q)
        quality["_evals"] = n_evals

    def warmup():
        sciml, _, prob, d, _, _ = fit_setup(Xn, decay)
        sciml.loss_and_grad(prob, d)  # compile or load the kernels

    return H.Impl(name, run=run, warmup=warmup), quality


def reference_error(X, Xn):
    """U error of the true form with beta, gamma fitted to `Xn` from Xn[0] (and loss/noise)."""
    from examples import lotka_volterra_ude as ex

    beta, gamma, loss = ex.reference_fit(Xn)
    xy = X[:, 0] * X[:, 1]
    return rel_err(np.stack([-beta * xy, gamma * xy], axis=1), missing_terms(X)), \
        loss / float(np.sum((Xn - X) ** 2))


def seed_spread(X, n_seeds, quick):
    """Both fits and the reference on `n_seeds` noise draws: {name: {metric: [values]}}."""
    rng_seeds = [NOISE_SEED + k for k in range(n_seeds)]
    out = {"seeds": rng_seeds, "ours-fit": {}, "ours-fit-decay": {}, "reference": {}}
    for seed in rng_seeds:
        Xn = X + NOISE * X.mean(axis=0) * np.random.default_rng(seed).standard_normal(X.shape)
        for name, decay in (("ours-fit", None), ("ours-fit-decay", DECAY)):
            q, _ = one_fit(X, Xn, decay, quick)
            for k in ("u_rel_err", "u_rel_err_fitted", "loss_over_noise"):
                out[name].setdefault(k, []).append(q[k])
        err, ratio = reference_error(X, Xn)
        out["reference"].setdefault("u_rel_err", []).append(err)
        out["reference"].setdefault("loss_over_noise", []).append(ratio)
    return out


def print_spread(spread):
    seeds = spread["seeds"]
    print(f"\n== spread over {len(seeds)} noise draws (seeds {seeds[0]} - {seeds[-1]}; untimed): "
          "mean [min, max]")
    for name in ("ours-fit", "ours-fit-decay", "reference"):
        parts = []
        for k, pct in (("u_rel_err", True), ("u_rel_err_fitted", True),
                       ("loss_over_noise", False)):
            v = spread[name].get(k)
            if v:
                f = 100.0 if pct else 1.0
                parts.append(f"{k} {f * np.mean(v):.{1 if pct else 2}f} "
                             f"[{f * np.min(v):.{1 if pct else 2}f}, "
                             f"{f * np.max(v):.{1 if pct else 2}f}]{' %' if pct else ''}")
        print(f"{name:>16}: " + "; ".join(parts))
    print(f"{'':>16}  (reference: the true form with beta, gamma fitted to the same data from "
          "the same noisy u0)")


# --------------------------------------------------------------------------- diffrax peer


def setup_jax(threads):
    """Import JAX in float64 on the CPU with the thread flags set first; (jax or None, note)."""
    note = "XLA default (all cores)"
    if threads < H.available_cpus():
        flag = ("--xla_cpu_multi_thread_eigen=false" if threads == 1
                else f"intra_op_parallelism_threads={threads}")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        note = f"XLA_FLAGS {flag} (best effort)"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax, err = H.optional_import("jax")
    if err is not None:
        return None, err
    jax.config.update("jax_enable_x64", True)
    return jax, note


def diffrax_loss_and_grad(jax, diffrax, Xn, rtol, atol, max_steps=4096):
    """Jitted ``p -> (loss, grad)``: the UDE in pure JAX on the flat vector p, diffrax Tsit5."""
    jnp = jax.numpy

    def vf(t, u, p):
        z = mlp(p, u, jnp)
        return jnp.stack([ALPHA * u[0] + z[0], -DELTA * u[1] + z[1]])

    term = diffrax.ODETerm(vf)
    y0, ts, Y = jnp.asarray(Xn[0]), jnp.asarray(TS), jnp.asarray(Xn)

    def loss(p):
        sol = diffrax.diffeqsolve(
            term, diffrax.Tsit5(), TSPAN[0], TSPAN[1], None, y0, args=p,
            saveat=diffrax.SaveAt(ts=ts), adjoint=diffrax.RecursiveCheckpointAdjoint(),
            max_steps=max_steps, stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol))
        return jnp.sum((sol.ys - Y) ** 2)

    return jax.jit(jax.value_and_grad(loss))


def diffrax_impl(jax, jerr, p0, Xn, target_s):
    diffrax, err = (None, jerr) if jax is None else H.optional_import("diffrax")
    if err is not None:
        return H.Impl("diffrax-recursive", error=err)
    vg = diffrax_loss_and_grad(jax, diffrax, Xn, RTOL, ATOL)
    p = jax.numpy.asarray(p0)

    def fn():
        v, g = jax.block_until_ready(vg(p))
        return float(v), np.asarray(g)

    return H.GradWork("diffrax-recursive", fn, target_s)


# --------------------------------------------------------------------------- reference


def reference_gradient(jax, p0, Xn):
    """(loss, gradient, lines): diffrax at 1e-12, checked by central differences."""
    lines = []
    diffrax, err = (None, "jax unavailable") if jax is None else H.optional_import("diffrax")
    if err is None:
        t0 = time.perf_counter()
        vg = diffrax_loss_and_grad(jax, diffrax, Xn, TIGHT, TIGHT, max_steps=200_000)
        v, g = jax.block_until_ready(vg(jax.numpy.asarray(p0)))
        v, g = float(v), np.asarray(g, dtype=np.float64)
        lines.append(f"reference: diffrax Tsit5 + RecursiveCheckpointAdjoint at rtol = atol = "
                     f"1e-12 ({time.perf_counter() - t0:.1f} s); loss {v:.10g}")
        order = np.argsort(np.abs(g))
        coords = sorted({int(order[-1]), int(order[-2]), int(order[len(order) // 2])})
    else:
        coords = list(range(N_PARAMS))
        lines.append(f"reference: central differences of the SciPy DOP853 loss at 1e-12 on "
                     f"every weight (diffrax: {err})")
        v, g = scipy_loss(p0, Xn), None
    fd = central_differences(p0, Xn, coords)
    if g is None:
        return v, fd, lines
    rel = np.abs(fd - g[coords]) / np.maximum(np.abs(g[coords]), 1e-300)
    lines.append("  vs central differences (step 1e-5) of the SciPy DOP853 loss at 1e-12: "
                 + ", ".join(f"theta[{i}] rel {r:.1e}" for i, r in zip(coords, rel)))
    if rel.max() > 1e-5:
        lines.append("  [WARNING: the reference gradient does not agree with its cross-check]")
    return v, g, lines


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = H.make_parser(__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=None,
                    help="noise draws for the spread of the fit's quality (default 5; 0 with "
                         "--quick)")
    args = ap.parse_args(argv)
    n_seeds = (0 if args.quick else 5) if args.seeds is None else max(0, args.seeds)
    threads = max(1, args.threads)
    rounds, target_s, fit_rounds = (2, 0.05, 1) if args.quick else (7, 0.3, 3)
    jax, jnote = setup_jax(threads)
    jerr = None if jax is not None else jnote

    X, Xn = data()
    try:
        ours = our_setup(Xn)
        p0, model_note = ours[6], ours[7]
    except Exception as e:  # ours broken: every row says why, the peer still runs
        ours, p0, model_note = H.error_text(e), initial_params(), None
    ref_v, ref_g, ref_lines = reference_gradient(jax, p0, Xn)

    machine = H.machine_info(threads)
    print(f"ude_lotka_volterra: UDE paper scenario 1, 31 points with {100 * NOISE:g} % noise; "
          f"U = 2 -> 5 rbf -> 5 rbf -> 5 rbf -> 2 ({N_PARAMS} weights), raw state inputs; "
          f"SSE; Tsit5, rtol = atol = {RTOL:g}{' [--quick]' if args.quick else ''}")
    print(f"machine: {machine['cpus']} cpus, {machine['cpu']}; threads {threads} (jax {jnote}); "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}; {H.busy_note()}")
    if model_note:
        print(model_note)
    for line in ref_lines:
        print(line)
    print()

    # --- one loss + gradient
    works = our_grad_impls(ours, target_s) + [diffrax_impl(jax, jerr, p0, Xn, target_s)]
    impls = [w.impl if isinstance(w, H.GradWork) else w for w in works]
    mon = H.OtherLoad().start()
    H.time_alternating(impls, rounds)
    grad_load = H.OtherLoad.note(mon.stop(), "during the timing")
    grad_rows = []
    for w in works:
        q = None
        if isinstance(w, H.GradWork) and w.result is not None:
            v, g = w.result
            q = {"loss": v, "grad_rel_err": rel_err(g, ref_g) if g.shape == ref_g.shape
                 else float("nan")}
        grad_rows.append(H.result_row(w.impl if isinstance(w, H.GradWork) else w, "grad", q))
    ok = [r for r in grad_rows if r["impl"].startswith("ours") and r.get("median_s")]
    fastest = min(ok, key=lambda r: r["median_s"])["impl"] if ok else "ours-interp"
    print("== one loss + gradient at the initial weights (grad_rel_err vs the reference; "
          "first call = compile or cache load + one gradient)")
    H.print_table(grad_rows, ours=fastest)
    print(grad_load)

    # --- the whole fit
    fits = [our_fit_impl(ours, X, Xn, args.quick),
            our_fit_impl(ours, X, Xn, args.quick, "ours-fit-decay", DECAY)]
    mon = H.OtherLoad().start()
    H.time_alternating([f for f, _ in fits], fit_rounds)
    fit_load = H.OtherLoad.note(mon.stop(), "during the timing")
    fit_rows = []
    for fit_impl, fit_q in fits:
        if fit_q and fit_impl.times:
            fit_q["ms_per_eval"] = 1e3 * float(np.median(fit_impl.times)) / fit_q["_evals"]
        fit_q.pop("_evals", None)
        fit_rows.append(H.result_row(fit_impl, "fit", fit_q))
    iters = "Adam(0.1) x 50 + L-BFGS x 100 [--quick]" if args.quick else \
        f"Adam(0.1) x 200 + L-BFGS to convergence (<= {LBFGS_ITERS:,})"
    print(f"\n== the whole fit: {iters}, default adjoint; ours-fit: the paper's setup; "
          f"ours-fit-decay: scaled inputs + weight decay {DECAY:g} on U's hidden-layer weights "
          "(the example's); u_rel_err = |U - (-beta x y, gamma x y)| / |...| along the true "
          "trajectory (u_rel_err_fitted: along the fitted one); noise_sse = what the true model "
          "leaves")
    buf = io.StringIO()
    H.print_table(fit_rows, ours="ours-fit", file=buf)
    # No peer here: the ratio of the two fits of ours says nothing about speed alone (they
    # run different numbers of iterations), so the table's ratios line is left out.
    print("\n".join(ln for ln in buf.getvalue().splitlines() if not ln.startswith("ratios")))
    print(fit_load)
    spread = None
    if n_seeds and not isinstance(ours, str):
        spread = seed_spread(X, n_seeds, args.quick)
        print_spread(spread)

    if args.json:
        rows = [dict(r, work="grad") for r in grad_rows] + [dict(r, work="fit")
                                                             for r in fit_rows]
        doc = {"bench": "ude_lotka_volterra", "machine": machine, "results": rows,
               "ratios": H.ratios(grad_rows, ours=fastest)}
        if spread is not None:
            doc["fit_seed_spread"] = spread
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
