# %% [markdown]
# # A PEtab SciML problem: Lotka-Volterra with a network in the right-hand side
#
# Case 001 of the PEtab SciML test suite (PEtab-dev/petab_sciml_testsuite, MIT; a copy is in
# `tests/data/petab_sciml/`): an SBML Lotka-Volterra model whose predator birth term `gamma`
# is replaced, through the hybridization table, by a 2-5-5-1 tanh network of prey and
# predator. `sciml.petab.load` reads the SBML model, the PEtab v2 tables, the network YAML and
# its HDF5 weights into one `sciml.Model`; the likelihood and its exact gradient come from
# the compiled solvers and forward sensitivities.
#
# We fit the three mechanistic rates and the network's 46 weights by multistart (starts
# around the nominal values, L-BFGS), and plot the data against the best fit.
#
# Run as a script with `python -m examples.petab_lotka_volterra` (`--quick`, or
# `SCIML_QUICK=1`, for a short smoke run). Plots go to `examples/output/` (`$SCIML_OUTPUT`
# overrides; quick runs without it write to a temporary folder).
#
# **Runtime (full mode)**, on this project's 2-core machine shared with other sessions:
# about 20 s wall for `python -m examples.petab_lotka_volterra` with the engine in numba's
# disk cache (8 starts of up to 300 L-BFGS iterations, ~1 ms per likelihood and gradient).

# %%
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import matplotlib.pyplot as plt  # noqa: E402

import sciml  # noqa: E402
import sciml.petab  # noqa: E402

QUICK = os.environ.get("SCIML_QUICK", "") not in ("", "0") or "--quick" in sys.argv[1:]
HERE = Path(__file__).resolve().parent if "__file__" in globals() else Path.cwd()
CASE = HERE.parent / "tests" / "data" / "petab_sciml" / "sciml_problem_import" / "001"
OUT = Path(os.environ.get("SCIML_OUTPUT") or (
    Path(tempfile.gettempdir()) / "sciml-examples" if QUICK else HERE / "output"))
OUT.mkdir(parents=True, exist_ok=True)
T_START = time.perf_counter()
print(f"mode: {'quick' if QUICK else 'full'}; plots -> {OUT}")

# %% [markdown]
# ## Load the problem
#
# The estimated parameters are listed in the parameter table's order, the network's weights
# flattened where its row is; `nominal` holds their nominal values (the HDF5 weights).

# %%
problem = sciml.petab.load(CASE / "petab" / "problem.yaml")
print(problem)
print(problem.parameter_names[:5], "...")
llh, grad = problem.llh_and_grad(problem.nominal)
print(f"log-likelihood at the nominal values: {llh:.4f}")
print("gradient of the mechanistic parameters:",
      {k: round(v, 2) for k, v in problem.unflatten(grad).items() if not isinstance(v, dict)})

# %% [markdown]
# ## Multistart fit
#
# Each start perturbs the nominal values (`spread=0.2`: the rates by a log-normal factor, the
# weights by a normal step) and runs L-BFGS on minus the log-likelihood; the starts run in
# threads and come back sorted, best first.

# %%
n_starts, iters = (2, 30) if QUICK else (8, 300)
result = problem.fit(n_starts=n_starts, seed=0, spread=0.2,
                     optimizers=[sciml.LBFGS(iters=iters)])
print(result)
best = result.best
print(f"best log-likelihood {-best.objective:.4f} (nominal {llh:.4f})")
print({k: round(v, 3) for k, v in problem.unflatten(best.params).items()
       if not isinstance(v, dict)})

# %% [markdown]
# ## Data against the fit
#
# `simulate` gives the measurement table's keys with the simulated observable; the markers
# are the measurements.

# %%
import pandas as pd  # noqa: E402

meas = pd.read_csv(CASE / "petab" / "measurements.tsv", sep="\t")
sim_fit = problem.simulate(best.params)
sim_nom = problem.simulate(problem.nominal)
fig, axes = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
for ax, obs in zip(axes, problem.observable_ids):
    m = meas[meas.observableId == obs]
    ax.plot(m.time, m.measurement, "o", color="k", ms=4, label="data")
    f = sim_fit[sim_fit.observableId == obs]
    ax.plot(f.time, f.simulation, "-", color="C3", label="best fit")
    n = sim_nom[sim_nom.observableId == obs]
    ax.plot(n.time, n.simulation, "--", color="C0", lw=1, label="nominal")
    ax.set_title(obs)
    ax.set_xlabel("t")
axes[0].legend(fontsize=8)
fig.savefig(OUT / "petab_lotka_volterra_fit.png", dpi=120)
plt.show()

# %%
fig = result.waterfall(path=OUT / "petab_lotka_volterra_waterfall.png")
print(f"total time {time.perf_counter() - T_START:.1f} s")
