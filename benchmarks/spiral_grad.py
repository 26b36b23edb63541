"""Benchmark 2, ``spiral_grad``: one loss + gradient of a neural ODE, every adjoint vs peers.

Setup of the DiffEqFlux / SciMLSensitivity benchmark: u0 = [2, 0], tspan
(0, 1.5), 30 save points; the truth du/dt = (u**3) A with A = [[-0.1, 2.0],
[-2.0, -0.1]] solved at rtol = atol = 1e-12; the model f(u) = Dense(50 -> 2)(
tanh(Dense(2 -> 50)(u**3))) in float64 (252 parameters, ``nets``
``Chain.init_params(seed=0)``, copied into every peer). Work unit: one loss
(sum of squares against the true trajectory at the save points) and its
gradient with respect to all 252 parameters, Tsit5 (Dopri5 for torchdiffeq,
which has no Tsit5), rtol = atol = 1e-6.

Implementations, alternated round by round in one process after a warm-up:

- ours: ``sciml.loss_and_grad`` with every ``adjoints`` method (a method not
  there yet, or raising NotImplementedError, is listed with the reason);
- diffrax: jitted ``value_and_grad`` with RecursiveCheckpointAdjoint and
  BacksolveAdjoint, Tsit5, PIDController, SaveAt(ts=...), float64;
- torchdiffeq: ``odeint`` (backpropagation through the solver) and
  ``odeint_adjoint``, dopri5, float64.

Quality: the loss, and the relative 2-norm error of each gradient against a
reference from diffrax at rtol = atol = 1e-12 (RecursiveCheckpointAdjoint;
SciPy forward sensitivities when diffrax is missing), itself cross-checked
against SciPy forward sensitivities and central differences on a few
coordinates. Published: SciMLSensitivity InterpolatingAdjoint with compiled
ReverseDiff vjps, 1.66 ms per gradient.

Run as ``python -m benchmarks.spiral_grad [--quick] [--json PATH] [--threads N]``.
"""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks import _harness as H
from benchmarks import _spiral as S

RTOL = ATOL = 1e-6
PUBLISHED_S = 1.66e-3  # SciMLSensitivity InterpolatingAdjoint + compiled ReverseDiff vjp
# Our rows: (row name, adjoints class name, constructor keywords).
OUR_METHODS = [
    ("ours-interp", "InterpolatingAdjoint", {}),
    ("ours-interp-ckpt", "InterpolatingAdjoint", {"checkpointing": True}),
    ("ours-backsolve", "BacksolveAdjoint", {}),
    ("ours-gauss", "GaussAdjoint", {}),
    ("ours-quadrature", "QuadratureAdjoint", {}),
    ("ours-forward", "ForwardSensitivity", {}),
    ("ours-discrete", "DiscreteAdjoint", {}),
]
# Losses of the implementations at rtol 1e-6 should agree far better than this.
LOSS_SPREAD_WARN = 1e-3


# --------------------------------------------------------------------------- implementations


def initial_params() -> tuple[np.ndarray, str]:
    """The 252 starting parameters (nets' Chain.init_params(seed=0)) and a note for the header."""
    nets, err = H.optional_import("nets")
    if err is None:
        try:
            chain = nets.Chain(2, nets.Dense(50, "tanh"), nets.Dense(2))
            p0 = np.asarray(chain.init_params(seed=S.INIT_SEED), dtype=np.float64)
            note = f"nets Chain.init_params(seed={S.INIT_SEED}), copied into every peer"
            if not np.array_equal(p0, S.initial_params(S.INIT_SEED)):
                note += " [WARNING: differs from the draw the layout check assumes]"
            return p0, note
        except Exception as e:  # nets changing in parallel: the peers still run
            err = H.error_text(e)
    return S.initial_params(), f"own draw of init_params' scheme (nets unavailable: {err})"


def our_impls(p0, y_true, target_s):
    """Rows for ``sciml.loss_and_grad`` with every adjoint, and a note on the model check."""
    names = [n for n, _, _ in OUR_METHODS]
    sciml, err = H.optional_import("sciml")
    if err is None and not hasattr(sciml, "loss_and_grad"):
        err = "sciml.loss_and_grad not available yet"
    if err is not None:
        return [H.Impl(n, error=err) for n in names], None
    try:
        from nets import Chain, Dense

        chain = Chain(2, Dense(50, "tanh"), Dense(2))

        def f(u, p, t, nets):
            return nets.U([u[0] ** 3, u[1] ** 3])

        model = sciml.Model(f, states=["x", "y"], params=[], nets={"U": chain})
        theta = model.init_params(seed=S.INIT_SEED)
        prob = sciml.ODEProblem(model, S.U0.tolist(), S.TSPAN, theta)
        data = sciml.Data(S.TS, y_true, states=["x", "y"])
        note = check_model(sciml, model, theta, prob, p0)
    except Exception as e:  # the whole of ours broken: show it in every row, run the peers
        return [H.Impl(n, error=H.error_text(e)) for n in names], None
    return H.sciml_grad_works(OUR_METHODS, sciml, prob, data, p0, RTOL, ATOL, target_s), note


def check_model(sciml, model, theta, prob, p0) -> str:
    """Our traced model must be the network the peers run: same theta, same trajectory."""
    notes = []
    if model.n_params != S.N_PARAMS or not np.array_equal(np.asarray(theta), p0):
        notes.append(f"model.init_params(seed={S.INIT_SEED}) differs from the peers' start")
    u = sciml.solve(prob, sciml.Tsit5(), rtol=1e-10, atol=1e-10, saveat=S.TS).u
    err = float(np.abs(np.asarray(u) - S.solve_model(p0)).max())
    notes.append(f"our traced model vs the NumPy network: max |u diff| {err:.2g} at rtol 1e-10")
    if not err < 1e-7:
        notes.append("[WARNING: not the same network]")
    return "; ".join(notes)


def setup_jax(threads: int) -> tuple[object | None, str]:
    """Import JAX in float64 on the CPU with the thread flags set first; (jax or None, note)."""
    cpus = H.available_cpus()
    note = "XLA default (all cores)"
    if threads < cpus:
        # XLA reads its flags once, at backend start; there is no exact thread count option.
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


def diffrax_loss_and_grad(jax, diffrax, y_true, adjoint, rtol, atol, max_steps=4096):
    """Jitted ``(W1, b1, W2, b2) -> (loss, grads)`` with diffrax Tsit5 and ``adjoint``.

    The parameters go in through ``args``: BacksolveAdjoint differentiates
    only with respect to ``y0``, ``args`` and the terms, not closed-over arrays.
    """
    jnp = jax.numpy

    def vf(t, u, args):
        W1, b1, W2, b2 = args
        return W2 @ jnp.tanh(W1 @ u**3 + b1) + b2

    term = diffrax.ODETerm(vf)
    y0, ts, Y = jnp.asarray(S.U0), jnp.asarray(S.TS), jnp.asarray(y_true)

    def loss(args):
        sol = diffrax.diffeqsolve(
            term, diffrax.Tsit5(), S.TSPAN[0], S.TSPAN[1], None, y0, args=args,
            saveat=diffrax.SaveAt(ts=ts), adjoint=adjoint, max_steps=max_steps,
            stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol))
        return jnp.sum((sol.ys - Y) ** 2)

    return jax.jit(jax.value_and_grad(loss))


def _flat_jax(grads) -> np.ndarray:
    return np.concatenate([np.asarray(g).ravel() for g in grads])


def diffrax_impls(jax, jerr, p0, y_true, target_s):
    names = ["diffrax-recursive", "diffrax-backsolve"]
    diffrax, err = (None, jerr) if jax is None else H.optional_import("diffrax")
    if err is not None:
        return [H.Impl(n, error=err) for n in names]
    args = tuple(jax.numpy.asarray(a) for a in S.unflatten(p0))
    out = []
    for name, adj in zip(names, [diffrax.RecursiveCheckpointAdjoint(),
                                 diffrax.BacksolveAdjoint()], strict=True):
        vg = diffrax_loss_and_grad(jax, diffrax, y_true, adj, RTOL, ATOL)

        def fn(vg=vg):
            v, g = jax.block_until_ready(vg(args))
            return float(v), _flat_jax(g)

        out.append(H.GradWork(name, fn, target_s))
    return out


def torch_impls(threads, p0, y_true, target_s):
    names = ["torchdiffeq-odeint", "torchdiffeq-adjoint"]
    torch, err = H.optional_import("torch")
    if err is None:
        tde, err = H.optional_import("torchdiffeq")
    if err is not None:
        return [H.Impl(n, error=err) for n in names]
    torch.set_num_threads(threads)
    nn = torch.nn

    class Spiral(nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = nn.Linear(2, 50).double()
            self.l2 = nn.Linear(50, 2).double()

        def forward(self, t, u):
            return self.l2(torch.tanh(self.l1(u**3)))

    net = Spiral()
    with torch.no_grad():  # nn.Linear stores weight (out, in): our layout
        for dst, src in zip([net.l1.weight, net.l1.bias, net.l2.weight, net.l2.bias],
                            S.unflatten(p0), strict=True):
            dst.copy_(torch.from_numpy(np.array(src)))
    params = [net.l1.weight, net.l1.bias, net.l2.weight, net.l2.bias]
    y0 = torch.from_numpy(S.U0.copy())
    ts = torch.from_numpy(S.TS.copy())
    Y = torch.from_numpy(y_true.copy())
    out = []
    for name, odeint in zip(names, [tde.odeint, tde.odeint_adjoint], strict=True):

        def fn(odeint=odeint):
            net.zero_grad(set_to_none=True)
            pred = odeint(net, y0, ts, rtol=RTOL, atol=ATOL, method="dopri5")
            loss = ((pred - Y) ** 2).sum()
            loss.backward()
            return loss.item(), np.concatenate([q.grad.numpy().ravel() for q in params])

        out.append(H.GradWork(name, fn, target_s, max_units=20))
    return out


# --------------------------------------------------------------------------- reference


def reference_gradient(jax, p0, y_true):
    """(loss, gradient, how, cross-check lines) at rtol = atol = 1e-12.

    diffrax RecursiveCheckpointAdjoint when available (SciPy forward
    sensitivities otherwise), checked against SciPy forward sensitivities over
    all 252 coordinates and against central differences of the DOP853 loss on
    the largest gradient entry of each weight / bias block and a middling one.
    """
    lines = []
    v_fs, g_fs = S.forward_sensitivity_grad(p0, y_true)
    diffrax, err = (None, "jax unavailable") if jax is None else H.optional_import("diffrax")
    if err is None:
        t0 = time.perf_counter()
        vg = diffrax_loss_and_grad(jax, diffrax, y_true, diffrax.RecursiveCheckpointAdjoint(),
                                   S.TIGHT, S.TIGHT, max_steps=100_000)
        args = tuple(jax.numpy.asarray(a) for a in S.unflatten(p0))
        v, g = jax.block_until_ready(vg(args))
        v, g = float(v), _flat_jax(g)
        how = "diffrax Tsit5 + RecursiveCheckpointAdjoint at rtol = atol = 1e-12"
        lines.append(f"reference: {how} ({time.perf_counter() - t0:.1f} s); loss {v:.10g}")
        lines.append(f"  vs SciPy DOP853 forward sensitivities at 1e-12: loss {v_fs:.10g}, "
                     f"gradient rel. error {S.rel_err(g_fs, g):.2g}")
    else:
        v, g = v_fs, g_fs
        how = "SciPy DOP853 forward sensitivities at rtol = atol = 1e-12"
        lines.append(f"reference: {how} (diffrax: {err}); loss {v:.10g}")
    n1w, n1 = 100, 150  # block ends: W1 (100), b1 (50), W2 (100), b2 (2)
    coords = [int(np.argmax(np.abs(g[:n1w]))), n1w + int(np.argmax(np.abs(g[n1w:n1]))),
              n1 + int(np.argmax(np.abs(g[n1:250]))), 250, 251,
              int(np.argsort(np.abs(g[:n1w]))[n1w // 2])]  # a middling W1 entry
    fd = S.central_differences(p0, y_true, coords)
    rel = np.abs(fd - g[coords]) / np.maximum(np.abs(g[coords]), 1e-300)
    lines.append("  vs central differences (step 1e-4) of the DOP853 loss at 1e-12:")
    for i, a, b, r in zip(coords, g[coords], fd, rel, strict=True):
        lines.append(f"    theta[{i:3d}]  reference {a: .10e}  finite diff {b: .10e}  rel {r:.1e}")
    if max(S.rel_err(g_fs, g), float(rel.max())) > 1e-5:
        lines.append("  [WARNING: the reference gradient does not agree with its cross-checks]")
    return v, g, how, lines


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    """Parse the options, run every implementation, print (and write) the table."""
    args = H.make_parser(__doc__.splitlines()[0]).parse_args(argv)
    threads = max(1, args.threads)
    rounds, target_s = (2, 0.05) if args.quick else (7, 0.3)
    jax, jnote = setup_jax(threads)
    jerr = None if jax is not None else jnote

    y_true = S.true_trajectory()
    p0, init_note = initial_params()
    ref_v, ref_g, ref_how, ref_lines = reference_gradient(jax, p0, y_true)

    works = []
    ours, model_note = our_impls(p0, y_true, target_s)
    works += ours
    works += diffrax_impls(jax, jerr, p0, y_true, target_s)
    works += torch_impls(threads, p0, y_true, target_s)
    impls = [w.impl if isinstance(w, H.GradWork) else w for w in works]

    machine = H.machine_info(threads)
    print(f"spiral_grad: u0 = [2, 0], tspan (0, 1.5), 30 save points; model Dense(50 -> 2)"
          f"(tanh(Dense(2 -> 50)(u^3))), {S.N_PARAMS} params, float64; one loss (sum of squares)"
          f" + gradient, Tsit5 (torchdiffeq dopri5), rtol = atol = {RTOL:g}"
          f"{' [--quick]' if args.quick else ''}")
    print(f"machine: {machine['cpus']} cpus, {machine['cpu']}; threads {threads} "
          f"(torch.set_num_threads({threads}), jax {jnote}); {H.busy_note()}")
    print(f"initial parameters: {init_note}")
    if model_note:
        print(model_note)
    for line in ref_lines:
        print(line)
    print("grad_rel_err: |grad - reference| / |reference| (2-norm); loss at the start "
          "parameters; first call = compile / trace + one gradient")
    print()

    mon = H.OtherLoad().start()
    H.time_alternating(impls, rounds)
    load_note = H.OtherLoad.note(mon.stop(), "during the timing")

    rows = []
    for w in works:
        q = None
        if isinstance(w, H.GradWork) and w.result is not None:
            v, g = w.result
            q = {"loss": v, "grad_rel_err": S.rel_err(g, ref_g) if g.shape == ref_g.shape
                 else float("nan")}
        rows.append(H.result_row(w.impl if isinstance(w, H.GradWork) else w, "grad", q))

    ok_ours = [r for r in rows if r["impl"].startswith("ours") and r.get("median_s")]
    fastest = min(ok_ours, key=lambda r: r["median_s"])["impl"] if ok_ours else "ours"
    H.print_table(rows, ours=fastest)
    print(load_note)
    check_losses(rows, ref_v)
    if ok_ours:
        best = min(r["median_s"] for r in ok_ours)
        interp = next((r["median_s"] for r in ok_ours if r["impl"] == "ours-interp"), None)
        txt = (f"; ours-interp {H.fmt_time(interp)} = {interp / PUBLISHED_S:.2f}x"
               if interp else "")
        print(f"published SciMLSensitivity (InterpolatingAdjoint + compiled ReverseDiff vjp, "
              f"other machine): {H.fmt_time(PUBLISHED_S)}/grad; ours fastest ({fastest}) "
              f"{H.fmt_time(best)} = {best / PUBLISHED_S:.2f}x the published time{txt}")
    else:
        print(f"published SciMLSensitivity: {H.fmt_time(PUBLISHED_S)}/grad "
              "(none of ours ran, no comparison)")
    if args.json:
        H.write_json(args.json, "spiral_grad", machine, rows, ours=fastest)
        print(f"wrote {args.json}")
    return 0


def check_losses(rows, ref_v) -> None:
    """Warn when an implementation's loss is far from the reference's: not the same problem."""
    bad = [f"{r['impl']} {r['quality']['loss']:.8g}" for r in rows if r["quality"]
           and abs(r["quality"]["loss"] - ref_v) > LOSS_SPREAD_WARN * abs(ref_v)]
    if bad:
        print(f"WARNING: losses differ from the reference {ref_v:.8g} by more than "
              f"{LOSS_SPREAD_WARN:g} (relative): {', '.join(bad)}")


if __name__ == "__main__":
    raise SystemExit(main())
