"""The backward solve's schedule (`adjoints.kernels.backward.backward_schedule`) against a
plain NumPy construction from its definition."""

import numpy as np
import pytest

from adjoints.kernels.backward import backward_schedule


def _reference(fstops, obs_t):
    times = np.unique(np.concatenate((fstops, obs_t)))
    times = times[(times >= fstops[0]) & (times <= fstops[-1])]
    m = times.shape[0] - 1
    jump = np.full(m + 1, -1)
    for q, t in enumerate(obs_t):
        jump[m - np.searchsorted(times, t)] = q
    nseg = fstops.shape[0] - 1
    fseg = [min(max(np.searchsorted(fstops, times[m - k - 1], side="right") - 1, 0), nseg - 1)
            for k in range(m)]
    return -times[::-1], jump, np.array(fseg, dtype=np.int64)


CASES = {
    "one segment": ([0.0, 10.0], [1.0, 2.5, 10.0]),
    "observation on stops": ([0.0, 2.0, 5.0, 10.0], [0.0, 2.0, 3.0, 5.0, 7.5]),
    "observations only inside": ([0.0, 1.0, 4.0], [0.5, 0.75, 3.0]),
    "no observations": ([0.0, 3.0, 6.0], []),
    "times past the span dropped": ([1.0, 4.0], [0.5, 2.0, 4.0, 9.0]),
}


@pytest.mark.parametrize("fstops, obs_t", CASES.values(), ids=CASES.keys())
def test_schedule_matches_its_definition(fstops, obs_t):
    fstops, obs_t = np.array(fstops), np.array(obs_t, dtype=float)
    got = backward_schedule(fstops, obs_t)
    for g, want in zip(got, _reference(fstops, obs_t)):
        np.testing.assert_array_equal(g, want)


def test_schedule_of_random_sorted_times():
    rng = np.random.default_rng(3)
    for _ in range(20):
        fstops = np.unique(np.round(rng.uniform(0, 10, rng.integers(2, 8)), 1))
        if fstops.shape[0] < 2:
            continue
        obs_t = np.unique(np.round(rng.uniform(-1, 11, rng.integers(0, 12)), 1))
        got = backward_schedule(fstops, obs_t)
        for g, want in zip(got, _reference(fstops, obs_t)):
            np.testing.assert_array_equal(g, want)
