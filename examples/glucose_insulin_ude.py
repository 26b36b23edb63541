# %% [markdown]
# # Glucose and insulin: a network for the remote insulin action of the minimal model
#
# A frequently sampled intravenous glucose tolerance test (IVGTT) in one normal subject
# (Pacini & Bergman 1986, the classic data of the Bergman minimal model; see
# `data/README.md`): a glucose bolus at time 0, then plasma glucose `G` (mg/dL) and insulin
# `I` (uU/mL) at 24 times over 3 hours.
#
# **The Bergman minimal model** treats insulin as a measured input and glucose as the output:
#
# - `dG/dt = -(p1 + X) G + p1 Gb`: glucose returns to its basal value `Gb` on its own at the
#   rate `p1` (glucose effectiveness), faster with the insulin action `X` (1/min);
# - `dX/dt = -p2 X + p3 (I(t) - Ib)`: the *remote insulin action* rises with plasma insulin
#   above its basal value `Ib` and decays at the rate `p2`; `SI = p3 / p2` is the insulin
#   sensitivity.
#
# **The UDE** keeps the glucose equation and replaces the whole right-hand side of the `X`
# equation with a small network: `dX/dt = N(X, I(t))`. We fit both, then look at what the
# network learned against the classic linear form `-p2 X + p3 (I - Ib)`.
#
# Run as a script with `python -m examples.glucose_insulin_ude` (add `--quick`, or set
# `SCIML_QUICK=1`, for a short smoke run whose numbers are not the ones quoted here). Plots
# go to `examples/output/` (`$SCIML_OUTPUT` overrides; quick runs without it write to a
# temporary folder).
#
# **Runtime (full mode)**, measured on this project's 2-core machine while other sessions
# shared it (load average about 4): 12 s wall (6 s of CPU) for
# `python -m examples.glucose_insulin_ude` with the two compiled models in the disk cache.
# A first run also compiles them: about 50 s more (61 s wall in all). Quick mode: 12 s with
# the models cached, 66 s (33 s of CPU) with a cold cache.

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
import pandas as pd  # noqa: E402

import nets  # noqa: E402
import sciml  # noqa: E402
from nets import Chain, Dense  # noqa: E402

QUICK = os.environ.get("SCIML_QUICK", "") not in ("", "0") or "--quick" in sys.argv[1:]
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DATA = HERE / "data" / "ivgtt_pacini_bergman_1986.csv"
OUT = Path(os.environ.get("SCIML_OUTPUT") or (
    Path(tempfile.gettempdir()) / "sciml-examples" if QUICK else HERE / "output"))
OUT.mkdir(parents=True, exist_ok=True)
T_START = time.perf_counter()
print(f"mode: {'quick' if QUICK else 'full'}; plots -> {OUT}")

# %% [markdown]
# ## Data
#
# The sample at time 0 is the basal state before the bolus: it gives `Gb` = 92 mg/dL and
# `Ib` = 11 uU/mL, held fixed. As in MINMOD, glucose is fitted from 8 min on: the first
# minutes are the bolus mixing in the blood, which a one-compartment glucose model does not
# describe. The glucose just after the bolus, `G0`, is therefore unknown and fitted.

# %%
df = pd.read_csv(DATA)
T_DATA = df["time_min"].to_numpy(float)
G_DATA = df["glucose_mg_dl"].to_numpy(float)
I_DATA = df["insulin_uU_ml"].to_numpy(float)
GB, IB = G_DATA[0], I_DATA[0]
T_FIT = 8.0
fitted = T_DATA >= T_FIT
TSPAN = (0.0, float(T_DATA[-1]))
data = sciml.Data(t=T_DATA[fitted], y=G_DATA[fitted, None], observables=["G"])
print(f"{len(T_DATA)} samples over {TSPAN[1]:g} min; Gb = {GB:g} mg/dL, Ib = {IB:g} uU/mL; "
      f"fitting the {fitted.sum()} glucose values from {T_FIT:g} min on")
print(f"glucose peak {G_DATA.max():g} mg/dL at {T_DATA[G_DATA.argmax()]:g} min, "
      f"insulin peak {I_DATA.max():g} uU/mL at {T_DATA[I_DATA.argmax()]:g} min")

# %% [markdown]
# ## Insulin as an input, and the models
#
# A model function is traced once with symbols, so an input `I(t)` has to be a formula in
# `t`. We use the linear interpolation of the 24 insulin samples (what `np.interp` gives),
# written as a sum of clipped ramps: `I(t) = I_0 + sum_k s_k (clip(t, t_k, t_k+1) - t_k)`,
# with `s_k` the slope between samples `k` and `k + 1`. Each `np.clip` becomes a piecewise
# term of the compiled right-hand side.
#
# The interpolant has a kink at every sample time. An adaptive solver that steps across a
# kink sees a wrong error estimate: the loss then moves in its fourth digit between
# tolerances and L-BFGS stops on a failed line search. So every problem gets
# `tstops=T_DATA`, the sample times, where the integrator must land exactly: each step then
# stays inside one linear piece, and the gradients agree with finite differences to 5 digits.
# (`ODEProblem.remake` does not carry `tstops` over at present, so `problem()` below builds
# every problem afresh.)
#
# `G0` is a parameter, but an initial state is not: the models integrate `g = G / G0`, which
# starts at 1, and observe `G = G0 g`. Rate constants are fitted on a log scale.
#
# The network sees `X / 0.01` and `(I - Ib) / 100` (both of order 1 here) and returns
# `dX/dt` in units of `1e-3 / min^2`, the size of the classic term at the insulin peak. We
# subtract `N` at the basal point (`X = 0`, `I = Ib`), so that the basal state stays a steady
# state, as in the classic model.

# %%
SLOPES = np.diff(I_DATA) / np.diff(T_DATA)
X_SCALE, I_SCALE, RATE_SCALE = 0.01, 100.0, 1e-3
HIDDEN = 8


def insulin(t):
    """The linear interpolation of the insulin samples, as a sum of clipped ramps."""
    total = I_DATA[0]
    for k, s in enumerate(SLOPES):
        total = total + s * (np.clip(t, T_DATA[k], T_DATA[k + 1]) - T_DATA[k])
    return total


def bergman(u, p, t):
    g, X = u  # g = G / G0
    p1, p2, p3 = np.exp(p.log_p1), np.exp(p.log_p2), np.exp(p.log_p3)
    return [-(p1 + X) * g + p1 * GB / np.exp(p.log_G0), -p2 * X + p3 * (insulin(t) - IB)]


def bergman_ude(u, p, t, nets):
    g, X = u
    p1 = np.exp(p.log_p1)
    z = nets.N([X / X_SCALE, (insulin(t) - IB) / I_SCALE])
    z_basal = nets.N([0.0, 0.0])
    return [-(p1 + X) * g + p1 * GB / np.exp(p.log_G0), RATE_SCALE * (z[0] - z_basal[0])]


observables = {"G": lambda u, p: np.exp(p.log_G0) * u.g}
classic = sciml.Model(bergman, states=["g", "X"], params=["log_p1", "log_p2", "log_p3", "log_G0"],
                      observables=observables)
chain = Chain(2, Dense(HIDDEN, "tanh"), Dense(1))
ude = sciml.Model(bergman_ude, states=["g", "X"], params=["log_p1", "log_G0"],
                  nets={"N": chain}, observables=observables)
N_SLICE = ude.param_slices["N"]


def problem(model, theta):
    return sciml.ODEProblem(model, [1.0, 0.0], TSPAN, theta, tstops=T_DATA)


def network_term(w, X, I):  # noqa: E741
    """dX/dt (1/min^2) from the network with weights w, at arrays X, I."""
    inp = np.stack([np.ravel(X) / X_SCALE, (np.ravel(I) - IB) / I_SCALE], axis=1)
    out = chain(inp, w)[:, 0] - chain(np.zeros((1, 2)), w)[0, 0]
    return RATE_SCALE * out.reshape(np.shape(X))


def classic_term(theta, X, I):  # noqa: E741
    p2, p3 = np.exp(theta[1]), np.exp(theta[2])
    return -p2 * X + p3 * (I - IB)


print(f"classic: {classic.n_params} parameters; UDE: 2 + {chain.n_params} network weights")

# %% [markdown]
# ## The classic minimal model
#
# Started from typical values (`p1` 0.03 /min, `p2` 0.02 /min, `p3` 1e-5, `G0` 300 mg/dL)
# and fitted by L-BFGS on the sum of squared errors of glucose.

# %%
ITERS = dict(classic=40, ude=40) if QUICK else dict(classic=500, ude=2000)

theta0 = classic.init_params(log_p1=np.log(0.03), log_p2=np.log(0.02), log_p3=np.log(1e-5),
                             log_G0=np.log(300.0))
t0 = time.perf_counter()
res_c = sciml.fit(problem(classic, theta0), data,
                  optimizers=[sciml.LBFGS(iters=ITERS["classic"])], progress=False)
th_c = res_c.params
p1, p2, p3, G0 = np.exp(th_c)
n_obs = int(fitted.sum())
print(f"classic fit: {res_c.n_iters} L-BFGS iterations, {time.perf_counter() - t0:.1f} s "
      "(the first call compiles the model, or loads it from the disk cache)")
print(f"  p1 (glucose effectiveness SG) {p1:.4f} /min, p2 {p2:.4f} /min, p3 {p3:.3g} "
      f"/min^2 per uU/mL, G0 {G0:.1f} mg/dL")
print(f"  insulin sensitivity SI = p3 / p2 = {p3 / p2:.3g} /min per uU/mL")
print(f"  SSE {res_c.loss:.1f} (mg/dL)^2, RMSE {np.sqrt(res_c.loss / n_obs):.2f} mg/dL")

# %% [markdown]
# ## The UDE, started at the classic model
#
# The network is first trained (by `nets.train`, a regression, no ODE involved) to
# reproduce the fitted classic term `-p2 X + p3 (I - Ib)` on a grid covering the insulin
# range and the insulin action the classic fit visits. With `p1` and `G0` from the classic
# fit, the UDE then starts where the classic model ended, and L-BFGS fits all of it
# together: the network weights, `p1` and `G0`.

# %%
t_fine = np.linspace(*TSPAN, 400)
X_c = sciml.solve(problem(classic, th_c), saveat=t_fine).u[:, 1]
Xg, Ig = np.meshgrid(np.linspace(X_c.min() - 0.005, 1.5 * X_c.max(), 25),
                     np.linspace(0.0, 1.1 * I_DATA.max(), 25))
inputs = np.stack([Xg.ravel() / X_SCALE, (Ig.ravel() - IB) / I_SCALE], axis=1)
target = classic_term(th_c, Xg.ravel(), Ig.ravel())[:, None] / RATE_SCALE

theta_u = ude.init_params(seed=0, log_p1=th_c[0], log_G0=th_c[3])
w = theta_u[N_SLICE].copy()
hist = nets.train(chain, w, inputs, target, loss=nets.MeanSquaredLoss(),
                  optimizer=nets.LBFGS(iters=100 if QUICK else 500))
theta_u[N_SLICE] = w
print(f"network trained on the classic term: RMS error {np.sqrt(hist[-1]) * RATE_SCALE:.2g} "
      f"/min^2 (the term spans +-{np.abs(target).max() * RATE_SCALE:.2g})")
print(f"UDE loss at the start: {sciml.loss_value(problem(ude, theta_u), data):.1f} "
      f"(classic {res_c.loss:.1f})")

t0 = time.perf_counter()
res_u = sciml.fit(problem(ude, theta_u), data, optimizers=[sciml.LBFGS(iters=ITERS["ude"])],
                  progress=False)
th_u = res_u.params
print(f"UDE fit: {res_u.n_iters} L-BFGS iterations, {time.perf_counter() - t0:.1f} s, "
      f"stopped: {res_u.stopped}")
print(f"  p1 {np.exp(th_u[0]):.4f} /min, G0 {np.exp(th_u[1]):.1f} mg/dL")
print(f"  SSE {res_u.loss:.1f} (mg/dL)^2, RMSE {np.sqrt(res_u.loss / n_obs):.2f} mg/dL")


def aic(sse, k):
    """Akaike's criterion for Gaussian errors of unknown variance: n log(SSE / n) + 2 k."""
    return n_obs * np.log(sse / n_obs) + 2 * k


print(f"AIC (lower is better): classic {aic(res_c.loss, classic.n_params):.1f} "
      f"({classic.n_params} parameters), UDE {aic(res_u.loss, ude.n_params):.1f} "
      f"({ude.n_params} parameters)")

# %% [markdown]
# ## Data and fits
#
# Left: glucose (the open markers, before 8 min, were not fitted). Middle: the measured
# insulin and the input the models see. Right: the remote insulin action `X(t)` each model
# infers: it is never measured.

# %%
sol_c = sciml.solve(problem(classic, th_c), saveat=t_fine)
sol_u = sciml.solve(problem(ude, th_u), saveat=t_fine)

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4), layout="constrained")
ax1.plot(T_DATA[fitted], G_DATA[fitted], "ko", ms=4, label="data (fitted)")
ax1.plot(T_DATA[~fitted], G_DATA[~fitted], "ko", mfc="none", ms=4, label="data (not fitted)")
ax1.plot(t_fine, sol_c.observables["G"], "C0", lw=1.6,
         label=f"classic (RMSE {np.sqrt(res_c.loss / n_obs):.1f})")
ax1.plot(t_fine, sol_u.observables["G"], "C3", lw=1.6,
         label=f"UDE (RMSE {np.sqrt(res_u.loss / n_obs):.1f})")
ax1.axhline(GB, color="0.6", lw=0.8, ls=":")
ax1.set(xlabel="time (min)", ylabel="glucose (mg/dL)", title="glucose")
ax1.legend(fontsize=8)
ax2.plot(T_DATA, I_DATA, "ko", ms=4, label="data")
ax2.plot(t_fine, np.interp(t_fine, T_DATA, I_DATA), "k-", lw=1, label="input I(t)")
ax2.axhline(IB, color="0.6", lw=0.8, ls=":")
ax2.set(xlabel="time (min)", ylabel="insulin (uU/mL)", title="insulin (the input)")
ax2.legend(fontsize=8)
ax3.plot(t_fine, sol_c.u[:, 1], "C0", lw=1.6, label="classic")
ax3.plot(t_fine, sol_u.u[:, 1], "C3", lw=1.6, label="UDE")
ax3.axhline(0.0, color="0.6", lw=0.8, ls=":")
ax3.set(xlabel="time (min)", ylabel="X (1/min)", title="remote insulin action X (inferred)")
ax3.legend(fontsize=8)
fig.savefig(OUT / "glucose_insulin_ude.png", dpi=110)

# %% [markdown]
# ## What the network learned
#
# Left: `dX/dt` along each model's own trajectory. Middle and right: the learned
# `N(X, I)` (solid) against the classic `-p2 X + p3 (I - Ib)` (dashed) as a function of
# insulin at three levels of `X`, and of `X` at three insulin levels. The network is only
# informed where the trajectory goes; away from it, it is an extrapolation of the regression
# it started from.

# %%
w_u = th_u[N_SLICE]
I_c = np.interp(t_fine, T_DATA, I_DATA)
X_u = sol_u.u[:, 1]
I_grid = np.linspace(0.0, 140.0, 141)
X_grid = np.linspace(-0.005, 0.02, 101)

fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4), layout="constrained")
ax1.plot(t_fine, classic_term(th_c, X_c, I_c), "C0", lw=1.6, label="classic")
ax1.plot(t_fine, network_term(w_u, X_u, I_c), "C3", lw=1.6, label="UDE network")
ax1.axhline(0.0, color="0.6", lw=0.8, ls=":")
ax1.set(xlabel="time (min)", ylabel="dX/dt (1/min^2)", title="remote insulin action term")
ax1.legend(fontsize=8)
for j, x in enumerate((0.0, 0.005, 0.01)):
    ax2.plot(I_grid, network_term(w_u, np.full_like(I_grid, x), I_grid), color=f"C{j}",
             lw=1.6, label=f"X = {x:g}")
    ax2.plot(I_grid, classic_term(th_c, x, I_grid), color=f"C{j}", lw=1.2, ls="--")
ax2.set(xlabel="insulin I (uU/mL)", ylabel="dX/dt (1/min^2)",
        title="network (solid) vs classic (dashed)")
ax2.legend(fontsize=8)
for j, i in enumerate((IB, 40.0, 120.0)):
    ax3.plot(X_grid, network_term(w_u, X_grid, np.full_like(X_grid, i)), color=f"C{j}",
             lw=1.6, label=f"I = {i:g}")
    ax3.plot(X_grid, classic_term(th_c, X_grid, i), color=f"C{j}", lw=1.2, ls="--")
ax3.set(xlabel="X (1/min)", ylabel="dX/dt (1/min^2)", title="network (solid) vs classic (dashed)")
ax3.legend(fontsize=8)
fig.savefig(OUT / "glucose_insulin_ude_learned.png", dpi=110)

print("dX/dt (1e-4 / min^2): network / classic")
print("   X \\ I   " + "".join(f"{i:>16g}" for i in (5.0, IB, 30.0, 60.0, 130.0)))
for x in (0.0, 0.005, 0.01, 0.015):
    cells = "".join(f"{1e4 * network_term(w_u, np.array(x), np.array(i)):>8.2f} /"
                    f"{1e4 * classic_term(th_c, x, i):>6.2f}" for i in (5.0, IB, 30.0, 60.0, 130.0))
    print(f"{x:>8g}  {cells}")
print(f"X(t) peak: classic {X_c.max():.4f} /min at {t_fine[X_c.argmax()]:.0f} min, UDE "
      f"{X_u.max():.4f} /min at {t_fine[X_u.argmax()]:.0f} min; UDE minimum {X_u.min():.4f}")
print(f"\ntotal time: {time.perf_counter() - T_START:.1f} s")

# %% [markdown]
# ## Results (full mode)
#
# Measured with the full-mode run; 20 glucose values (8-182 min):
#
# | | classic | UDE |
# |---|---|---|
# | parameters | 4 | 35 (2 + 33 weights) |
# | SSE (mg/dL)^2 | 262.1 | 211.5 |
# | RMSE (mg/dL) | 3.62 | 3.25 |
# | AIC | 59.5 | 117.2 |
# | `p1` (/min) | 0.0189 | 0.0390 |
# | `G0` (mg/dL) | 261.2 | 285.1 |
#
# The classic fit gives `p2` 0.0214 /min, `p3` 1.73e-5 and an insulin sensitivity
# `SI = p3 / p2` of 8.1e-4 /min per uU/mL, with a 3.6 mg/dL residual.
#
# **What the network learned.** Along insulin, its term saturates: above about 30 uU/mL more
# insulin hardly raises `dX/dt` (at `X = 0.01`: 4.8, 4.9 and 4.6e-4 /min^2 at `I` = 30, 60
# and 130, against 1.1, 6.3 and 18.4e-4 for the classic line). The short first-phase spike
# (130 uU/mL at 4 min) therefore no longer drives `X` up at once: the UDE's insulin action
# rises later and peaks at 64 min instead of 37. At basal insulin, a large `X` decays faster
# than linearly. A saturating insulin action is physiologically plausible (it acts through
# receptors), but these data do not establish it:
#
# - the UDE's `X` dips below zero (to -0.0015 /min) in the first 20 minutes: the network
#   lets the insulin spike *slow* glucose uptake at first, which is a fit to the first few
#   glucose values, not physiology;
# - it doubles `p1` (0.019 to 0.039 /min): glucose effectiveness and insulin action trade
#   against each other, the known identifiability problem of the minimal model on a single
#   IVGTT;
# - the SSE falls by 19 % for 31 more parameters, and AIC prefers the classic model by far.
#
# With this much freedom and 20 values of one output, the network is a hypothesis
# generator: what it suggests (a saturating, delayed insulin action) would be tested with a
# model of that form (a Michaelis-Menten term: one parameter more) on more subjects.
