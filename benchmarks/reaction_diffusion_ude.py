"""Benchmark ``reaction_diffusion_ude``: a 1-D reaction-diffusion UDE's gradient, ours vs diffrax.

The problem (issue 28): Fisher-KPP on [0, 1],

    u_t = D u_xx + r u (1 - u),    D = 0.01, r = 1,    u(0, x) = exp(-(x / 0.1)^2),

on N = 256 cells (cell-centred, dx = 1/256; u_xx the 3-point stencil; zero-flux
(Neumann) boundaries by mirrored ghost cells, u_{-1} = u_0 and u_N = u_{N-1}),
observed in every cell at t = 0.5, 1.0, ..., 5.0 (10 times; SciPy Radau at rtol
1e-10, atol 1e-12, no noise). The diffusion makes it stiff (the stencil's
eigenvalues reach -4 D / dx^2 = -2,621). In the UDE the reaction is a network
applied cell by cell, R = Dense(1 -> 8, tanh), Dense(8 -> 8, tanh), Dense(8 -> 1)
(97 weights shared by the cells, ``init_params(seed=0)``), D a parameter too
(98 in all, D = 0.01 at the start):

    u_t = D u_xx + R(u).

Work unit: one loss + gradient over the 98 parameters, loss the sum of squared
errors against the 10 x 256 observations, rtol 1e-6, atol 1e-8:

- ``ours-Rodas5-auto``: `sciml.Rodas5()` with ``linsolve="auto"`` (what the
  engine picks is printed) and `adjoints.GaussAdjoint` (the default method
  here: stiff solver, 98 parameters);
- ``ours-Rodas5-dense``: the same with ``linsolve="dense"``;
- ``ours-Rodas5-banded``: ``linsolve="banded"``, or the refusal;
- ``ours-BDF-auto``: `sciml.BDF()` with its default method
  (`adjoints.InterpolatingAdjoint`);
- ``diffrax-Kvaerno5``: ``jax.jit(jax.value_and_grad(loss))``, Kvaerno5 (its
  default root finder: VeryChord on a dense Jacobian, LU), PIDController,
  RecursiveCheckpointAdjoint, diffrax's default ``max_steps`` (4096); the same
  flat parameters through a pure-JAX network vectorised over the cells. Its
  ``jit`` compile (``lower().compile()``) is reported apart from its first call.

Quality: the loss; ``grad_rel_err``, the relative 2-norm error of the gradient
against a reference (ours, Rodas5 + GaussAdjoint at rtol 1e-10, atol 1e-12; the
backward solve at the same tolerances); ``vs_ours``, the relative 2-norm
difference from ``ours-Rodas5-auto``; ``fd_dir_rel_err``, the relative error of the
derivative along one random unit direction against central differences of a
SciPy Radau loss (rtol 1e-11, atol 1e-13, NumPy right-hand side: no code of
ours) with step 1e-4. A second table times the forward solve alone, and a
breakdown prices the forward solve's kernel calls (where the time goes).

Ours runs on one thread, OpenBLAS (JAX's LU) on one thread, XLA on ``--threads``
(default: all cores). Run as ``python -m benchmarks.reaction_diffusion_ude
[--quick] [--threads N] [--json PATH]``.
"""

from __future__ import annotations

import os

# JAX factors through SciPy's OpenBLAS (lapack_dgetrf): with its 2 threads on a 2-core
# machine that another process keeps busy, a 256 x 256 LU took 80 ms instead of 0.8 ms
# (spinning threads). One thread, as ours runs; set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from scipy.integrate import solve_ivp  # noqa: E402
from scipy.sparse import diags  # noqa: E402

from benchmarks import _harness as H  # noqa: E402

N = 256
DX = 1.0 / N
X = (np.arange(N) + 0.5) * DX
D_TRUE, R_TRUE = 0.01, 1.0
U0 = np.exp(-(X / 0.1) ** 2)
TSPAN = (0.0, 5.0)
TS = np.linspace(0.5, 5.0, 10)
SIZES = (1, 8, 8, 1)
N_NET = sum(i * o + o for i, o in zip(SIZES[:-1], SIZES[1:]))  # 97
RTOL, ATOL = 1e-6, 1e-8
REF_RTOL, REF_ATOL = 1e-10, 1e-12
FD_RTOL, FD_ATOL, FD_STEP = 1e-11, 1e-13, 1e-4
PATTERN = diags([1.0, 1.0, 1.0], [-1, 0, 1], shape=(N, N)).tocsr()


# --------------------------------------------------------------------------- NumPy


def laplacian(u, xp=np):
    """The 3-point stencil with mirrored ghost cells (zero flux), without the 1/dx^2."""
    up = xp.concatenate([u[:1], u, u[-1:]])
    return up[:-2] - 2 * u + up[2:]


def net(p, u, xp=np):
    """R(u) cell by cell: u (N,) -> (N,); tanh hidden layers, linear output."""
    return H.dense_forward(p, SIZES, u[:, None], xp.tanh, xp)[:, 0]


def true_rhs(t, u):
    return D_TRUE / DX ** 2 * laplacian(u) + R_TRUE * u * (1 - u)


def ude_rhs(theta):
    D, p = theta[0], theta[1:]

    def f(t, u):
        return D / DX ** 2 * laplacian(u) + net(p, u)

    return f


def radau(f, rtol, atol):
    r = solve_ivp(f, TSPAN, U0, method="Radau", t_eval=TS, rtol=rtol, atol=atol,
                  jac_sparsity=PATTERN)
    if not r.success:
        raise RuntimeError(f"solve_ivp failed: {r.message}")
    return r.y.T


def data():
    """The true model at the 10 times, (10, N)."""
    return radau(true_rhs, REF_RTOL, REF_ATOL)


def scipy_loss(theta, Y):
    return float(np.sum((radau(ude_rhs(theta), FD_RTOL, FD_ATOL) - Y) ** 2))


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


# --------------------------------------------------------------------------- ours


def our_model():
    """The UDE traced from plain Python: one network call per cell."""
    import sciml
    from nets import Chain, Dense

    chain = Chain(1, Dense(8, "tanh"), Dense(8, "tanh"), Dense(1))
    a = 1.0 / DX ** 2

    def rd_ude(u, p, t, nets):
        out = []
        for i in range(N):
            left = u[i - 1] if i > 0 else u[0]
            right = u[i + 1] if i < N - 1 else u[N - 1]
            out.append(p.D * a * (left - 2 * u[i] + right) + nets.R([u[i]])[0])
        return out

    return sciml.Model(rd_ude, [f"u{i}" for i in range(N)], ["D"], nets={"R": chain})


OUR_ROWS = [  # (row, solver class, solver keywords, adjoints class or None for the default)
    ("ours-Rodas5-auto", "Rodas5", {"linsolve": "auto"}, "GaussAdjoint"),
    ("ours-Rodas5-dense", "Rodas5", {"linsolve": "dense"}, "GaussAdjoint"),
    ("ours-Rodas5-banded", "Rodas5", {"linsolve": "banded"}, "GaussAdjoint"),
    ("ours-BDF-auto", "BDF", {"linsolve": "auto"}, None),
]


def our_works(prob, d, target_s, rtol=RTOL, atol=ATOL):
    import adjoints
    import sciml

    out = []
    for name, solver, kw, alg in OUR_ROWS:
        solver = getattr(sciml, solver)(**kw)
        sensealg = getattr(adjoints, alg)() if alg else None

        def fn(solver=solver, sensealg=sensealg):
            return sciml.loss_and_grad(prob, d, solver=solver, sensealg=sensealg, rtol=rtol,
                                       atol=atol)

        out.append(H.GradWork(name, fn, target_s))
    return out


def our_solve_work(prob, target_s):
    import sciml

    def fn():
        return sciml.solve(prob, sciml.Rodas5(), rtol=RTOL, atol=ATOL, saveat=TS)

    return H.Work("ours-Rodas5-auto", fn, target_s)


def breakdown(model, prob, picked):
    """Where the forward solve's time goes: its counts times each kernel call's time, with
    the Jacobian and LU that ``linsolve=picked`` uses."""
    import sciml
    from sciml.model import llvm
    from sciml.model.assembly import call
    from sciml.solvers import common
    from sciml.solvers.kernels import sparse
    from sciml.solvers.kernels.lu import lu_factor_into

    sol = sciml.solve(prob, sciml.Rodas5(), rtol=RTOL, atol=ATOL, saveat=TS)
    st = sol.stats
    u, p = np.asarray(sol.u)[-1], prob.params
    ws = model.workspace()
    w = np.zeros(N)

    def per_call(fn, seconds=0.2):
        fn()
        calls, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            fn()
            calls += 1
        return (time.perf_counter() - t0) / calls

    if picked == "dense":
        jac_name, jac_out = "jac", np.zeros((N, N))
        W = np.eye(N) / 0.01 - model.jac(u, p, 0.0)
        buf, piv = W.copy(), np.zeros(N, dtype=np.int64)

        def copy():
            buf[:] = W

        def lu():
            copy()
            lu_factor_into(buf, piv)

        lu_s = per_call(lu) - per_call(copy)
    else:
        jac_name, jac_out = "spjac", np.zeros(model.jac_sparsity.nnz)
        s = common.linear_algebra(model, picked)
        s.Jx[:] = model.spjac(u, p, 0.0).data
        lu_s = per_call(lambda: sparse.factor(s, s.LU1, 100.0, -1.0))
    # the kernels called as the engine calls them: preallocated outputs, no Python wrapper
    table = model.kernel_table("rhs", "vjp", jac_name)
    du, ubar, pbar = np.zeros(N), np.zeros(N), np.zeros(p.shape[0])

    def kernel(name, arrays):
        return lambda: call(table, name, arrays, 0.0, ws)

    fset = model._asm.sets["f"]  # the kernels' sizes decide how LLVM compiles them
    sizes = {k: llvm._size(fset.tree(k, meth)) for k, meth in
             (("rhs", "values"), ("vjp", "vjp"), (jac_name, jac_name))}
    return {"statements": sizes, "optimised_below": llvm.BIG,
            "steps": st["n_accepted"] + st["n_rejected"], "nfev": st["nfev"],
            "njac": st["njac"], "nlu": st["nlu"], "rhs_s": per_call(kernel("rhs", (du, u, p))),
            "jac_s": per_call(kernel(jac_name, (jac_out, u, p))), "lu_s": lu_s,
            "vjp_s": per_call(kernel("vjp", (ubar, pbar, w, u, p)))}


# --------------------------------------------------------------------------- diffrax


def setup_jax(threads):
    """(jax, diffrax, error, note): JAX in float64 on the CPU, its thread flags set first."""
    note = "XLA's default threads"
    if threads < H.available_cpus():
        flag = ("--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
                if threads == 1 else f"intra_op_parallelism_threads={threads}")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        note = f"XLA_FLAGS {flag}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    jax, err = H.optional_import("jax")
    if err is not None:
        return None, None, err, note
    diffrax, err = H.optional_import("diffrax")
    if err is not None:
        return jax, None, err, note
    jax.config.update("jax_enable_x64", True)
    return jax, diffrax, None, note


def diffrax_functions(jax, diffrax, Y, rtol=RTOL, atol=ATOL):
    """(loss, value_and_grad), neither jitted: the UDE in pure JAX on the flat theta."""
    jnp = jax.numpy

    def vf(t, u, theta):
        return theta[0] / DX ** 2 * laplacian(u, jnp) + net(theta[1:], u, jnp)

    term = diffrax.ODETerm(vf)
    u0, ts, Yj = jnp.asarray(U0), jnp.asarray(TS), jnp.asarray(Y)

    def loss(theta):
        sol = diffrax.diffeqsolve(
            term, diffrax.Kvaerno5(), TSPAN[0], TSPAN[1], None, u0, args=theta,
            saveat=diffrax.SaveAt(ts=ts), adjoint=diffrax.RecursiveCheckpointAdjoint(),
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol))
        return jnp.sum((sol.ys - Yj) ** 2)

    return loss, jax.value_and_grad(loss)


def diffrax_works(jax, diffrax, err, theta, Y, target_s):
    """(grad work, solve work, compile seconds {row: s})."""
    if err is not None:
        return H.Impl("diffrax-Kvaerno5", error=err), H.Impl("diffrax-Kvaerno5", error=err), {}
    loss, vg = diffrax_functions(jax, diffrax, Y)
    th = jax.numpy.asarray(theta)
    compile_s = {}
    fns = {}
    for key, f in (("grad", vg), ("solve", loss)):
        t0 = time.perf_counter()
        fns[key] = jax.jit(f).lower(th).compile()
        compile_s[key] = time.perf_counter() - t0

    def grad():
        v, g = jax.block_until_ready(fns["grad"](th))
        return float(v), np.asarray(g)

    def solve():
        return jax.block_until_ready(fns["solve"](th))

    return (H.GradWork("diffrax-Kvaerno5", grad, target_s),
            H.Work("diffrax-Kvaerno5", solve, target_s), compile_s)


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    ap = H.make_parser(__doc__.splitlines()[0])
    args = ap.parse_args(argv)
    rounds, target_s = (3, 0.2) if args.quick else (7, 0.5)
    machine = H.machine_info(max(1, args.threads))
    print(f"reaction_diffusion_ude: Fisher-KPP UDE, {N} cells (Neumann), 10 observation times, "
          f"R = 1 -> 8 tanh -> 8 tanh -> 1 per cell, {1 + N_NET} parameters (D and the "
          f"network); rtol {RTOL:g}, atol {ATOL:g}{' [--quick]' if args.quick else ''}")
    jax, diffrax, jerr, jnote = setup_jax(max(1, args.threads))
    print(f"machine: {machine['cpus']} cpus, {machine['cpu']}; ours on one thread, JAX: {jnote}, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS')}; {H.busy_note()}")

    import sciml
    from sciml.solvers import common

    Y = data()
    t0 = time.perf_counter()
    model = our_model()
    build_s = time.perf_counter() - t0
    theta = model.init_params(seed=0, D=D_TRUE)
    prob = sciml.ODEProblem(model, U0, TSPAN, theta)
    d = sciml.Data(TS, Y)
    picked = common.linsolve_kind(model, "auto")
    trace_err = float(np.abs(model.rhs(U0, theta, 0.0) - ude_rhs(theta)(0.0, U0)).max())
    print(f"ours: Model() {build_s:.2f} s; linsolve='auto' picks {picked!r} (Jacobian pattern: "
          f"{model.jac_sparsity.nnz} non-zeros of {N * N}); traced rhs vs NumPy at u0: max "
          f"|diff| {trace_err:.1e}")

    # --- the first gradient in this process: the model's kernels generated and compiled
    import adjoints

    t0 = time.perf_counter()
    sciml.loss_and_grad(prob, d, solver=sciml.Rodas5(), sensealg=adjoints.GaussAdjoint(),
                        rtol=RTOL, atol=ATOL)
    first_s = time.perf_counter() - t0
    print(f"ours: first loss + gradient in this process {first_s:.1f} s (the model's kernels "
          "generated and compiled, the engine's loops from numba's disk cache)")

    # --- reference gradient, checked by central differences along a random direction

    t0 = time.perf_counter()
    ref_v, ref_g = sciml.loss_and_grad(prob, d, solver=sciml.Rodas5(),
                                       sensealg=adjoints.GaussAdjoint(), rtol=REF_RTOL,
                                       atol=REF_ATOL)
    ref_s = time.perf_counter() - t0
    v = np.random.default_rng(0).standard_normal(theta.shape)
    v /= np.linalg.norm(v)
    t0 = time.perf_counter()
    fd = (scipy_loss(theta + FD_STEP * v, Y) - scipy_loss(theta - FD_STEP * v, Y)) / (2 * FD_STEP)
    fd_s = time.perf_counter() - t0
    ref_fd = abs(ref_g @ v - fd) / abs(fd)
    print(f"reference: ours Rodas5 + GaussAdjoint at rtol {REF_RTOL:g}, atol {REF_ATOL:g} "
          f"({ref_s:.1f} s); loss {ref_v:.10g}; along a random unit direction "
          f"{ref_g @ v:.8g} against central differences (step {FD_STEP:g}) of a SciPy Radau "
          f"loss {fd:.8g} ({fd_s:.1f} s): rel {ref_fd:.1e}")

    # --- one loss + gradient, alternating
    works = our_works(prob, d, target_s)
    dgrad, dsolve, compile_s = diffrax_works(jax, diffrax, jerr, theta, Y, target_s)
    works.append(dgrad)
    impls = [w.impl if isinstance(w, H.Work) else w for w in works]
    mon = H.OtherLoad().start()
    H.time_alternating(impls, rounds)
    load = mon.stop()
    ours_g = next((w.result[1] for w in works if isinstance(w, H.GradWork)
                   and w.impl.name == "ours-Rodas5-auto" and w.result is not None), None)
    rows = []
    for w in works:
        q = None
        if isinstance(w, H.GradWork) and w.result is not None:
            val, g = w.result
            q = {"loss": val, "grad_rel_err": rel(g, ref_g),
                 "vs_ours": rel(g, ours_g) if ours_g is not None else None,
                 "fd_dir_rel_err": abs(g @ v - fd) / abs(fd)}
            if w.impl.name.startswith("diffrax"):
                q["compile_s"] = compile_s["grad"]
        rows.append(H.result_row(w.impl if isinstance(w, H.Work) else w, "grad", q))
    print(f"\n== one loss + gradient ({1 + N_NET} parameters); first call = the first of this "
          "row (ours: kernels already compiled, above; diffrax: after its jit compile, "
          "compile_s)")
    H.print_table(rows, ours="ours-Rodas5-auto")
    print(H.OtherLoad.note(load, "during the timing"))

    # --- the forward solve alone
    solves = [our_solve_work(prob, target_s), dsolve]
    simpls = [w.impl if isinstance(w, H.Work) else w for w in solves]
    mon = H.OtherLoad().start()
    H.time_alternating(simpls, rounds)
    sload = mon.stop()
    srows = [H.result_row(i, "solve", {"compile_s": compile_s["solve"]}
                          if i.name.startswith("diffrax") and compile_s else None)
             for i in simpls]
    print("\n== the forward solve alone (loss value, saves at the 10 times)")
    H.print_table(srows, ours="ours-Rodas5-auto")
    print(H.OtherLoad.note(sload, "during the timing"))

    # --- where our forward solve's time goes
    b = breakdown(model, prob, picked)
    parts = {"rhs": b["nfev"] * b["rhs_s"], "jac": b["njac"] * b["jac_s"],
             "LU": b["nlu"] * b["lu_s"]}
    fwd = next((r["median_s"] for r in srows if r["impl"] == "ours-Rodas5-auto"), None)
    print(f"\n== ours' forward solve ({picked} LU): {b['steps']} steps, {b['nfev']} rhs, "
          f"{b['njac']} Jacobians, {b['nlu']} LUs; per call: rhs {b['rhs_s'] * 1e6:.0f} us, "
          f"Jacobian {b['jac_s'] * 1e6:.0f} us, LU {b['lu_s'] * 1e6:.0f} us, vjp "
          f"{b['vjp_s'] * 1e6:.0f} us; so " + ", ".join(f"{k} {s * 1e3:.1f} ms"
                                                        for k, s in parts.items())
          + (f" of the solve's {fwd * 1e3:.1f} ms" if fwd else ""))
    print("   kernels' statements: " + ", ".join(
        f"{k} {v:,} ({'LLVM O3' if v <= b['optimised_below'] else 'fast code generator'})"
        for k, v in b["statements"].items()))

    if args.json:
        import json

        doc = {"bench": "reaction_diffusion_ude", "machine": machine,
               "problem": {"cells": N, "boundaries": "Neumann (mirrored ghost cells)",
                           "D": D_TRUE, "r": R_TRUE, "times": TS.tolist(), "rtol": RTOL,
                           "atol": ATOL, "net": list(SIZES), "n_params": 1 + N_NET},
               "linsolve_auto_picks": picked, "model_build_s": build_s,
               "ours_first_grad_s": first_s,
               "reference": {"rtol": REF_RTOL, "atol": REF_ATOL, "loss": ref_v,
                             "fd_step": FD_STEP, "fd_rtol": FD_RTOL, "fd_dir": fd,
                             "ref_dir": float(ref_g @ v), "ref_fd_rel_err": ref_fd},
               "other_load": load, "results": [dict(r, work="grad") for r in rows]
               + [dict(r, work="solve") for r in srows],
               "ratios": H.ratios(rows, ours="ours-Rodas5-auto"),
               "solve_ratios": H.ratios(srows, ours="ours-Rodas5-auto"),
               "forward_breakdown": b}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as fh:
            json.dump(doc, fh, indent=1)
            fh.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
