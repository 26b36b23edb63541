"""Learn the 2x2 matrix exponential with a 4-32-16-4 tanh network (SimpleChains' demo).

Run with ``make demo`` or ``python -m examples.matrix_exp_demo [--iters N]``.
Prints the train and test loss (sum of squares per sample) and the time per
iteration; the first call includes loading (or compiling) the kernels.
"""

import argparse
import time

import numpy as np
from scipy.linalg import expm

import nets
from nets import Chain, Dense


def make_data(n, seed):
    """X: n random normal 2x2 matrices flattened (float32); Y: their exponentials."""
    A = np.random.default_rng(seed).standard_normal((n, 2, 2))
    Y = np.stack([expm(a) for a in A])
    return A.reshape(n, 4).astype(np.float32), Y.reshape(n, 4).astype(np.float32)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=3000, help="full-batch Adam iterations")
    ap.add_argument("--n", type=int, default=10_000, help="training samples")
    args = ap.parse_args(argv)

    X, Y = make_data(args.n, seed=1)
    Xt, Yt = make_data(args.n, seed=2)
    chain = Chain(4, Dense(32, "tanh"), Dense(16, "tanh"), Dense(4))
    p = chain.init_params(seed=0, dtype=np.float32)
    print(f"{chain}: {chain.n_params} parameters, {args.n} samples")

    t0 = time.perf_counter()
    nets.train(chain, p, X, Y, optimizer=nets.Adam(1e-3), iters=1)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    hist = nets.train(chain, p, X, Y, optimizer=nets.Adam(1e-3), iters=args.iters,
                      progress=True)
    dt = time.perf_counter() - t0

    loss = nets.SquaredLoss()
    print(f"first call (load or compile kernels): {first:.2f} s")
    print(f"{args.iters} iterations in {dt:.2f} s: {dt / args.iters * 1e6:.0f} us/iter")
    print(f"train loss {hist[-1] / args.n:.5f}   test loss {loss(chain(Xt, p), Yt) / args.n:.5f}"
          "   (sum of squares per sample)")


if __name__ == "__main__":
    main()
