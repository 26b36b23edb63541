"""Benchmark 1, ``matrix_exp``: train a small MLP to learn the 2x2 matrix exponential.

Setup of the SimpleChains.jl blog post (2022): X = 10,000 random normal 2x2
matrices flattened to 4 features (float32), Y = their matrix exponentials
flattened; chain 4 -> 32 tanh -> 16 tanh -> 4 (nets' ``init_params``: PyTorch's
default, uniform in +-1/sqrt(fan_in), where the blog's SimpleChains drew Glorot-uniform
weights and zero biases; the same start for every impl); loss = sum of squared errors
over the batch; Adam(1e-3).

Full batch (default): rounds of 10,000 iterations, time per iteration.
``--batch-size B``: epochs over the seeded-shuffled training set in
minibatches of B (the last one partial), time per step.

Implementations, alternated round by round in one process: ``nets`` (ours),
PyTorch (nn.Sequential + torch.optim.Adam), JAX (jitted update step called
from Python, plus the whole training inside one jitted ``lax.fori_loop`` /
one jitted ``lax.scan`` per epoch in minibatch mode). All start from the same
initial weights and report the same loss, so their accuracies are comparable.

Run as ``python -m benchmarks.matrix_exp [--quick] [--json PATH]
[--batch-size B] [--threads N]``.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from benchmarks import _harness as H

N = 10_000
SIZES = (4, 32, 16, 4)  # layer widths; tanh on every hidden layer, identity output
N_PARAMS = sum(o * i + o for i, o in zip(SIZES[:-1], SIZES[1:], strict=True))  # 756
# Multiply-adds of the three matmuls per sample, x2 for flops; bias adds and
# tanh are left out, as in the usual count.
FWD_FLOPS_PER_SAMPLE = 2 * sum(i * o for i, o in zip(SIZES[:-1], SIZES[1:], strict=True))
TRAIN_SEED, TEST_SEED, INIT_SEED, SHUFFLE_SEED = 0, 1, 0, 0
LR = 1e-3
# Train losses further apart than this factor across impls mean one of them
# is not solving the same problem (after the same updates from the same start
# they should agree to a few percent; float32 rounding makes them drift apart slowly).
LOSS_SPREAD_WARN = 1.25


@dataclass
class Config:
    """What one run does (from the command line)."""

    threads: int
    batch_size: int | None  # None: full batch
    iters: int  # full batch: iterations per round
    epochs: int  # minibatch: epochs per round
    rounds: int
    perms: np.ndarray  # (epochs, N) shuffles shared by the peers, the same every round

    @property
    def steps_per_round(self) -> int:
        """Units of work in one round: iterations or minibatch updates."""
        if self.batch_size is None:
            return self.iters
        return self.epochs * math.ceil(N / self.batch_size)

    @property
    def flops_per_unit(self) -> float:
        """Forward + backward (2x forward) flops of one update."""
        rows = N if self.batch_size is None else self.batch_size
        return 3 * FWD_FLOPS_PER_SAMPLE * rows


# --------------------------------------------------------------------------- data, weights


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Random 2x2 matrices and their exponentials, each flattened row-major.

    Row-major on both sides gives the same map as Julia's column-major
    reshape/vec, since expm(A.T) = expm(A).T.
    """
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 4)).astype(np.float32)
    # expm in float64 from the float32 inputs: the targets are exact to float32.
    y = scipy.linalg.expm(x.astype(np.float64).reshape(n, 2, 2)).reshape(n, 4)
    return x, y.astype(np.float32)


def initial_params(seed: int) -> np.ndarray:
    """Flat float32 parameters as ``Chain.init_params(seed, float32)`` draws them, in our
    layout (per layer W (out, in) row-major, then b (out,)).

    Used for the peers only when ``nets`` cannot provide its own initial
    parameters, so that the peers still run.
    """
    return H.dense_init(SIZES, seed).astype(np.float32)


def unflatten(p: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Split a flat parameter vector into [(W (out, in), b (out,)), ...]."""
    out, k = [], 0
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:], strict=True):
        w = p[k : k + fan_out * fan_in].reshape(fan_out, fan_in)
        k += fan_out * fan_in
        out.append((w, p[k : k + fan_out]))
        k += fan_out
    assert k == p.size, (k, p.size)
    return out


def reference_forward(p: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Float64 NumPy forward pass, the ground truth for the layout check."""
    h = x.astype(np.float64)
    layers = unflatten(p.astype(np.float64))
    for i, (w, b) in enumerate(layers):
        h = h @ w.T + b
        if i < len(layers) - 1:
            h = np.tanh(h)
    return h


def mean_sse(yhat, y: np.ndarray) -> float:
    """Sum of squared errors / N, in float64: the same figure for every impl."""
    d = np.asarray(yhat, dtype=np.float64) - y
    return float((d * d).sum() / len(y))


# --------------------------------------------------------------------------- implementations
#
# Each builder returns [(Impl, predict)], predict(x) giving the trained model's
# outputs after the last round (for the losses).


def nets_impls(cfg: Config, X, Y, Xtest):
    """Ours, through the public API: Chain / init_params / Adam / train."""
    nets, err = H.optional_import("nets")
    if err:
        return [(H.Impl("nets", error=err), None)], None, None
    try:
        chain = nets.Chain(4, nets.Dense(32, "tanh"), nets.Dense(16, "tanh"), nets.Dense(4))
        p0 = np.asarray(chain.init_params(seed=INIT_SEED, dtype=np.float32))
        loss = nets.SquaredLoss()
    except Exception as e:  # nets arriving in parallel: report the row, run the peers
        return [(H.Impl("nets", error=H.error_text(e)), None)], None, None

    state = {}
    if cfg.batch_size is None:
        kw = dict(iters=cfg.iters)
        warm_kw = dict(iters=1)
    else:
        kw = dict(epochs=cfg.epochs, batch_size=cfg.batch_size, seed=SHUFFLE_SEED)
        warm_kw = dict(kw, epochs=1)

    def train(**k):
        return nets.train(
            chain, state["p"], X, Y, loss=loss, optimizer=state["opt"], threads=cfg.threads, **k
        )

    def setup():
        # Fresh parameters and optimizer state: every round does the same work.
        state["p"] = p0.copy()
        state["opt"] = nets.Adam(LR)

    def warmup():
        setup()
        train(**warm_kw)
        chain(Xtest, state["p"])  # the forward pass compiles separately

    def run():
        state["hist"] = train(**kw)

    def predict(x):
        # nets.train returns one loss per iteration, or per epoch with minibatches.
        hist, want = state.pop("hist", None), (cfg.iters if cfg.batch_size is None else cfg.epochs)
        if hist is not None and len(hist) != want:
            print(f"WARNING: nets.train returned {len(hist)} losses, expected {want}")
        return chain(x, state["p"])

    impl = H.Impl("nets", run=run, units=cfg.steps_per_round, warmup=warmup, setup=setup)
    return [(impl, predict)], p0, lambda x: chain(x, p0)


def torch_impls(cfg: Config, p0, X, Y):
    """PyTorch: nn.Sequential + torch.optim.Adam, eager mode, float32."""
    torch, err = H.optional_import("torch")
    if err:
        return [(H.Impl("torch", error=err), None)]
    torch.set_num_threads(cfg.threads)
    nn = torch.nn
    Xt, Yt = torch.from_numpy(X), torch.from_numpy(Y)
    perms = [torch.from_numpy(p) for p in cfg.perms]
    state = {}

    def setup():
        model = nn.Sequential(
            nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 4)
        )
        # Our flat layout is torch's Linear weight (out, in) / bias order.
        with torch.no_grad():
            lins = [m for m in model if isinstance(m, nn.Linear)]
            for lin, (w, b) in zip(lins, unflatten(p0), strict=True):
                lin.weight.copy_(torch.from_numpy(w))
                lin.bias.copy_(torch.from_numpy(b))
        state["model"] = model
        state["opt"] = torch.optim.Adam(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8)

    def step(x, y):
        opt = state["opt"]
        opt.zero_grad(set_to_none=True)
        loss = ((state["model"](x) - y) ** 2).sum()
        loss.backward()
        opt.step()

    def train(epochs):
        if cfg.batch_size is None:
            for _ in range(cfg.iters):
                step(Xt, Yt)
            return
        B = cfg.batch_size
        for perm in perms[:epochs]:
            for s in range(0, N, B):
                idx = perm[s : s + B]
                step(Xt[idx], Yt[idx])

    def warmup():
        setup()
        if cfg.batch_size is None:
            step(Xt, Yt)
        else:
            train(1)

    def predict(x):
        with torch.no_grad():
            return state["model"](torch.from_numpy(x)).numpy()

    impl = H.Impl(
        "torch",
        run=lambda: train(cfg.epochs),
        units=cfg.steps_per_round,
        warmup=warmup,
        setup=setup,
    )
    return [(impl, predict)]


def _hand_adam(jax, lr, b1=0.9, b2=0.999, eps=1e-8):
    """Adam for JAX pytrees with optax's (init, update) interface, used without optax."""
    jnp, tm = jax.numpy, jax.tree_util.tree_map

    def init(params):
        zeros = tm(jnp.zeros_like, params)
        return (jnp.zeros((), jnp.int32), zeros, zeros)

    def update(g, state, params=None):
        t, m, v = state
        t = t + 1
        m = tm(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = tm(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        c1, c2 = 1 - b1 ** t.astype(jnp.float32), 1 - b2 ** t.astype(jnp.float32)
        upd = tm(lambda m, v: -lr * (m / c1) / (jnp.sqrt(v / c2) + eps), m, v)
        return upd, (t, m, v)

    return init, update


def jax_impls(cfg: Config, p0, X, Y):
    """JAX: jitted update step from Python, and the whole loop under one jit."""
    full = cfg.batch_size is None
    names = ("jax", "jax-fori" if full else "jax-scan")
    jax, err = H.optional_import("jax")
    if err:
        return [(H.Impl(n, error=err), None) for n in names]
    jnp, lax = jax.numpy, jax.lax
    optax, _ = H.optional_import("optax")
    if optax is not None:
        tx = optax.adam(LR, b1=0.9, b2=0.999, eps=1e-8)
        tx_init, tx_update = tx.init, tx.update
    else:
        tx_init, tx_update = _hand_adam(jax, LR)

    params0 = [(jnp.asarray(w), jnp.asarray(b)) for w, b in unflatten(p0)]
    Xd, Yd = jax.device_put(X), jax.device_put(Y)
    perms_d = [jax.device_put(p.astype(np.int32)) for p in cfg.perms]

    def forward(params, x):
        for i, (w, b) in enumerate(params):
            x = x @ w.T + b
            if i < len(params) - 1:
                x = jnp.tanh(x)
        return x

    def loss_fn(params, x, y):
        return jnp.sum((forward(params, x) - y) ** 2)

    def update(params, opt_state, x, y):
        g = jax.grad(loss_fn)(params, x, y)
        upd, opt_state = tx_update(g, opt_state, params)
        return jax.tree_util.tree_map(jnp.add, params, upd), opt_state

    step = jax.jit(update)

    @jax.jit
    def train_fori(params, opt_state, x, y, n):
        # n is traced, so the warm-up with n = 1 compiles the executable the rounds use.
        return lax.fori_loop(0, n, lambda _, c: update(*c, x, y), (params, opt_state))

    B = cfg.batch_size or N
    nb, rem = divmod(N, B)

    @functools.partial(jax.jit, static_argnames="size")
    def mb_step(params, opt_state, x, y, perm, start, size):
        # Gather the minibatch on device: only the offset crosses from Python.
        idx = lax.dynamic_slice(perm, (start,), (size,))
        return update(params, opt_state, x[idx], y[idx])

    @jax.jit
    def epoch_scan(params, opt_state, x, y, perm):
        xp, yp = x[perm], y[perm]  # pre-shuffled batches
        xb = xp[: nb * B].reshape(nb, B, -1)
        yb = yp[: nb * B].reshape(nb, B, -1)
        c, _ = lax.scan(lambda c, b: (update(*c, *b), None), (params, opt_state), (xb, yb))
        if rem:  # the last, partial minibatch, as the other impls do
            c = update(*c, xp[nb * B :], yp[nb * B :])
        return c

    # n: iterations (full batch) or epochs (minibatch); start from (params, opt_state).
    def run_loop(n, p, s):
        if full:
            for _ in range(n):
                p, s = step(p, s, Xd, Yd)
        else:
            for perm in perms_d[:n]:
                for st in range(0, N, B):
                    p, s = mb_step(p, s, Xd, Yd, perm, st, size=min(B, N - st))
        return jax.block_until_ready((p, s))

    def run_fused(n, p, s):
        if full:
            p, s = train_fori(p, s, Xd, Yd, n)
        else:
            for perm in perms_d[:n]:
                p, s = epoch_scan(p, s, Xd, Yd, perm)
        return jax.block_until_ready((p, s))

    def fresh():
        return jax.block_until_ready((params0, tx_init(params0)))

    predict_fn = jax.jit(forward)
    n_round = cfg.iters if full else cfg.epochs
    impls = []
    for name, fn in zip(names, (run_loop, run_fused), strict=True):
        state = {}

        def setup(state=state):
            state["p"], state["s"] = fresh()

        def run(fn=fn, state=state):
            state["p"], state["s"] = fn(n_round, state["p"], state["s"])

        def warmup(fn=fn):
            fn(1, *fresh())  # compiles; one iteration / one epoch
            jax.block_until_ready(predict_fn(params0, Xd))

        def predict(x, state=state):
            return np.asarray(predict_fn(state["p"], jnp.asarray(x)))

        impl = H.Impl(name, run=run, units=cfg.steps_per_round, warmup=warmup, setup=setup)
        impls.append((impl, predict))
    return impls


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    """Parse the options, run every implementation, print (and write) the table."""
    parser = H.make_parser(__doc__.splitlines()[0], avx2=True)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        metavar="B",
        help="minibatch mode: epochs over the shuffled training set in minibatches of B",
    )
    args = parser.parse_args(argv)
    if args.avx2 and not H.AVX2_ONLY:
        return H.rerun_as_avx2("benchmarks.matrix_exp", argv)
    cpus = H.available_cpus()
    threads = max(1, args.threads)
    # XLA reads its flags once, at backend start: set them before jax is imported.
    # XLA CPU has no exact thread count option; fewer threads than cores means
    # Eigen's pool off (1 thread) or intra_op_parallelism_threads (best effort).
    jax_threads = "XLA default (all cores)"
    if threads < cpus:
        flag = (
            "--xla_cpu_multi_thread_eigen=false"
            if threads == 1
            else f"intra_op_parallelism_threads={threads}"
        )
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
        jax_threads = f"XLA_FLAGS {flag} (best effort)"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # no probing for accelerators

    full = args.batch_size is None
    if full:
        iters, epochs, rounds = (300, 0, 2) if args.quick else (10_000, 0, 3)
    else:
        iters, epochs, rounds = (0, 1, 2) if args.quick else (0, 3, 5)
    # One permutation per epoch from default_rng(seed), as nets.train draws them, so
    # every impl sees the same minibatches (the peers reuse them every round).
    rng = np.random.default_rng(SHUFFLE_SEED)
    perms = np.stack([rng.permutation(N) for _ in range(epochs)]) if epochs else np.zeros((0, N))
    cfg = Config(threads, args.batch_size, iters, epochs, rounds, perms.astype(np.int64))

    X, Y = make_data(N, TRAIN_SEED)
    Xtest, Ytest = make_data(N, TEST_SEED)

    built, p0, nets_forward0 = nets_impls(cfg, X, Y, Xtest)
    init_note = f"nets Chain.init_params(seed={INIT_SEED}), copied into every peer"
    if p0 is None:
        p0 = initial_params(INIT_SEED)
        init_note = "own draw of init_params' scheme (nets unavailable), copied into every peer"
    else:
        init_note += check_nets_init(p0)
    built += torch_impls(cfg, p0, X, Y)
    built += jax_impls(cfg, p0, X, Y)

    machine = H.machine_info(threads)
    unit = "iter" if full else "step"
    work = (
        f"full batch N={N}, {iters} iterations x {rounds} rounds"
        if full
        else f"minibatch B={args.batch_size} (seeded shuffle, last batch partial), "
        f"{epochs} epoch(s) = {cfg.steps_per_round} steps x {rounds} rounds"
    )
    rows_per_unit = N if full else args.batch_size
    print(
        f"matrix_exp: {SIZES[0]} -> 32 tanh -> 16 tanh -> 4, float32, Adam({LR}), "
        f"loss = sum of squared errors; {work}{' [--quick]' if args.quick else ''}"
    )
    print(
        f"machine: {machine['cpus']} cpus, {machine['cpu']}; threads {threads} for every impl "
        f"(nets threads={threads}, torch.set_num_threads({threads}), jax {jax_threads}); "
        f"{H.busy_note()}"
    )
    print(
        f"flops per {unit}: forward 2*{rows_per_unit}*{FWD_FLOPS_PER_SAMPLE // 2} = "
        f"{FWD_FLOPS_PER_SAMPLE * rows_per_unit / 1e6:.3g} MFLOP, + backward 2x = "
        f"{cfg.flops_per_unit / 1e6:.3g} MFLOP (bias adds, tanh not counted)"
    )
    print(
        f"initial weights: {init_note}; loss before training (train) "
        f"{mean_sse(reference_forward(p0, X), Y):.4g}"
    )
    print(
        "train_loss / test_loss: sum of squared errors / N (N = 10,000 each), after the "
        "last round; first call = compile/cache load + " + ("1 iteration" if full else "1 epoch")
    )
    print()

    impls = [impl for impl, _ in built]
    load_note = H.time_measured(impls, rounds, threads, machine)

    rows = []
    for impl, predict in built:
        quality = None
        if impl.error is None and impl.times:
            try:
                quality = {
                    "train_loss": mean_sse(predict(X), Y),
                    "test_loss": mean_sse(predict(Xtest), Ytest),
                }
            except Exception as e:  # a failing predict is the impl's error, shown in its row
                impl.error = H.error_text(e)
        rows.append(H.result_row(impl, unit, quality))

    def gflops(r):
        return f"{cfg.flops_per_unit / r['median_s'] / 1e9:.3g}"

    H.print_table(rows, extra={"GFLOP/s": gflops})
    print(load_note)
    check_losses(rows)
    if nets_forward0 is not None and rows[0]["impl"] == "nets" and not rows[0].get("error"):
        # After the timing, so that the forward pass compiles inside first_call_s.
        err = float(np.abs(nets_forward0(X[:256]) - reference_forward(p0, X[:256])).max())
        if not err < 1e-4:
            print(
                f"WARNING: nets chain(x, p0) differs from the (out, in) row-major layout "
                f"the peers use by {err:.3g}"
            )
    if args.json:
        H.write_json(args.json, "matrix_exp", machine, rows)
        print(f"wrote {args.json}")
    return 0


def check_nets_init(p0: np.ndarray) -> str:
    """Check nets' initial parameters against the draw and layout the peers assume.

    Returns a note for the header; a mismatch is a bug in nets (or in this
    contract) that would make the peers train a different network.
    """
    if p0.shape != (N_PARAMS,) or p0.dtype != np.float32:
        return f" [WARNING: init_params gave {p0.dtype}{p0.shape}, expected float32({N_PARAMS},)]"
    if not np.array_equal(p0, initial_params(INIT_SEED)):
        return " [WARNING: init_params differs from PyTorch's default draw (H.dense_init)]"
    return ""


def check_losses(rows) -> None:
    """Warn when the impls did not reach comparable losses (not the same problem solved)."""
    losses = {r["impl"]: r["quality"]["train_loss"] for r in rows if r["quality"]}
    if len(losses) > 1 and max(losses.values()) > LOSS_SPREAD_WARN * min(losses.values()):
        txt = ", ".join(f"{k} {v:.4g}" for k, v in losses.items())
        print(f"WARNING: train losses differ by more than {LOSS_SPREAD_WARN}x: {txt}")


if __name__ == "__main__":
    raise SystemExit(main())
