"""The equal-accuracy read-off of `benchmarks.stiff_scaling` (`at_error`)."""

import pytest

from benchmarks.stiff_scaling import at_error


def test_a_power_law_sweep_is_read_off_exactly():
    # time = 2e-3 * error^-0.25: exact in log-log, in any order of the sweep
    sweep = [(e, 2e-3 * e ** -0.25) for e in (1e-4, 1e-6, 1e-8, 1e-5)]
    assert at_error(sweep, 3e-7) == pytest.approx(2e-3 * 3e-7 ** -0.25, rel=1e-12)
    assert at_error(sweep, 1e-6) == pytest.approx(2e-3 * 1e-6 ** -0.25, rel=1e-12)


def test_an_error_outside_the_sweep_is_not_read_off():
    sweep = [(1e-6, 0.5), (1e-7, 0.8)]
    assert at_error(sweep, 1e-5) is None and at_error(sweep, 1e-9) is None
