# %% [markdown]
# # The spiral: a classic neural ODE, and one gradient against diffrax
#
# The example that DiffEqFlux.jl and torchdiffeq made the "hello world" of neural ODEs
# (../shared/BENCHMARKS.md item 2): the data are 30 points of the cubic spiral
# `du/dt = (u**3) A`, `A = [[-0.1, 2.0], [-2.0, -0.1]]`, `u0 = [2, 0]`, on `t` in `[0, 1.5]`;
# the model knows nothing of `A` and learns the whole right-hand side,
# `du/dt = Dense(50 -> 2)(tanh(Dense(2 -> 50)(u**3)))` (252 weights, float64).
#
# We train it with `sciml.fit` (Adam, then L-BFGS), plot it, and time one loss and gradient
# against the same problem in diffrax (JAX), when JAX is installed.
#
# Run as a script with `python -m examples.neural_ode_spiral` (add `--quick`, or set
# `SCIML_QUICK=1`, for a short smoke run whose numbers are not the ones quoted here). Plots
# go to `examples/output/` (`$SCIML_OUTPUT` overrides; quick runs without it write to a
# temporary folder).
#
# **Runtime (full mode)**, measured on this project's 2-core machine while other sessions
# shared it (load average about 4): 23 s wall (12 s of CPU) for
# `python -m examples.neural_ode_spiral`, of which 10 s are JAX compiling the diffrax
# gradient, with the compiled model in the disk cache. A first run also compiles the model:
# about 30 s more. Quick mode: 21 s with the model cached, 56 s (27 s of CPU) with a cold
# cache.

# %%
import os
import sys
import tempfile
import time
from pathlib import Path

# scipy's L-BFGS-B does tiny linear algebra; several BLAS threads only add hand-offs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402

import adjoints  # noqa: E402
import nets  # noqa: E402
import sciml  # noqa: E402
from nets import Chain, Dense  # noqa: E402

QUICK = os.environ.get("SCIML_QUICK", "") not in ("", "0") or "--quick" in sys.argv[1:]
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
OUT = Path(os.environ.get("SCIML_OUTPUT") or (
    Path(tempfile.gettempdir()) / "sciml-examples" if QUICK else HERE / "output"))
OUT.mkdir(parents=True, exist_ok=True)
T_START = time.perf_counter()
print(f"mode: {'quick' if QUICK else 'full'}; plots -> {OUT}")

# %% [markdown]
# ## Data and model
#
# The data are the true trajectory at the 30 save points, solved by SciPy's DOP853 at
# `rtol = atol = 1e-12` (no noise, as in the original example). The network's input is
# `u**3`, the nonlinearity of the truth: the network only has to learn the linear map `A`
# through a `tanh` layer.

# %%
A = np.array([[-0.1, 2.0], [-2.0, -0.1]])
U0 = np.array([2.0, 0.0])
TSPAN = (0.0, 1.5)
T_DATA = np.linspace(*TSPAN, 30)


def truth(t_eval, t_end):
    sol = solve_ivp(lambda t, u: (u**3) @ A, (0.0, t_end), U0, method="DOP853", t_eval=t_eval,
                    rtol=1e-12, atol=1e-12)
    return sol.y.T


Y_DATA = truth(T_DATA, TSPAN[1])
chain = Chain(2, Dense(50, "tanh"), Dense(2))


def spiral(u, p, t, nets):
    x, y = u
    return nets.U([x**3, y**3])


model = sciml.Model(spiral, states=["x", "y"], params=[], nets={"U": chain})
theta0 = model.init_params(seed=0)
prob = sciml.ODEProblem(model, U0, TSPAN, theta0)
data = sciml.Data(t=T_DATA, y=Y_DATA)
method = adjoints.default_sensealg(model, sciml.Tsit5())
t0 = time.perf_counter()
value0, _ = sciml.loss_and_grad(prob, data)
print(f"{model.n_params} weights; loss at the start {value0:.2f}; first gradient "
      f"{time.perf_counter() - t0:.1f} s (compiling the model, or loading it from the disk "
      f"cache); gradient method chosen: {method!r}")

# %% [markdown]
# ## Training: Adam, then L-BFGS
#
# As in the DiffEqFlux example: Adam with learning rate 0.05 for 300 iterations, then
# L-BFGS, on the sum of squared errors, Tsit5 at `rtol = atol = 1e-6`. `sciml.loss_and_grad`
# picks the gradient method by itself (above: the discrete adjoint, reverse mode through
# the solver's own steps, for a model with few states).

# %%
ITERS = (50, 50) if QUICK else (300, 3000)
result = sciml.fit(prob, data, optimizers=[nets.Adam(0.05, iters=ITERS[0]),
                                           sciml.LBFGS(iters=ITERS[1])], progress=False)
adam, lbfgs = result.stages
print(f"Adam: {adam['n_iters']} iterations, loss {adam['loss']:.4g}, {adam['time_s']:.2f} s")
print(f"L-BFGS: {lbfgs['n_iters']} iterations ({lbfgs['n_evals']} gradients), loss "
      f"{lbfgs['loss']:.3g}, {lbfgs['time_s']:.2f} s; stopped: {result.stopped}")
print(f"whole fit: {result.n_evals} gradients in {result.time_s:.2f} s "
      f"({1e3 * result.time_s / result.n_evals:.2f} ms each, optimizer included)")
fitted = prob.remake(params=result.params)
err = np.abs(sciml.solve(fitted, saveat=T_DATA).u - Y_DATA).max()
print(f"largest error at the data points: {err:.2g}")

# %% [markdown]
# ## Plot
#
# The trained model against the truth, within the data's time span and beyond it (to
# `t = 3`): a neural ODE fitted to one arc of a spiral knows the vector field only near
# that arc.

# %%
T_LONG = 3.0
t_fine = np.linspace(0.0, T_LONG, 600)
inside = t_fine <= TSPAN[1]
true_long = truth(t_fine, T_LONG)
sol = sciml.solve(fitted.remake(tspan=(0.0, T_LONG)), saveat=t_fine)
fit_long = sol.u
print(f"extrapolated to t = {T_LONG:g}: {sol.status}; largest error beyond the data "
      f"{np.abs(fit_long[~inside] - true_long[~inside]).max():.2g} (state amplitude "
      f"{np.abs(true_long).max():.2g})")

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4), layout="constrained")
for j, name in enumerate(("x", "y")):
    ax1.plot(T_DATA, Y_DATA[:, j], "o", color=f"C{j}", ms=4, label=f"{name} data")
    ax1.plot(sol.t, fit_long[:, j], color=f"C{j}", lw=1.5, label=f"{name} neural ODE")
    ax1.plot(t_fine, true_long[:, j], "k:", lw=1)
ax1.axvline(TSPAN[1], color="0.6", lw=0.8)
ax1.set(xlabel="t", title="states (dotted: truth; line at the end of the data)")
ax1.legend(fontsize=8, ncols=2)
ax2.plot(true_long[:, 0], true_long[:, 1], "k:", lw=1, label="truth to t = 3")
ax2.plot(fit_long[inside, 0], fit_long[inside, 1], "C3", lw=1.6, label="neural ODE, t <= 1.5")
ax2.plot(fit_long[~inside, 0], fit_long[~inside, 1], "C3", lw=1.2, ls="--",
         label="neural ODE, t > 1.5")
ax2.plot(Y_DATA[:, 0], Y_DATA[:, 1], "ko", ms=3.5, label="data")
ax2.set(xlabel="x", ylabel="y", title="phase plane", ylim=(-1.8, 2.9))
ax2.legend(fontsize=8, ncols=2, loc="upper center")
ax3.semilogy(result.history, lw=1)
ax3.axvline(adam["n_iters"] - 0.5, color="0.6", lw=0.8)
ax3.set(xlabel="iteration (Adam, then L-BFGS)", ylabel="loss (SSE)", title="training")
fig.savefig(OUT / "neural_ode_spiral.png", dpi=110)

# %% [markdown]
# ## One loss and gradient: ours against diffrax
#
# The unit of work of ../shared/BENCHMARKS.md item 2: the loss and its gradient with respect to all
# 252 weights, Tsit5, `rtol = atol = 1e-6`, 30 save points; here at the initial weights (the
# benchmark's setting) and at the trained ones, whose vector field is faster and takes
# about ten times as many steps. Ours is `sciml.loss_and_grad` with its default method;
# diffrax's is `jax.value_and_grad` of a `diffeqsolve` under `jax.jit` (Tsit5,
# `PIDController`, `SaveAt(ts=...)`, its default `RecursiveCheckpointAdjoint`: reverse mode
# through the solver), float64, with the same network in JAX (`nets.jax.apply`, the same
# flat weights). Each is called once first (compiling), then both are timed in alternation,
# 5 rounds, and the median round is reported. One small problem on a shared machine: the
# ratio moves by a factor of two between runs. The gradient error is the relative 2-norm
# error against our gradient at `rtol = atol = 1e-12` (diffrax's at that tolerance agrees
# with it to 4e-12 at the initial weights). `python -m
# benchmarks.spiral_grad` times every method against diffrax and torchdiffeq.

# %%
import timeit  # noqa: E402

ROUNDS, REPS = 5, (10 if QUICK else 100)
weights = {"initial": theta0, "trained": result.params}
impls = {"ours": lambda w: sciml.loss_and_grad(prob, data, params=w)}
try:
    import diffrax
    import jax
except ImportError as e:
    print(f"diffrax comparison skipped: {e} (pip install 'sciml-nets[jax]')")
else:
    import nets.jax

    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy
    term = diffrax.ODETerm(lambda t, u, w: nets.jax.apply(chain, w, u**3))
    y0, ts, Y = jnp.asarray(U0), jnp.asarray(T_DATA), jnp.asarray(Y_DATA)
    controller = diffrax.PIDController(rtol=1e-6, atol=1e-6)

    def loss(w):
        sol = diffrax.diffeqsolve(term, diffrax.Tsit5(), TSPAN[0], TSPAN[1], None, y0, args=w,
                                  saveat=diffrax.SaveAt(ts=ts), stepsize_controller=controller)
        return jnp.sum((sol.ys - Y) ** 2)

    value_and_grad = jax.jit(jax.value_and_grad(loss))
    t0 = time.perf_counter()
    jax.block_until_ready(value_and_grad(jnp.asarray(theta0)))
    print(f"diffrax: first call (tracing and compiling) {time.perf_counter() - t0:.1f} s")
    impls["diffrax"] = lambda w: jax.block_until_ready(value_and_grad(w))

for label, w in weights.items():
    args = {"ours": w, "diffrax": jnp.asarray(w) if "diffrax" in impls else None}
    out = {k: f(args[k]) for k, f in impls.items()}  # warm-up, and the values to compare
    _, g_ref = sciml.loss_and_grad(prob, data, params=w, rtol=1e-12, atol=1e-12)
    times = {k: [] for k in impls}
    for _ in range(ROUNDS):
        for k, f in impls.items():
            times[k].append(timeit.timeit(lambda f=f, a=args[k]: f(a), number=REPS) / REPS)
    med = {k: float(np.median(v)) for k, v in times.items()}
    err = {k: np.linalg.norm(np.asarray(o[1]) - g_ref) / np.linalg.norm(g_ref)
           for k, o in out.items()}
    print(f"{label} weights (|gradient| {np.linalg.norm(g_ref):.3g}):")
    for k in impls:
        name = f"ours ({type(method).__name__})" if k == "ours" else "diffrax"
        print(f"  {name:>24}: {1e6 * med[k]:6.0f} us, loss {float(out[k][0]):.7g}, gradient "
              f"error {err[k]:.1g}")
    if "diffrax" in impls:
        print(f"  {'ratio diffrax / ours':>24}: {med['diffrax'] / med['ours']:.1f}x")
print(f"\ntotal time: {time.perf_counter() - T_START:.1f} s")

# %% [markdown]
# ## Results (full mode)
#
# Measured with the full-mode run:
#
# - **training**: Adam (300 iterations) to a loss of 0.23, then L-BFGS (3000 iterations,
#   3548 gradients) to 7.1e-5; 3849 gradients in 1.8 s. The largest error at the data points
#   is 0.0046 (the states' amplitude is 2).
# - **beyond the data**: up to `t = 3` the trained model drifts from the truth by up to
#   0.69: the field is learned along the arc the data cover, nowhere else.
# - **one loss and gradient** (median of 5 alternating rounds; ours with the discrete
#   adjoint, diffrax jitted):
#
# | weights | ours | diffrax | diffrax / ours | gradient error, ours / diffrax |
# |---|---|---|---|---|
# | initial | 38 us | 633 us | 16.5x | 2e-6 / 5e-6 |
# | trained | 377 us | 4666 us | 12.4x | 0.8 / 0.7 |
#
# Over three runs on the busy machine the ratio at the initial weights ranged from 9x to
# 16x. diffrax's first call (tracing and compiling) took 10 s. At the trained weights the
# gradient (norm 0.03) is as small as the error that `rtol = 1e-6` leaves in either
# implementation: L-BFGS has gone as far as the tolerance allows, and further training
# would need a tighter one.
