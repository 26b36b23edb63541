# %% [markdown]
# # Warfarin PK/PD: a network for the concentration-effect relation
#
# Warfarin in 32 subjects after one oral dose of about 1.5 mg/kg (O'Reilly et al. 1963, 1968;
# the nlmixr2 `warfarin` table, see `data/README.md`): plasma concentration (mg/L) and
# prothrombin complex activity (PCA, % of normal) over 6 days.
#
# - **PK**: one compartment with first-order absorption, `ka`, `CL`, `V`. The absorption lag
#   that published warfarin models have (about half an hour) is ignored: with the few early
#   samples most subjects have, it mostly shows as a smaller `ka`.
# - **PD**: a turnover (indirect response) model. PCA is `E0 * R`, and the clotting-factor
#   activity `R` (1 at baseline) is made at a rate inhibited by the concentration and lost at
#   the rate `kout`: `dR/dt = kout (1 - I(C)) - kout R`.
#   - classic: `I(C) = C / (EC50 + C)` (an Emax model with full inhibition);
#   - UDE: `I(C) = 1 - exp(-c g(c))` with `g = softplus(U(c))` from a network of
#     `c = C / 10 mg/L`: zero at `C = 0`, below 1, otherwise free. The network is first
#     trained to reproduce the fitted Emax curve, so the UDE fit starts at the classic model.
#
# Both models are fitted to both observations at once as a population (`sciml.Population`):
# `ka`, `CL`, `V` and `E0` per subject with an L2 penalty toward the population value,
# `kout`, the network (or `EC50`) and the noise levels shared. The loss is a Gaussian negative
# log-likelihood with one fitted noise level per observable (`sciml.GaussianNLL`), so
# concentrations and PCA are weighed by their own noise, not by their units.
#
# Run as a script with `python -m examples.warfarin_pkpd` (`--quick` or `SCIML_QUICK=1`: a
# short smoke run). Plots go to `examples/output/` (`$SCIML_OUTPUT` overrides; quick runs
# without it write to a temporary folder).
#
# **Runtime (full mode)**, measured on this project's 2-core machine while other sessions
# shared it (load average about 5.5): 111 s wall (63 s of CPU) for
# `python -m examples.warfarin_pkpd` with the compiled models in the disk cache (97 s in
# another run). A first run also compiles the two models: about 30 s of CPU more. Quick
# mode: about 15 s with the models cached. The UDE's L-BFGS stops at its budget of 2000
# iterations, still improving slowly.

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

import nets  # noqa: E402
import sciml  # noqa: E402
from nets import Chain, Dense  # noqa: E402

QUICK = os.environ.get("SCIML_QUICK", "") not in ("", "0") or "--quick" in sys.argv[1:]
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DATA = HERE / "data" / "warfarin_nlmixr2data.csv"
OUT = Path(os.environ.get("SCIML_OUTPUT") or (
    Path(tempfile.gettempdir()) / "sciml-examples" if QUICK else HERE / "output"))
OUT.mkdir(parents=True, exist_ok=True)
T_START = time.perf_counter()
print(f"mode: {'quick' if QUICK else 'full'}; plots -> {OUT}")

# %% [markdown]
# ## Models and data
#
# `read_events` maps the table's `dvid` column to the two observables. Subject 9 has two
# concentrations at each of 3, 6, 9 and 12 h; `duplicates="mean"` merges each pair into its
# mean (the Gaussian likelihood counts a merged value once).

# %%
C_REF = 10.0  # mg/L: the network's input is C / C_REF
H = 8         # hidden units
SHARED = ["log_ka", "log_CL", "log_V", "log_E0", "log_kout", "log_sd_conc", "log_sd_pca"]
INDIVIDUAL = ["log_ka", "log_CL", "log_V", "log_E0"]


def pk(u, p):
    ka, CL, V = np.exp(p.log_ka), np.exp(p.log_CL), np.exp(p.log_V)
    return [-ka * u.depot, ka * u.depot - CL / V * u.central], u.central / V


def turnover_emax(u, p, t):
    (d_depot, d_central), conc = pk(u, p)
    inhibition = conc / (np.exp(p.log_EC50) + conc)
    kout = np.exp(p.log_kout)
    return [d_depot, d_central, kout * (1.0 - inhibition) - kout * u.R]


def turnover_ude(u, p, t, nets):
    (d_depot, d_central), conc = pk(u, p)
    c = conc / C_REF
    inhibition = 1.0 - np.exp(-c * nets.U([c])[0])  # the net ends in softplus: g(c) > 0
    kout = np.exp(p.log_kout)
    return [d_depot, d_central, kout * (1.0 - inhibition) - kout * u.R]


observables = {"conc": lambda u, p: u.central / np.exp(p.log_V),
               "pca": lambda u, p: np.exp(p.log_E0) * u.R}
states = ["depot", "central", "R"]
classic = sciml.Model(turnover_emax, states, SHARED + ["log_EC50"], observables=observables)
chain = Chain(1, Dense(H, "tanh"), Dense(1, "softplus"))
ude = sciml.Model(turnover_ude, states, SHARED, nets={"U": chain}, observables=observables)
U_SLICE = ude.param_slices["U"]

# Typical values to start from: ka 1 / h, CL 0.135 L/h, V 8 L, E0 100 %, kout 0.05 / h
# (clotting-factor half-life ~14 h), EC50 1 mg/L, noise 1 mg/L and 5 %.
start = dict(log_ka=0.0, log_CL=np.log(0.135), log_V=np.log(8.0), log_E0=np.log(100.0),
             log_kout=np.log(0.05), log_sd_conc=0.0, log_sd_pca=np.log(5.0))
theta0 = classic.init_params(log_EC50=0.0, **start)
subjects = sciml.data.read_events(DATA, classic, compartments={1: "depot"},
                                  observable={"cp": "conc", "pca": "pca"}, params=theta0,
                                  u0=[0.0, 0.0, 1.0], duplicates="mean")
n_obs = np.sum([s.data.mask.sum(axis=0) for s in subjects], axis=0)
print(f"{len(subjects)} subjects, {n_obs[0]} concentrations, {n_obs[1]} PCA values; doses "
      f"{min(s.problem.doses[0].amount for s in subjects):g}-"
      f"{max(s.problem.doses[0].amount for s in subjects):g} mg")

# %% [markdown]
# ## Population fits
#
# The objective is the negative log-likelihood plus `0.5 * sum (eta / scale)^2`: the joint
# posterior mode under Gaussian priors on the deviations with **fixed** spreads (0.5 for
# `log_ka`, 0.3 for `log_CL` and `log_V`, 0.1 for `log_E0`, chosen by hand). This is not a
# mixed-effects likelihood: the between-subject variances are not estimated and the
# deviations are not integrated out.

# %%
SCALE = [0.5, 0.3, 0.3, 0.1]
ITERS = dict(classic=30, ude=30) if QUICK else dict(classic=1000, ude=2000)
loss = sciml.GaussianNLL(sigma=["log_sd_conc", "log_sd_pca"], log=True)


def population(model, theta):
    problems = [sciml.ODEProblem(model, s.problem.u0, s.problem.tspan, theta,
                                 doses=s.problem.doses) for s in subjects]
    return sciml.Population(problems, [s.data for s in subjects], INDIVIDUAL, penalty=0.5,
                            scale=SCALE, loss=loss)


pop_c = population(classic, theta0)
res_c = pop_c.fit(optimizers=[sciml.LBFGS(iters=ITERS["classic"])], progress=False)
th_c, eta_c = pop_c.split(res_c.params)
EC50 = float(np.exp(th_c[classic.params.index("log_EC50")]))
print(f"classic: objective {res_c.loss:.2f} ({res_c.n_iters} L-BFGS iterations, "
      f"{res_c.time_s:.1f} s)")

# The network starts as the fitted Emax curve: g(c) = log(1 + c C_REF / EC50) / c.
theta_u = ude.init_params(seed=0, **dict(zip(SHARED, th_c[:len(SHARED)])))
c = np.linspace(1e-3, 2.5, 200)[:, None]
w = theta_u[U_SLICE].copy()
pre = nets.train(chain, w, c, np.log1p(c * C_REF / EC50) / c, optimizer=nets.Adam(0.02),
                 iters=300 if QUICK else 3000)
theta_u[U_SLICE] = w
print(f"network pretrained on the Emax curve: squared error {pre[0]:.3g} -> {pre[-1]:.3g}")

pop_u = population(ude, theta_u)
res_u = pop_u.fit(params=pop_u.pack(theta_u, eta_c),
                  optimizers=[sciml.LBFGS(iters=ITERS["ude"])], progress=False)
th_u, eta_u = pop_u.split(res_u.params)
print(f"UDE: objective {res_u.loss:.2f} ({res_u.n_iters} L-BFGS iterations, "
      f"{res_u.time_s:.1f} s)")

k_c = classic.n_params + eta_c.size  # parameters, deviations counted as parameters
k_u = ude.n_params + eta_u.size
print(f"\n{'':>22}{'classic':>10}{'UDE':>10}")
for name in SHARED:
    i = SHARED.index(name)
    print(f"{name[4:]:>22}{np.exp(th_c[i]):10.4g}{np.exp(th_u[i]):10.4g}")
print(f"{'EC50 (mg/L)':>22}{EC50:10.4g}{'-':>10}")
print(f"{'objective':>22}{res_c.loss:10.2f}{res_u.loss:10.2f}")
print(f"{'parameters':>22}{k_c:10d}{k_u:10d}")
print(f"{'objective + #params':>22}{res_c.loss + k_c:10.2f}{res_u.loss + k_u:10.2f}"
      "   (half an AIC, penalty included)")

# %% [markdown]
# ## Fits for four subjects
#
# The four subjects with the most concentration samples (the others were sampled from 24 h
# on), each with its own fitted parameters.

# %%
order = sorted(subjects, key=lambda s: (-s.data.mask[:, 0].sum(), s.id))[:4]
shown = [subjects.index(s) for s in order]
grid = np.linspace(0.0, 144.0, 577)
fig, axes = plt.subplots(2, 4, figsize=(14, 6), sharex=True, layout="constrained")
for col, i in enumerate(shown):
    s = subjects[i]
    for res, label, color in ((res_c, "classic (Emax)", "C0"), (res_u, "UDE", "C3")):
        prob = res.problems[i].remake(tspan=(0.0, 144.0))
        sol = sciml.solve(prob, saveat=grid)
        axes[0, col].plot(grid, sol.observables["conc"], color=color, lw=1.5, label=label)
        axes[1, col].plot(grid, sol.observables["pca"], color=color, lw=1.5, label=label)
    for row in range(2):
        m = s.data.mask[:, row]
        axes[row, col].plot(s.data.t[m], s.data.y[m, row], "ko", ms=4, label="data")
    axes[0, col].set_title(f"subject {s.id}: {s.problem.doses[0].amount:g} mg", fontsize=10)
    axes[1, col].set_xlabel("time (h)")
axes[0, 0].set_ylabel("warfarin (mg/L)")
axes[1, 0].set_ylabel("PCA (% of normal)")
axes[0, 0].legend(fontsize=8)
fig.savefig(OUT / "warfarin_pkpd.png", dpi=110)

# %% [markdown]
# ## What the network learned; goodness of fit over all subjects
#
# Left: the inhibition of clotting-factor synthesis against concentration, the classic Emax
# curve and the network's. Right: observed against individually predicted values for every
# subject (points on the diagonal are fitted exactly).

# %%
C = np.linspace(0.0, 20.0, 201)
inh_c = C / (EC50 + C)
cu = C / C_REF
inh_u = 1.0 - np.exp(-cu * chain(cu[:, None], th_u[U_SLICE])[:, 0])


def predictions(res):
    pred = []
    for p, s in zip(res.problems, subjects):
        sol = sciml.solve(p, saveat=s.data.t)
        pred.append(np.stack([sol.observables["conc"], sol.observables["pca"]], axis=1))
    return np.concatenate(pred)


obs_all = np.concatenate([s.data.y for s in subjects])
pred = {"classic (Emax)": predictions(res_c), "UDE": predictions(res_u)}
fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(14, 4), layout="constrained")
ax1.plot(C, inh_c, color="C0", lw=1.6, label=f"classic: C / ({EC50:.2f} + C)")
ax1.plot(C, inh_u, color="C3", lw=1.6, label="UDE: 1 - exp(-c g(c))")
ax1.set_xlabel("warfarin (mg/L)")
ax1.set_ylabel("inhibition of synthesis I(C)")
ax1.legend(fontsize=8)
for ax, j, unit in ((ax2, 0, "warfarin (mg/L)"), (ax3, 1, "PCA (%)")):
    m = np.isfinite(obs_all[:, j])
    for (label, p), color in zip(pred.items(), ("C0", "C3")):
        rmse = np.sqrt(np.mean((p[m, j] - obs_all[m, j]) ** 2))
        ax.plot(p[m, j], obs_all[m, j], "o", color=color, ms=3, alpha=0.6,
                label=f"{label}: RMSE {rmse:.2f}")
        print(f"{label:>15}, {unit}: RMSE {rmse:.3f} over {m.sum()} observations")
    hi = np.nanmax(obs_all[:, j]) * 1.05
    ax.plot([0, hi], [0, hi], "k:", lw=1)
    ax.set_xlabel(f"individual prediction, {unit}")
    ax.set_ylabel(f"observed, {unit}")
    ax.legend(fontsize=8)
fig.savefig(OUT / "warfarin_pkpd_effect.png", dpi=110)
print(f"\ntotal time: {time.perf_counter() - T_START:.1f} s")

# %% [markdown]
# ## Results (full mode)
#
# | | classic (Emax) | UDE |
# |---|---|---|
# | objective (negative log-likelihood + penalty) | 1055.9 | 1038.9 |
# | parameters (shared + 4 per subject) | 136 | 160 |
# | objective + parameters (half an AIC) | 1191.9 | 1198.9 |
# | RMSE warfarin (mg/L), 247 values | 1.18 | 1.24 |
# | RMSE PCA (%), 232 values | 3.62 | 3.20 |
#
# Both models follow the data: the concentrations rise and decline with each subject's own
# absorption and clearance, and PCA falls to 15-30 % at about two days and recovers over
# the next four. The network improves the PCA fit (RMSE 3.2 against 3.6 %) at a small cost
# in the concentration fit, but the likelihood gain (17) does not pay for its 24 extra
# weights: by AIC the Emax model is as good or better. What the network learned is close to
# the Emax curve where the data constrain it (most concentrations lie below 10 mg/L):
# steeper near full inhibition, with a kink near 5 mg/L that we would not read as
# physiology. The honest conclusion for these data: the classic turnover model with an
# Emax inhibition is adequate, and the UDE confirms it rather than finding a missing
# mechanism. The remaining misfit is mostly in the concentrations (additive error of about
# 1.2 mg/L, no absorption lag, no proportional error model), not in the PD.
