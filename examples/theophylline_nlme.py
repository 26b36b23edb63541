# %% [markdown]
# # Theophylline as a population: FOCE-I, then a network in the absorption
#
# Oral theophylline in 12 subjects (Boeckmann, Sheiner & Beal 1994; the nlmixr2 event table
# `theo_sd`, see `data/README.md`): one dose of about 320 mg, 11 plasma concentrations each.
#
# 1. The classic one-compartment model with first-order absorption as a **mixed-effects
#    model**: log-normal `ka`, `CL`, `V` (typical values and between-subject variances
#    estimated), additive residual error, fitted by FOCE-I (`sciml.nlme`). nlmixr2 published
#    this fit; we check that we reproduce it.
# 2. The same random-effects structure with the absorption rate modulated by a small
#    network of the fraction of the dose left in the depot (as in `theophylline_ude`):
#    `ka(f) = ka exp(tanh(U(f)))`; the network's 13 weights are population parameters,
#    estimated with the thetas under the same FOCE-I likelihood.
# 3. Both compared by objective, AIC, VPCs and, on subjects **held out** of the fit, by
#    their marginal likelihood under each fitted population model.
#
# **Runtime (full mode)**: 75 s on this project's 2-core machine (nine fits of the network
# model, each to BFGS's convergence); quick mode about 6 s with the models cached.
#
# Run as a script with `python -m examples.theophylline_nlme` (`--quick` or `SCIML_QUICK=1`
# for a short smoke run whose numbers are not the ones quoted here). Plots go to
# `examples/output/` (`$SCIML_OUTPUT` overrides; quick runs without it write to a
# temporary folder).

# %%
import os
import sys
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

import sciml
import sciml.nlme as nl
from nets import Chain, Dense

QUICK = os.environ.get("SCIML_QUICK", "") not in ("", "0") or "--quick" in sys.argv[1:]
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
DATA = HERE / "data" / "theo_sd_nlmixr2data.csv"
OUT = Path(os.environ.get("SCIML_OUTPUT") or (
    Path(tempfile.gettempdir()) / "sciml-examples" if QUICK else HERE / "output"))
OUT.mkdir(parents=True, exist_ok=True)
T_START = time.perf_counter()
print(f"mode: {'quick' if QUICK else 'full'}; plots -> {OUT}")

# %% [markdown]
# ## The classic model by FOCE-I
#
# nlmixr2's setup: `ka = exp(tka + eta.ka)`, `cl = exp(tcl + eta.cl)`, `v = exp(tv + eta.v)`,
# `cp = center / v`, additive error; start tka 0.45, tcl 1, tv 3.45, omega variances 0.6,
# 0.3, 0.1, add.sd 0.7; all 132 observations (those at time 0 included).

# %%
def one_compartment(u, p, t):
    return [-p.ka * u.depot, p.ka * u.depot - p.cl / p.v * u.central]


COMP = {1: "depot", 2: "central"}
observables = {"cp": lambda u, p: u.central / p.v}
classic = sciml.Model(one_compartment, ["depot", "central"], ["ka", "cl", "v"],
                      observables=observables)
subjects = sciml.data.read_events(DATA, classic, COMP, "cp", params=[1.0, 1.0, 1.0])


def individual(theta, eta, cov):
    return {"ka": np.exp(theta.tka + eta.ka), "cl": np.exp(theta.tcl + eta.cl),
            "v": np.exp(theta.tv + eta.v)}


START = dict(theta={"tka": 0.45, "tcl": 1.0, "tv": 3.45},
             omega={"ka": 0.6, "cl": 0.3, "v": 0.1}, error={"cp": nl.Additive(0.7)})
t0 = time.perf_counter()
fit_c = nl.NLME(classic, individual, **START).fit(subjects, method="focei",
                                                  covariance=not QUICK)
print(f"FOCE-I fit{'' if QUICK else ' with covariance step'}: {time.perf_counter() - t0:.1f} s")

published = {"objective": 116.80, "tka": 0.464, "tcl": 1.012, "tv": 3.460, "omega ka": 0.400,
             "omega cl": 0.069, "omega v": 0.019, "add.sd": 0.694}
ours = {"objective": fit_c.objective, **fit_c.theta,
        **{f"omega {e}": fit_c.omega[i, i] for i, e in enumerate(fit_c.eta_names)},
        "add.sd": fit_c.sigma["cp.sd"]}
se = {**{k: fit_c.se.get(k) for k in fit_c.theta},
      **{f"omega {e}": fit_c.se.get(f"omega.{e}") for e in fit_c.eta_names},
      "add.sd": fit_c.se.get("cp.sd")}
print(f"{'':<10}{'ours':>10}{'(se)':>9}{'nlmixr2':>10}")
for k, v in published.items():
    s = f"({se[k]:.3f})" if se.get(k) is not None else ""
    print(f"{k:<10}{ours[k]:>10.4f}{s:>9}{v:>10.3f}")

# %%
fig = fit_c.gof(OUT / "theophylline_nlme_gof.png")

# %% [markdown]
# ## A network in the absorption, under the same random effects
#
# The network starts with its output layer at zero: the fit starts from the classic model.

# %%
chain = Chain(1, Dense(4, "tanh"), Dense(1))


def one_compartment_ude(u, p, t, nets):
    absorption = p.ka * np.exp(np.tanh(nets.U([u.depot / 320.0])[0])) * u.depot
    return [-absorption, absorption - p.cl / p.v * u.central]


ude = sciml.Model(one_compartment_ude, ["depot", "central"], ["ka", "cl", "v"],
                  nets={"U": chain}, observables=observables)
w0 = chain.init_params(seed=0)
w0[-5:] = 0.0  # the output layer: U = 0
ude_subjects = sciml.data.read_events(DATA, ude, COMP, "cp",
                                      params=ude.init_params(seed=0, ka=1.0, cl=1.0, v=1.0))
ITERS = 10 if QUICK else 500


def fit_ude(subs, iters=ITERS):
    return nl.NLME(ude, individual, nets={"U": w0}, **START).fit(
        subs, method="focei", max_iter=iters, covariance=False)


t0 = time.perf_counter()
fit_u = fit_ude(ude_subjects)
print(f"UDE FOCE-I fit: {time.perf_counter() - t0:.1f} s, {fit_u.n_iter} iterations")
print(f"{'':<10}{'objective':>10}{'AIC':>8}{'parameters':>11}")
for name, f in (("classic", fit_c), ("UDE", fit_u)):
    print(f"{name:<10}{f.objective:>10.2f}{f.aic:>8.1f}{f.n_estimated:>11}")

# %%
fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
for a, (name, f) in zip(ax, (("classic", fit_c), ("UDE", fit_u))):
    f.vpc(n_sim=50 if QUICK else 500, seed=1, ax=a, legend=False)
    a.set(title=f"{name}: VPC (5/50/95%, 95% bands)", xlabel="time (h)", ylabel="")
ax[0].set_ylabel("theophylline (mg/L)")
fig.tight_layout()
fig.savefig(OUT / "theophylline_nlme_vpc.png", dpi=120)

# %% [markdown]
# ## Held-out subjects
#
# Folds by subject: {1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}. Each model is fitted on
# nine subjects; the objective of the three left out at those estimates is -2 log of their
# marginal likelihood: how well the fitted *population* (typical values, variability,
# network) predicts people it never saw. Lower is better.

# %%
FOLDS = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]][:1 if QUICK else 4]
rows = []
for fold in FOLDS:
    train = [i for i, s in enumerate(subjects) if s.id not in fold]
    test = [i for i, s in enumerate(subjects) if s.id in fold]
    fc = nl.NLME(classic, individual, **START).fit([subjects[i] for i in train],
                                                    method="focei", covariance=False)
    fu = fit_ude([ude_subjects[i] for i in train], iters=5 if QUICK else ITERS)
    rows.append((fold, fc.objective_on([subjects[i] for i in test]),
                 fu.objective_on([ude_subjects[i] for i in test])))
    print(f"held out {fold}: classic {rows[-1][1]:7.2f}   UDE {rows[-1][2]:7.2f}")
total_c, total_u = sum(r[1] for r in rows), sum(r[2] for r in rows)
print(f"sum over folds: classic {total_c:.2f}, UDE {total_u:.2f}")

# %%
fig, ax = plt.subplots(figsize=(6, 3.8))
x = np.arange(len(rows))
ax.bar(x - 0.2, [r[1] for r in rows], 0.4, label="classic")
ax.bar(x + 0.2, [r[2] for r in rows], 0.4, label="UDE")
ax.set_xticks(x, [str(r[0]) for r in rows])
ax.set(xlabel="held-out subjects", ylabel="held-out objective (-2 log L)",
       title="Held-out marginal likelihood (lower is better)")
ax.legend()
fig.tight_layout()
fig.savefig(OUT / "theophylline_nlme_heldout.png", dpi=120)
print(f"total {time.perf_counter() - T_START:.0f} s")
