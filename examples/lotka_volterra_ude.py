"""Recover the missing interaction terms of Lotka-Volterra with a universal differential equation.

Scenario 1 of Rackauckas et al., "Universal Differential Equations for
Scientific Machine Learning" (2020). The truth is

    dx/dt = alpha x - beta x y,      dy/dt = gamma x y - delta y,

alpha, beta, gamma, delta = 1.3, 0.9, 0.8, 1.8, u0 = [0.44249296, 4.6280594],
observed at t = 0, 0.1, ..., 3 (31 points; solved at rtol = atol = 1e-12)
with noise 0.05 * mean(state over time) * randn (NumPy ``default_rng(1234)``).
The UDE keeps the known linear terms and learns the rest with a network U:

    dx/dt = alpha x + U1(x, y),      dy/dt = -delta y + U2(x, y),

U = Chain(2, Dense(5, rbf), Dense(5, rbf), Dense(5, rbf), Dense(2)),
rbf(z) = exp(-z^2), 87 weights. As in the paper, alpha and delta are known
(fixed numbers in the model function), only U's weights are fitted, by
Adam(0.1) x 200 iterations then L-BFGS to convergence (scipy's defaults
here: gtol 1e-8, ftol 1e-12; at most 20,000 iterations), on the sum of
squared errors, and the UDE starts from the first noisy observation.

Two additions to the paper's recipe, each measured over noise seeds (below):

- Weight decay on U's hidden layers: ``DECAY * sum(W**2)`` over the weight
  matrices of the three rbf layers (not their biases, not the output
  layer), added to the loss through ``sciml.fit(..., penalty=...)``. The
  hidden weights set how fast the rbf features vary with the state, so the
  decay asks for a smooth U; the output layer sets U's size, and decaying
  it too (plain ``sciml.fit(..., l2=)``) pulls U towards zero exactly where
  it is largest (t < 0.3) and does worse. The strength, 0.005 at the
  paper's 5 % noise, is a noise variance over a prior variance of the
  weights (a MAP estimate), so by default it follows the noise variance:
  ``0.005 * (noise / 0.05)**2``, none without noise. ``--decay 0`` is the
  paper's plain fit.
- Input scaling: each state is divided by its largest observed value,
  rounded up, before U (``--no-scale`` feeds the raw states): an rbf unit
  is flat (exp(-z^2) ~ 0, no gradient) once ``|W u + b|`` exceeds ~3, and y
  reaches 4.6. The scale comes from the noisy data, not the truth; it is
  a fixed number in the model, not a parameter. Without noise the scaled
  network learns U to 2.2 % along the trajectory, the raw one to 6.8 %.

What to expect: the relative 2-norm error of U against the missing terms
(-beta x y, gamma x y) at the 31 times of the true trajectory (the one
the training data sample: the headline), and along the fitted trajectory;
``--seeds 10``, noise seeds 1234-1243:

    fit                                 U error, true traj.     fitted traj.    loss/noise
    plain (--decay 0)                   72 % mean (13 - 189)    68 % (14 - 158)  0.52 - 0.96
    hidden-layer decay 0.005 (default)  19 % mean (9.8 - 32)    17 % (9.5 - 28)  0.78 - 0.98
    reference: true form, beta, gamma    5.3 % mean (0.8 - 12)                   0.92 - 1.07

The default seed (1234, ``make demo``): 17.0 % (21.2 % along the fitted
trajectory; 15.9 and 19.1 % before 2026-12-07), loss 0.88 x the noise level; the
reference 8.8 %. One seed's
figure is fragile: ``benchmarks/ude_lotka_volterra.py`` draws the same
noise on a truth from another solver (different by ~1e-12) and its fit
ends in another minimum, 24.7 %; quote the spread over seeds. The
decay's form and strength were chosen on seeds 1234 and 1-7, checked on
seeds 11-20, then set on 20 fresh seeds (21-40): decay 0.003 gave 21 %
mean with one 62 % outlier, 0.005 gave 18 % (8 - 32 %) with the loss
below the noise on every seed, 0.01 gave 17 % but left the loss above
the noise on 2 of 20.

**Below 5 % is out of reach at the paper's 5 % noise.** The reference
fits the two true coefficients, beta and gamma, to the same data from the
same noisy initial state: knowing the form exactly, it still misses U by
5 % on average and up to 12 %, and its loss exceeds the noise level on
some seeds (the noisy starting point costs it). U is large only over the
first 0.3 time units (x y falls from 2 to 0.2), where 4 noisy points
constrain it, and those times carry 60-94 % of the network's squared
error. A network of 87 weights has to be held back to be identified at
all, and that costs bias: the same decay without noise leaves 13 % (hence
no decay when there is no noise). The fit also has several minima of
about the same loss: on seed 1234, six initial weight draws give 16-26 %
(even rounding differences in the penalty move L-BFGS from one to
another), and averaging their six U's gives 20 %, so neither restarts nor
ensembles remove the noise draw's effect.

Tried and not adopted: decay on all of U's parameters (``l2=``: 24-27 %
mean), on the first layer only (6-53 %), stopping L-BFGS at the
estimated noise level (the loss then ends above the noise on some seeds),
fitting the initial state too (through an offset parameter: no better for
the network, though it brings the reference to ~3 %), another adjoint
(GaussAdjoint: the same answer, 4x slower than the default
DiscreteAdjoint), looser L-BFGS tolerances (the same mean). Later
versions of the paper's tutorial use 0.5 % noise, and the paper goes on
to sparse regression (SINDy) on the learned U.

Printed: the final loss against the noise level (the sum of the squared
noise that was added: what the true model from the true u0 would leave),
the relative error
of U along the true trajectory (headline) and along the fitted one, and
the reference. ``--seeds N`` repeats the fit over N noise draws and prints
the spread. A PNG (data vs fit; learned U vs the true terms) goes to
``examples/output/lotka_volterra_ude.png``.

Run with ``make demo`` or ``python -m examples.lotka_volterra_ude [--quick] [--seeds N]``.
"""

import argparse
import os
import time

# scipy's L-BFGS-B does its tiny linear algebra in OpenBLAS; with more than one BLAS thread
# on a busy machine each of its steps can cost a millisecond of thread hand-offs (more
# than our gradient). One thread, unless the user chose otherwise; set before numpy loads
# (sciml.fit also limits BLAS threads through threadpoolctl while L-BFGS runs).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import warnings  # noqa: E402

import numpy as np  # noqa: E402

import nets  # noqa: E402
import sciml  # noqa: E402
from nets import Chain, Dense  # noqa: E402

ALPHA, BETA, GAMMA, DELTA = 1.3, 0.9, 0.8, 1.8
U0 = [0.44249296, 4.6280594]
TSPAN = (0.0, 3.0)
T_OBS = np.linspace(0.0, 3.0, 31)  # saveat 0.1
NOISE = 0.05
SEED = 1234  # noise draw
INIT_SEED = 0  # U's initial weights
DECAY = 0.005  # weight decay on U's hidden-layer weight matrices at the paper's noise
LBFGS_ITERS = 20_000  # "to convergence": the fits here stop by themselves at 4,000-12,000
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "output",
                   "lotka_volterra_ude.png")


@sciml.compiled_only()  # the same data with a cold cache as with a warm one (see its text)
def truth():
    """The exact trajectory at `T_OBS` (31, 2), solved at rtol = atol = 1e-12."""

    def lv(u, p, t, nets):
        x, y = u
        return [p.alpha * x - p.beta * x * y, p.gamma * x * y - p.delta * y]

    model = sciml.Model(lv, states=["x", "y"], params=["alpha", "beta", "gamma", "delta"])
    theta = model.init_params(alpha=ALPHA, beta=BETA, gamma=GAMMA, delta=DELTA)
    prob = sciml.ODEProblem(model, U0, TSPAN, theta)
    return sciml.solve(prob, sciml.Vern7(), rtol=1e-12, atol=1e-12, saveat=T_OBS).u


def noisy(X, level=NOISE, seed=SEED):
    """X + level * mean(X over time, per state) * standard normal noise (the paper's recipe)."""
    rng = np.random.default_rng(seed)
    return X + level * X.mean(axis=0) * rng.standard_normal(X.shape)


def ude_model(scale):
    """The UDE with the known linear terms; U sees the states divided by `scale`."""
    chain = Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(5, "rbf"), Dense(2))
    sx, sy = (float(s) for s in scale)

    def lv_ude(u, p, t, nets):
        x, y = u
        z = nets.U([x / sx, y / sy])
        return [ALPHA * x + z[0], -DELTA * y + z[1]]

    return sciml.Model(lv_ude, states=["x", "y"], params=[], nets={"U": chain}), chain


def hidden_weight_decay(model, chain, lam):
    """``theta -> (value, gradient)``: lam * sum of squares of U's hidden weight matrices.

    The biases and the output layer are left free (see the module docstring).
    """
    in_chain = np.zeros(chain.n_params)
    for v in chain.views(in_chain)[:-1]:  # every layer but the output one: its W only
        v.W[...] = 1.0
    mask = np.zeros(model.n_params, dtype=bool)
    mask[model.param_slices["U"]] = in_chain > 0

    def penalty(theta):
        w = theta[mask]
        grad = np.zeros_like(theta)
        grad[mask] = 2.0 * lam * w
        return lam * float(w @ w), grad

    return penalty


def learned_terms(model, chain, theta, X, scale):
    """U at the states X (N, 2), as the model applies it."""
    return chain(X / np.asarray(scale), theta[model.param_slices["U"]])


def missing_terms(X):
    """The true terms the network must learn: (-beta x y, gamma x y)."""
    xy = X[:, 0] * X[:, 1]
    return np.stack([-BETA * xy, GAMMA * xy], axis=1)


def rel_err(a, b):
    """Relative 2-norm error of `a` against `b` over all entries."""
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


_REFERENCE = []  # the reference model, built once (its kernels compile once)


def reference_fit(Xn):
    """The true form with beta and gamma fitted to the same data from the same noisy u0.

    Returns (beta, gamma, final loss): what knowing the missing terms' form exactly
    recovers, and the loss it leaves.
    """
    if not _REFERENCE:
        def lv_known(u, p, t, nets):
            x, y = u
            return [ALPHA * x - p.beta * x * y, p.gamma * x * y - DELTA * y]

        _REFERENCE.append(sciml.Model(lv_known, states=["x", "y"], params=["beta", "gamma"]))
    model = _REFERENCE[0]
    prob = sciml.ODEProblem(model, Xn[0], TSPAN, model.init_params(beta=0.5, gamma=0.5))
    res = sciml.fit(prob, sciml.Data(t=T_OBS, y=Xn), optimizers=[sciml.LBFGS(iters=500)],
                    rtol=1e-8, atol=1e-8, progress=False)
    return float(res.params[0]), float(res.params[1]), float(res.loss)


def run(X, seed, noise=NOISE, decay=DECAY, scale_inputs=True, quick=False, backend="numba",
        progress=False):
    """One noisy data set and one fit; a dict of the numbers (and the objects to plot)."""
    Xn = noisy(X, noise, seed)
    noise_sse = float(np.sum((Xn - X) ** 2))
    # Round the scale up to whole numbers: it is baked into the compiled model, and a scale
    # that moved with every data set would recompile the model for each.
    scale = np.ceil(np.abs(Xn).max(axis=0)) if scale_inputs else np.ones(2)
    model, chain = ude_model(scale)
    theta0 = model.init_params(seed=INIT_SEED)
    # As in the paper, the UDE starts from the first (noisy) observation, not the true u0.
    prob = sciml.ODEProblem(model, Xn[0], TSPAN, theta0)
    data = sciml.Data(t=T_OBS, y=Xn)
    iters = (50, 100) if quick else (200, LBFGS_ITERS)
    optimizers = [nets.Adam(0.1, iters=iters[0]), sciml.LBFGS(iters=iters[1])]
    penalty = hidden_weight_decay(model, chain, decay) if decay > 0 else None

    t0 = time.perf_counter()
    sciml.loss_and_grad(prob, data)  # compiles the kernels, or loads them from the disk cache
    first = time.perf_counter() - t0
    with warnings.catch_warnings():
        # A long step (Adam at 0.1, an L-BFGS line search) can land where the ODE blows up:
        # the solver warns, the stage ends and the fit keeps its best point; said below.
        warnings.simplefilter("ignore", sciml.SolveWarning)
        warnings.simplefilter("ignore", sciml.FitWarning)
        result = sciml.fit(prob, data, optimizers=optimizers, rtol=1e-6, atol=1e-6,
                           penalty=penalty, progress=progress, backend=backend)
    why = {"nonfinite": "ended at a step where the ODE blew up, best point kept"}
    stopped = ", ".join(f"{type(o).__name__} {why.get(st['stopped'], st['stopped'])}"
                        for o, st in zip(optimizers, result.stages))

    U_true = missing_terms(X)
    U_hat = learned_terms(model, chain, result.params, X, scale)
    # The same along the fitted trajectory: the states the UDE itself visits.
    X_fit = sciml.solve(prob.remake(params=result.params), sciml.Tsit5(), rtol=1e-8, atol=1e-8,
                        saveat=T_OBS).u
    beta, gamma, ref_loss = reference_fit(Xn)
    U_ref = np.stack([-beta * X[:, 0] * X[:, 1], gamma * X[:, 0] * X[:, 1]], axis=1)
    return {
        "seed": seed, "loss": result.loss, "penalty": result.penalty, "noise_sse": noise_sse,
        "u_rel_err": rel_err(U_hat, U_true),
        "u_rel_err_each": np.linalg.norm(U_hat - U_true, axis=0)
        / np.linalg.norm(U_true, axis=0),
        "u_rel_err_fitted": rel_err(learned_terms(model, chain, result.params, X_fit, scale),
                                    missing_terms(X_fit)),
        "ref_rel_err": rel_err(U_ref, U_true), "ref_beta_gamma": (beta, gamma),
        "ref_loss": ref_loss,
        "time_s": result.time_s, "first_call_s": first, "n_iters": result.n_iters,
        "n_evals": result.n_evals, "stopped": stopped, "result": result, "prob": prob,
        "data": data, "scale": scale, "U_hat": U_hat, "U_true": U_true,
    }


def plot(path, r, X):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    r["result"].plot(r["prob"], r["data"], ax=ax1)
    ax1.plot(T_OBS, X[:, 0], "k:", lw=1, label="truth")
    ax1.plot(T_OBS, X[:, 1], "k:", lw=1)
    ax1.legend(fontsize=8)
    ax1.set_title("data and the fitted UDE")
    for j, (true_name, c) in enumerate((("-beta x y", "C0"), ("gamma x y", "C1"))):
        ax2.plot(T_OBS, r["U_true"][:, j], "--", color=c, lw=1.2, label=true_name)
        ax2.plot(T_OBS, r["U_hat"][:, j], "o-", color=c, ms=3, lw=1, label=f"U{j + 1}")
    ax2.set_xlabel("t")
    ax2.set_title(f"learned U along the true trajectory (error {100 * r['u_rel_err']:.1f} %)")
    ax2.legend(fontsize=8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=120)


def _ratio(a, b):
    return a / b if b > 0 else float("nan")


def _spread(values):
    v = 100 * np.asarray(values)
    return f"{v.mean():5.1f} % mean ({v.min():.1f} - {v.max():.1f} %)"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="a short run (Adam x 50, L-BFGS x 100): a smoke test")
    ap.add_argument("--no-scale", action="store_true", help="feed U the raw states (the paper)")
    ap.add_argument("--noise", type=float, default=NOISE,
                    help=f"noise level, times each state's mean (default {NOISE}, the paper)")
    ap.add_argument("--decay", type=float, default=None,
                    help=f"weight decay on U's hidden-layer weights (default {DECAY} x "
                         f"(noise / {NOISE})^2; 0: the paper's plain fit)")
    ap.add_argument("--seed", type=int, default=SEED, help=f"noise draw (default {SEED})")
    ap.add_argument("--seeds", type=int, default=1,
                    help="repeat over this many noise draws (seed, seed + 1, ...) and print "
                         "the spread")
    ap.add_argument("--backend", choices=["numba", "jax"], default="numba",
                    help="where the loss and gradient run (see sciml.fit)")
    ap.add_argument("--out", default=OUT, help="PNG path")
    ap.add_argument("--progress", action="store_true", help="show progress bars")
    args = ap.parse_args(argv)
    if args.noise < 0 or args.seeds < 1 or (args.decay is not None and args.decay < 0):
        ap.error("--decay and --noise must be >= 0 and --seeds >= 1")
    if args.decay is None:
        # The decay is the noise variance over the weights' prior variance (a MAP estimate
        # with a Gaussian prior on them): it follows the noise variance. No noise, no decay.
        args.decay = DECAY * (args.noise / NOISE) ** 2

    X = truth()
    setup = (f"{100 * args.noise:g} % noise, inputs "
             f"{'raw' if args.no_scale else 'scaled by 1/(largest observed value)'}, "
             + (f"weight decay {args.decay:g} on U's hidden-layer weights" if args.decay > 0
                else "no weight decay (the paper's plain fit)"))
    print(f"UDE Lotka-Volterra (scenario 1): 87 weights in U, {len(T_OBS)} observations; "
          f"{setup}")
    print(f"Adam(0.1) x {50 if args.quick else 200}, then L-BFGS "
          f"{'x 100 [--quick]' if args.quick else f'to convergence (<= {LBFGS_ITERS:,})'}")
    runs = []
    for k in range(args.seeds):
        r = run(X, args.seed + k, args.noise, args.decay, not args.no_scale, args.quick,
                args.backend, args.progress)
        runs.append(r)
        ratio = _ratio(r["loss"], r["noise_sse"])
        if args.seeds == 1:
            res = r["result"]
            adam, lbfgs = res.stages[0], res.stages[-1]
            print(f"fit: {res.n_iters} iterations ({adam['n_iters']} Adam, "
                  f"{lbfgs['n_iters']} L-BFGS), {res.n_evals} gradients in {r['time_s']:.2f} s "
                  f"({1e3 * r['time_s'] / res.n_evals:.2f} ms each), stages: {r['stopped']}; "
                  f"first gradient (compile or cache load) {r['first_call_s']:.1f} s")
            pen = f" (+ decay penalty {r['penalty']:.5f})" if args.decay > 0 else ""
            print(f"final loss (SSE) {r['loss']:.5f}{pen}; noise level (sum of squared noise) "
                  f"{r['noise_sse']:.5f}; ratio {ratio:.2f}")
            e1, e2 = 100 * r["u_rel_err_each"]
            print(f"relative error of U along the true trajectory: {100 * r['u_rel_err']:.1f} % "
                  f"(U1 {e1:.1f} %, U2 {e2:.1f} %); along the fitted trajectory: "
                  f"{100 * r['u_rel_err_fitted']:.1f} %")
            b, g = r["ref_beta_gamma"]
            print(f"reference, the same data: the true form with beta, gamma fitted (2 "
                  f"parameters: {b:.3f}, {g:.3f}) misses U by {100 * r['ref_rel_err']:.1f} % "
                  f"(its loss/noise {_ratio(r['ref_loss'], r['noise_sse']):.2f})")
        else:
            print(f"seed {r['seed']}: loss/noise {ratio:.2f}, U error {100 * r['u_rel_err']:.1f} % "
                  f"(fitted trajectory {100 * r['u_rel_err_fitted']:.1f} %), reference "
                  f"{100 * r['ref_rel_err']:.1f} %; {r['n_iters']} iterations in "
                  f"{r['time_s']:.1f} s" + ("" if "blew" not in r["stopped"] else
                                            f" ({r['stopped']})"), flush=True)
    if args.seeds > 1:
        ratios = [_ratio(r["loss"], r["noise_sse"]) for r in runs]
        print(f"over {args.seeds} noise draws ({args.seed} - {args.seed + args.seeds - 1}):")
        print(f"  U error along the true trajectory:   {_spread([r['u_rel_err'] for r in runs])}")
        print(f"  U error along the fitted trajectory: "
              f"{_spread([r['u_rel_err_fitted'] for r in runs])}")
        ref_ratios = [_ratio(r["ref_loss"], r["noise_sse"]) for r in runs]
        print(f"  reference (true form, beta, gamma):  "
              f"{_spread([r['ref_rel_err'] for r in runs])}; its loss / noise level "
              f"{min(ref_ratios):.2f} - {max(ref_ratios):.2f}")
        print(f"  final loss / noise level: {min(ratios):.2f} - {max(ratios):.2f}; fit time "
              f"{np.mean([r['time_s'] for r in runs]):.1f} s mean")
    if args.noise > 0:
        print("  (with 5 % noise on 31 points U is identified only loosely, most of all over "
              "the fast first 0.3 time units where it is largest; even the true form with "
              "its two coefficients fitted misses it by several %: below 5 % is out of reach "
              "here. --noise 0 shows what the same fit recovers without noise)")
    try:
        plot(args.out, runs[0], X)
        print(f"plot: {os.path.relpath(args.out)}")
    except ImportError:
        print("plot: skipped (matplotlib is not installed: pip install matplotlib)")
    keys = ("seed", "loss", "penalty", "noise_sse", "u_rel_err", "u_rel_err_fitted",
            "ref_rel_err", "ref_loss", "time_s", "first_call_s", "n_iters", "n_evals")
    out = [{k: r[k] for k in keys} for r in runs]
    return out[0] if args.seeds == 1 else out


if __name__ == "__main__":
    main()
