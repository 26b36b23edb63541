# %% [markdown]
# # Warfarin PK/PD as a population: a network for the effect, under FOCE-I
#
# Warfarin in 32 subjects after one oral dose of about 1.5 mg/kg (O'Reilly et al. 1963, 1968;
# the nlmixr2 `warfarin` table, see `data/README.md`): plasma concentration (mg/L) and
# prothrombin complex activity (PCA, % of normal) over 6 days. `warfarin_pkpd` fitted these
# data as a penalised joint fit with fixed spreads; here the same science is a real
# **mixed-effects model** (`sciml.nlme`): between-subject variances estimated, random
# effects integrated out (FOCE-I), both observables with their own residual error models.
#
# - **PK**: one compartment with first-order absorption; log-normal `ka`, `CL`, `V`, with
#   `CL` and `V` scaled by body weight (`CL * (WT/70)^0.75`, `V * WT/70`: a covariate).
# - **PD**: turnover. PCA is `E0 * R`; the clotting-factor activity `R` (1 at baseline) is
#   made at a rate inhibited by the concentration and lost at rate `kout`:
#   `dR/dt = kout (1 - I(C)) - kout R`; log-normal `E0`.
#   - classic: `I(C) = C / (EC50 + C)` (Emax, full inhibition);
#   - UDE: `I(C) = 1 - exp(-c g(c))`, `g = softplus(U(c))` from a network of
#     `c = C / 10 mg/L` (zero at `C = 0`, below 1, otherwise free). Its 25 weights are
#     population parameters, estimated with the thetas, omegas and sigmas by the same
#     FOCE-I likelihood (exact gradients in every one of them).
# - **Residual errors**: combined additive + proportional for the concentrations, additive
#   for PCA. Subject 9's replicate concentrations (two at each of 3, 6, 9 and 12 h) count
#   as separate observations, as NONMEM counts them (`duplicates="keep"`).
#
# The two models are compared by objective, AIC, VPCs, NPDE and, on subjects **held out**
# of the fit, by their marginal likelihood under each fitted population model.
#
# **Runtime (full mode)**: about 4 minutes (247 s) on this project's 2-core machine with
# the models in the disk cache (ten FOCE-I fits, five of them with the network; subjects on
# two threads); quick mode about 15 s.
#
# Run as a script with `python -m examples.warfarin_nlme` (`--quick` or `SCIML_QUICK=1`
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
from scipy import stats

import nets
import sciml
import sciml.nlme as nl
from nets import Chain, Dense

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

# %%
C_REF = 10.0  # mg/L: the network's input is C / C_REF
STATES = ["depot", "central", "R"]
OBSERVABLES = {"conc": lambda u, p: u.central / p.v, "pca": lambda u, p: p.e0 * u.R}


def pk(u, p):
    conc = u.central / p.v
    return [-p.ka * u.depot, p.ka * u.depot - p.cl * conc], conc


def turnover_emax(u, p, t):
    (d_depot, d_central), conc = pk(u, p)
    inhibition = conc / (p.ec50 + conc)
    return [d_depot, d_central, p.kout * (1.0 - inhibition) - p.kout * u.R]


def turnover_ude(u, p, t, nets):
    (d_depot, d_central), conc = pk(u, p)
    c = conc / C_REF
    inhibition = 1.0 - np.exp(-c * nets.U([c])[0])  # the net ends in softplus: g(c) > 0
    return [d_depot, d_central, p.kout * (1.0 - inhibition) - p.kout * u.R]


classic = sciml.Model(turnover_emax, STATES, ["ka", "cl", "v", "e0", "kout", "ec50"],
                      observables=OBSERVABLES)
chain = Chain(1, Dense(8, "tanh"), Dense(1, "softplus"))
ude = sciml.Model(turnover_ude, STATES, ["ka", "cl", "v", "e0", "kout"], nets={"U": chain},
                  observables=OBSERVABLES)


def read(model, params):
    return sciml.data.read_events(DATA, model, {1: "depot"},
                                  observable={"cp": "conc", "pca": "pca"}, params=params,
                                  u0=[0.0, 0.0, 1.0], covariates=["wt"], duplicates="keep")


subjects = read(classic, np.ones(classic.n_params))
ude_subjects = read(ude, ude.init_params(seed=0, ka=1, cl=1, v=1, e0=1, kout=1))
n_obs = np.sum([s.data.mask.sum(axis=0) for s in subjects], axis=0)
print(f"{len(subjects)} subjects: {n_obs[0]} concentrations, {n_obs[1]} PCA values")


def individual(theta, eta, cov):
    return {"ka": np.exp(theta.tka + eta.ka),
            "cl": np.exp(theta.tcl + eta.cl) * (cov.wt / 70.0) ** 0.75,
            "v": np.exp(theta.tv + eta.v) * cov.wt / 70.0,
            "e0": np.exp(theta.te0 + eta.e0),
            "kout": np.exp(theta.tkout)}


def individual_emax(theta, eta, cov):
    return {**individual(theta, eta, cov), "ec50": np.exp(theta.tec50)}


# Typical values to start from: ka 1 / h, CL 0.135 L/h and V 8 L at 70 kg, E0 100 %, kout
# 0.05 / h (clotting-factor half-life ~14 h), EC50 1 mg/L.
THETA = dict(tka=0.0, tcl=np.log(0.135), tv=np.log(8.0), te0=np.log(100.0),
             tkout=np.log(0.05))
OMEGA = {"ka": 0.5, "cl": 0.1, "v": 0.1, "e0": 0.01}
ERROR = {"conc": nl.Combined(0.5, 0.1), "pca": nl.Additive(4.0)}

# %% [markdown]
# ## The classic model by FOCE-I

# %%
t0 = time.perf_counter()
fit_c = nl.NLME(classic, individual_emax, theta={**THETA, "tec50": 0.0}, omega=OMEGA,
                error=ERROR).fit(subjects, method="focei", covariance=not QUICK,
                                 max_iter=8 if QUICK else 500)
print(f"FOCE-I fit{'' if QUICK else ' with covariance step'}: {time.perf_counter() - t0:.1f} s"
      f", {fit_c.n_iter} iterations")
print(f"objective {fit_c.objective:.2f}, AIC {fit_c.aic:.1f}")
natural = {"ka (1/h)": "tka", "CL (L/h, 70 kg)": "tcl", "V (L, 70 kg)": "tv", "E0 (%)": "te0",
           "kout (1/h)": "tkout", "EC50 (mg/L)": "tec50"}
print(f"{'':<18}{'estimate':>10}{'rse %':>8}   omega (se)")
for label, th in natural.items():
    e = th[1:] if th[1:] in fit_c.eta_names else None
    rse = 100 * fit_c.se.get(th, np.nan)  # se of a log-scale theta: relative se
    om = ""
    if e is not None:
        i = fit_c.eta_names.index(e)
        om = f"{fit_c.omega[i, i]:.4f} ({fit_c.se.get(f'omega.{e}', np.nan):.4f})"
    print(f"{label:<18}{np.exp(fit_c.theta[th]):>10.4g}{rse:>8.1f}   {om}")
for k, v in fit_c.sigma.items():
    print(f"{k:<18}{v:>10.4g}   se {fit_c.se.get(k, np.nan):.4f}")

# %%
for obs in ("conc", "pca"):
    fit_c.gof(OUT / f"warfarin_nlme_gof_{obs}.png", observable=obs)

# %% [markdown]
# ## The effect as a network, under the same random effects
#
# The network is first trained to reproduce the fitted Emax curve, so the FOCE-I fit of the
# UDE starts at the classic model (same thetas, omegas and sigmas).

# %%
EC50 = float(np.exp(fit_c.theta["tec50"]))
w0 = chain.init_params(seed=0)
c = np.linspace(1e-3, 2.5, 200)[:, None]
pre = nets.train(chain, w0, c, np.log1p(c * C_REF / EC50) / c, optimizer=nets.Adam(0.02),
                 iters=300 if QUICK else 3000)
print(f"network pretrained on the Emax curve: squared error {pre[0]:.3g} -> {pre[-1]:.3g}")
START_U = dict(theta={k: fit_c.theta[k] for k in THETA},
               omega={e: fit_c.omega[i, i] for i, e in enumerate(fit_c.eta_names)},
               error={"conc": nl.Combined(fit_c.sigma["conc.add"], fit_c.sigma["conc.prop"]),
                      "pca": nl.Additive(fit_c.sigma["pca.sd"])})
ITERS = 5 if QUICK else 300


def fit_ude(subs, iters=ITERS):
    return nl.NLME(ude, individual, nets={"U": w0}, **START_U).fit(
        subs, method="focei", max_iter=iters, covariance=False)


t0 = time.perf_counter()
fit_u = fit_ude(ude_subjects)
print(f"UDE FOCE-I fit: {time.perf_counter() - t0:.1f} s, {fit_u.n_iter} iterations")
print(f"{'':<10}{'objective':>10}{'AIC':>8}{'BIC':>8}{'parameters':>11}")
for name, f in (("classic", fit_c), ("UDE", fit_u)):
    print(f"{name:<10}{f.objective:>10.2f}{f.aic:>8.1f}{f.bic:>8.1f}{f.n_estimated:>11}")
print("UDE:", {k: round(float(np.exp(v)), 4) for k, v in fit_u.theta.items()},
      "omega", np.round(np.diag(fit_u.omega), 4).tolist())

# %%
C = np.linspace(0.0, 20.0, 201)
cu = C / C_REF
inh_u = 1.0 - np.exp(-cu * chain(cu[:, None], fit_u.nets["U"])[:, 0])
conc_seen = np.asarray(fit_c.table["DV"])[np.asarray(fit_c.table["OBS"]) == "conc"]
fig, ax = plt.subplots(figsize=(6, 4))
ax.plot(C, C / (EC50 + C), color="C0", lw=1.6, label=f"classic: C / ({EC50:.2f} + C)")
ax.plot(C, inh_u, color="C3", lw=1.6, label="UDE: 1 - exp(-c g(c))")
ax.plot(conc_seen, np.full(conc_seen.shape, -0.03), "|", color="0.5", ms=6,
        label="observed concentrations")
ax.set(xlabel="warfarin (mg/L)", ylabel="inhibition of synthesis I(C)",
       title="The concentration-effect relation")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig(OUT / "warfarin_nlme_effect.png", dpi=120)

# %% [markdown]
# ## VPCs and NPDE
#
# 5th, 50th and 95th percentiles of the observations (lines) over the 95% confidence bands
# of the same percentiles in replicates of the study simulated from each fitted model
# (new random effects and residuals); then the NPDE, which are N(0, 1) if the model is right.

# %%
N_SIM = 30 if QUICK else 500
# bins between the sampling times (0.5-12 h for the concentrations, then daily)
BINS = [-np.inf, 0.75, 1.25, 1.75, 2.5, 4.5, 7.5, 10.5, 18, 30, 42, 60, 84, 108, 132, np.inf]
fig, ax = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
for col, (name, f) in enumerate((("classic", fit_c), ("UDE", fit_u))):
    for row, (obs, unit) in enumerate((("conc", "warfarin (mg/L)"), ("pca", "PCA (%)"))):
        f.vpc(n_sim=N_SIM, bins=BINS, seed=1, observable=obs, ax=ax[row, col], legend=False)
        ax[row, col].set(title=f"{name}: VPC of {obs}", ylabel=unit,
                         xlabel="time (h)" if row else "")
fig.tight_layout()
fig.savefig(OUT / "warfarin_nlme_vpc.png", dpi=120)

print(f"{'NPDE':<16}{'mean':>7}{'sd':>7}{'KS p':>9}")
for name, f in (("classic", fit_c), ("UDE", fit_u)):
    z, obs = f.npde(n_sim=100 if QUICK else 1000, seed=3), np.asarray(f.table["OBS"])
    for o in ("conc", "pca"):
        zo = z[obs == o]
        print(f"{name + ' ' + o:<16}{zo.mean():>7.2f}{zo.std():>7.2f}"
              f"{stats.kstest(zo, 'norm').pvalue:>9.3g}")

# %% [markdown]
# ## Held-out subjects
#
# Four folds of eight subjects. Each model is fitted on the other 24; the objective of the
# eight left out at those estimates is -2 log of their marginal likelihood: how well the
# fitted population predicts people it never saw. Lower is better.

# %%
ids = [s.id for s in subjects]
FOLDS = [ids[k::4] for k in range(4)][:1 if QUICK else 4]
rows = []
for fold in FOLDS:
    train = [i for i, s in enumerate(subjects) if s.id not in fold]
    test = [i for i, s in enumerate(subjects) if s.id in fold]
    fc = nl.NLME(classic, individual_emax, theta={**THETA, "tec50": 0.0}, omega=OMEGA,
                 error=ERROR).fit([subjects[i] for i in train], max_iter=5 if QUICK else 500,
                                  covariance=False)
    fu = fit_ude([ude_subjects[i] for i in train], iters=3 if QUICK else 150)
    rows.append((fold, fc.objective_on([subjects[i] for i in test]),
                 fu.objective_on([ude_subjects[i] for i in test])))
    print(f"held out {fold}: classic {rows[-1][1]:8.2f}   UDE {rows[-1][2]:8.2f}")
print(f"sum over folds: classic {sum(r[1] for r in rows):.2f}, "
      f"UDE {sum(r[2] for r in rows):.2f}")
print(f"total {time.perf_counter() - T_START:.0f} s")

# %% [markdown]
# ## Results (full mode)
#
# | | classic (Emax) | UDE (network) |
# |---|---|---|
# | FOCE-I objective | 1485.1 | 1442.5 |
# | parameters estimated | 13 | 37 |
# | AIC / BIC | 1511.1 / 1565.5 | 1516.5 / 1671.2 |
# | held-out objective, sum of 4 folds | 1515.2 | 1547.9 (worse in 4 of 4) |
# | NPDE sd, concentrations / PCA | 0.80 / 1.07 | 0.79 / 1.15 |
#
# The classic model's estimates are those of a typical warfarin analysis: ka 0.51 / h,
# CL 0.139 L/h and V 7.7 L at 70 kg, kout 0.050 / h (a clotting-factor half-life of
# 14 h), EC50 1.15 mg/L, between-subject variances 0.39 (ka), 0.073 (CL), 0.029 (V) and
# 0.0034 (E0), standard errors from the covariance step (relative 1.3-20%).
#
# The network lowers the objective by 43 with 24 more parameters: AIC prefers the classic
# model narrowly, BIC clearly, and on subjects left out of the fit the Emax model predicts
# better in every fold. The learned inhibition follows the Emax curve where most
# concentrations are (1-9 mg/L) but has kinks near 1 and 10 mg/L that no pharmacology
# explains: with 32 subjects the network fits individual quirks. The misfit that remains
# is in the PK, not the effect: the concentration NPDE are narrower than N(0, 1) (sd 0.8,
# KS p < 1e-3) for both models, and the VPC's early upper percentile lies above its band,
# the signature of the absorption lag this model leaves out. The conclusion is the one
# `warfarin_pkpd` reached with a penalised fit, now under a real mixed-effects likelihood:
# the Emax turnover model is adequate for these data.
