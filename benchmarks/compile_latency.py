"""Benchmark 5, ``compile_latency``: time to the first gradient in a fresh process.

Each case runs in a new Python process, twice: once with an empty numba cache
(``NUMBA_CACHE_DIR`` and ``SCIML_CACHE_DIR`` pointing at a new folder: every
kernel compiles) and once more with that folder now warm (kernels load from
disk). The time includes the imports. Cases:

- ``nets``: ``nets.loss_and_grad`` of the 4-32-16-4 matrix-exponential chain
  on 100 samples, float32 (the kernels ``train`` uses are the same ones);
- ``ude_solve``: build the Lotka-Volterra UDE of BENCHMARKS.md item 3
  (2 -> 5 rbf -> 5 rbf -> 5 rbf -> 2) and solve it with Tsit5 on (0, 3);
- ``ude_grad``: the same model, its first loss + gradient (31 observations,
  `sciml.loss_and_grad` with its default method, and with the discrete and
  interpolating adjoints).

Run as ``python -m benchmarks.compile_latency [--json PATH]``.
"""

import subprocess
import sys
import tempfile
import time

from benchmarks import _harness as H

CASES = {
    "nets": """
import numpy as np
import nets
chain = nets.Chain(4, nets.Dense(32, "tanh"), nets.Dense(16, "tanh"), nets.Dense(4))
p = chain.init_params(seed=0, dtype=np.float32)
X = np.ones((100, 4), np.float32)
nets.loss_and_grad(chain, p, X, X)
""",
    "ude_solve": """
import numpy as np
import sciml
from nets import Chain, Dense
U = Chain(2, Dense(5, "rbf"), Dense(5, "rbf"), Dense(5, "rbf"), Dense(2))
def f(u, p, t, nets):
    x, y = u
    z = nets.U(u)
    return [p.alpha * x + z[0], -p.delta * y + z[1]]
model = sciml.Model(f, states=["x", "y"], params=["alpha", "delta"], nets={"U": U})
theta = model.init_params(seed=0, alpha=1.3, delta=1.8)
prob = sciml.ODEProblem(model, [0.44249296, 4.6280594], (0.0, 3.0), theta)
sciml.solve(prob, sciml.Tsit5(), saveat=np.linspace(0, 3, 31))
""",
}
CASES["ude_grad"] = CASES["ude_solve"].replace("sciml.solve(prob, sciml.Tsit5(), saveat=",
                                               "t = (") + """
import adjoints
data = sciml.Data(t, np.ones((31, 2)))
for alg in (None, adjoints.DiscreteAdjoint(), adjoints.InterpolatingAdjoint()):
    sciml.loss_and_grad(prob, data, sensealg=alg)
"""


def first_gradient_seconds(code, cache):
    env = dict(__import__("os").environ, NUMBA_CACHE_DIR=cache, SCIML_CACHE_DIR=cache)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - t0


def main(argv=None):
    args = H.make_parser(__doc__.splitlines()[0]).parse_args(argv)
    rows = []
    print(f"{'case':10s} {'cold cache':>11s} {'warm cache':>11s}  (fresh process, with imports)")
    for name, code in CASES.items():
        with tempfile.TemporaryDirectory() as cache:
            cold = first_gradient_seconds(code, cache)
            warm = min(first_gradient_seconds(code, cache) for _ in range(3))
        print(f"{name:10s} {cold:10.2f}s {warm:10.2f}s")
        rows.append({"impl": name, "unit": "first gradient", "median_s": warm, "min_s": warm,
                     "max_s": warm, "first_call_s": cold, "quality": {}})
    if args.json:
        import json

        with open(args.json, "w") as fh:
            json.dump({"bench": "compile_latency", "machine": H.machine_info(args.threads),
                       "results": rows, "ratios": {}}, fh, indent=2)


if __name__ == "__main__":
    main()
