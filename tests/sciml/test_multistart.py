"""`sciml.fit_multistart`: the same fits as a loop over `sciml.fit`, resume, Dask, errors.

The problem is a small Lotka-Volterra UDE (one mechanistic rate and a
2-4-2 network), fitted for a few iterations per start: what is tested is the
bookkeeping around `sciml.fit`, not the fits. Two tests start a real
`dask.distributed.LocalCluster` of 2 worker processes (marker ``cluster``):
one checks that its fits equal the threaded ones bit for bit, one kills a
worker mid-run and checks that every start is still there exactly once.
"""

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import nets
import sciml
from nets import Chain, Dense
from sciml import multistart

T_OBS = np.linspace(0.0, 2.0, 11)
N_STARTS = 6


def lv_ude(u, p, t, nets):
    x, y = u
    z = nets.U([x / 2.0, y / 5.0])
    return [p.alpha * x + z[0], -1.8 * y + z[1]]


def lv_true(u, p, t, nets):
    x, y = u
    return [1.3 * x - 0.9 * x * y, 0.8 * x * y - 1.8 * y]


def optimizers():
    return [nets.Adam(0.05, iters=4), sciml.LBFGS(iters=6)]


@pytest.fixture(scope="module")
def setup():
    truth = sciml.Model(lv_true, states=["x", "y"], params=[])
    y = sciml.solve(sciml.ODEProblem(truth, [0.44, 4.63], (0.0, 2.0), np.zeros(0)),
                    rtol=1e-9, atol=1e-9, saveat=T_OBS).u
    model = sciml.Model(lv_ude, states=["x", "y"], params=["alpha"],
                        nets={"U": Chain(2, Dense(4, "tanh"), Dense(2))})
    prob = sciml.ODEProblem(model, [0.44, 4.63], (0.0, 2.0), model.init_params(alpha=1.3))
    return prob, sciml.Data(t=T_OBS, y=y)


def same(a, b):
    """Two MultistartResults hold the same fits, bit for bit, in the same order."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.index == y.index
        assert x.status == y.status == "ok"
        np.testing.assert_array_equal(x.x0, y.x0)
        np.testing.assert_array_equal(x.params, y.params)
        np.testing.assert_array_equal(x.history, y.history)
        assert x.loss == y.loss and x.n_evals == y.n_evals and x.stopped == y.stopped


def test_threads_equal_a_loop_over_fit(setup):
    prob, data = setup
    res = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=3, progress=False,
                               optimizers=optimizers(), workers=2)
    X = multistart.draw_starts(prob, N_STARTS, seed=3)
    loop = [sciml.fit(prob, data, params=X[k], optimizers=optimizers(), progress=False)
            for k in range(N_STARTS)]
    assert len(res) == N_STARTS and sorted(res.indices) == list(range(N_STARTS))
    for f in res:
        r = loop[f.index]
        np.testing.assert_array_equal(f.x0, X[f.index])
        np.testing.assert_array_equal(f.params, r.params)
        np.testing.assert_array_equal(f.history, r.history)
        assert f.loss == r.loss and f.n_iters == r.n_iters and f.time_s > 0
    assert list(res.losses) == sorted(r.objective for r in loop)
    assert res.best is res[0] and res.params.shape == (N_STARTS, prob.model.n_params)
    assert 1 <= res.n_best() <= N_STARTS and res.n_failed == 0


def test_starts_from_the_seed_alone(setup):
    prob, _ = setup
    a = multistart.draw_starts(prob, 8, seed=1)
    np.testing.assert_array_equal(a[:3], multistart.draw_starts(prob, 3, seed=1))
    assert not np.array_equal(a, multistart.draw_starts(prob, 8, seed=2))
    alpha = a[:, prob.model.param_slices["alpha"].start]
    assert np.all(alpha > 0) and len(set(alpha)) == 8  # log-normal around 1.3
    b = multistart.draw_starts(prob, 5, seed=0, bounds=(-1.0, 2.0))
    assert b.min() >= -1.0 and b.max() <= 2.0


def test_resume_skips_completed_starts(setup, tmp_path, monkeypatch):
    prob, data = setup
    calls = []
    run = multistart.FitTask.__call__

    def counting(task, k, x0):
        calls.append(k)
        return run(task, k, x0)

    monkeypatch.setattr(multistart.FitTask, "__call__", counting)
    opts = dict(optimizers=optimizers(), progress=False, results=tmp_path / "ms")
    X = multistart.draw_starts(prob, N_STARTS, seed=0)
    first = sciml.fit_multistart(prob, data, starts=X[:4], **opts)
    assert sorted(calls) == [0, 1, 2, 3] and first.n_resumed == 0
    assert sorted(os.listdir(tmp_path / "ms")) == [f"start_{k:05d}.npz" for k in range(4)]
    calls.clear()
    full = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=0, **opts)
    assert sorted(calls) == [4, 5] and full.n_resumed == 4 and len(full) == N_STARTS
    calls.clear()
    again = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=0, **opts)
    assert calls == [] and again.n_resumed == N_STARTS
    same(again, full)
    fresh = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=0, optimizers=optimizers(),
                                 progress=False)
    same(full, fresh)  # resumed = run in one go
    with pytest.raises(ValueError, match="another start point"):
        sciml.fit_multistart(prob, data, starts=N_STARTS, seed=1, **opts)


def test_a_failing_start_is_recorded(setup):
    prob, data = setup

    def penalty(theta):
        if theta[0] > 1.3:  # the starts with alpha above its centre
            raise RuntimeError("boom")
        return 0.0, np.zeros_like(theta)

    res = sciml.fit_multistart(prob, data, starts=4, seed=0, optimizers=optimizers(),
                               progress=False, penalty=penalty)
    failed = [f for f in res if f.status == "failed"]
    assert failed and res.n_failed == len(failed) and "RuntimeError: boom" in failed[0].message
    assert all(f.objective == np.inf for f in res.fits[-len(failed):])


def test_waterfall(setup, tmp_path):
    prob, data = setup
    res = sciml.fit_multistart(prob, data, starts=4, seed=0, optimizers=optimizers(),
                               progress=False)
    fig = res.waterfall(path=tmp_path / "w.png")
    assert (tmp_path / "w.png").stat().st_size > 0
    assert fig.axes[0].get_xlabel().startswith("start")


def test_models_and_problems_pickle(setup):
    prob, data = setup
    p2 = pickle.loads(pickle.dumps(prob))
    assert p2.model is not prob.model and p2.model.n_params == prob.model.n_params
    a = sciml.loss_and_grad(prob, data)
    b = sciml.loss_and_grad(p2, data)
    assert a[0] == b[0] and np.array_equal(a[1], b[1])


def test_bad_arguments(setup, tmp_path, monkeypatch):
    prob, data = setup
    ms = sciml.fit_multistart
    with pytest.raises(ValueError, match="`starts`"):
        ms(prob, data, starts=0)
    with pytest.raises(ValueError, match=r"`starts`.*\(n_starts, 23\)"):
        ms(prob, data, starts=np.zeros((3, 5)))
    with pytest.raises(ValueError, match="`seed`"):
        ms(prob, data, starts=2, seed=-1)
    with pytest.raises(ValueError, match="`client`"):
        ms(prob, data, starts=2, client="cluster")
    with pytest.raises(TypeError, match="`client`"):
        ms(prob, data, starts=2, client=object())
    with pytest.raises(TypeError, match="unknown option `optimiser`"):
        ms(prob, data, starts=2, optimiser=None)
    with pytest.raises(TypeError, match="custom objective"):
        ms(prob, data, starts=2, objective=lambda x: (0.0, x))
    with pytest.raises(ValueError, match="`bounds`"):
        ms(prob, data, starts=2, bounds=(1.0, 0.0))
    with pytest.raises(ValueError, match="`spread`"):
        ms(prob, data, starts=2, spread=-1.0)
    with pytest.raises(ValueError, match="`workers`"):
        ms(prob, data, starts=2, workers=0)
    with pytest.raises(ValueError, match="`data_or_list`"):
        ms(prob, [data, data], starts=2)
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="`results`"):
        ms(prob, data, starts=2, results=tmp_path / "file")
    monkeypatch.setitem(sys.modules, "distributed", None)  # as if Dask were not installed
    with pytest.raises(ImportError, match=r'pip install "dask\[distributed\]"'):
        ms(prob, data, starts=2, client="local")


def test_import_sciml_does_not_import_dask():
    code = ("import sys, sciml; "
            "print(sorted(m for m in ('dask', 'distributed') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# ----------------------------------------------------------------------------- Dask


class DieOnce:
    """A fit callback that kills its worker process the first time any start reaches
    iteration 3 (the marker file, created atomically, says it happened)."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __call__(self, iteration, params, loss):
        if iteration == 3 and os.getpid() != self.parent:
            try:
                fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return None
            os.close(fd)
            os._exit(1)
        return None


@pytest.mark.cluster
def test_local_cluster_equals_threads(setup, tmp_path):
    pytest.importorskip("distributed")
    prob, data = setup
    threads = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=5, progress=False,
                                   optimizers=optimizers())
    cluster = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=5, progress=False,
                                   optimizers=optimizers(), client="local", workers=2,
                                   results=tmp_path / "ms")
    same(threads, cluster)
    assert len(os.listdir(tmp_path / "ms")) == N_STARTS


@pytest.mark.cluster
def test_a_worker_dies_mid_run(setup, tmp_path):
    distributed = pytest.importorskip("distributed")
    prob, data = setup
    # threads first: the engine compiled here is on disk before the workers start (cold,
    # each worker process would compile it again, and the restarted one a third time)
    threads = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=5, progress=False,
                                   optimizers=optimizers())
    marker = tmp_path / "died"
    die = DieOnce(marker)
    die.parent = os.getpid()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None, env=dict(multistart.WORKER_ENV),
                                  silence_logs=50) as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        res = sciml.fit_multistart(prob, data, starts=N_STARTS, seed=5, progress=False,
                                   optimizers=optimizers(), client=client, callback=die,
                                   results=tmp_path / "ms")
    assert marker.exists()  # a worker did die
    assert sorted(res.indices) == list(range(N_STARTS))  # every start, once
    assert sorted(os.listdir(tmp_path / "ms")) == [f"start_{k:05d}.npz" for k in range(N_STARTS)]
    assert res.n_failed == 0
    same(threads, res)
