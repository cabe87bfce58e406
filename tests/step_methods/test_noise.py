"""The running means of the measured gradient noise (:mod:`pymc_bigdata.step_methods.noise`)."""

from __future__ import annotations

import numpy as np

from pymc_bigdata.step_methods.gradient_oracle import NoiseSample
from pymc_bigdata.step_methods.noise import NoiseAccumulator


def test_covariance_matrices_are_averaged_and_follow_the_anchor_as_the_variances_do():
    """Measurements that carry a covariance matrix average it beside the diagonal; after the
    anchor moves the old mean serves until ``MIN_FRESH`` new ones; a non-finite matrix is
    left out without losing its diagonal; without matrices there is none.

    Catches the matrix kept apart from the fresh/stale switch, or a NaN matrix averaged in."""
    accumulator = NoiseAccumulator(2)
    assert accumulator.covariance() is None
    accumulator.keep(NoiseSample(np.ones(2), None))
    assert accumulator.covariance() is None and accumulator.variance(1).tolist() == [1.0, 1.0]

    accumulator.restart()
    old = np.array([[1.0, 0.5], [0.5, 1.0]])
    for _ in range(3):
        accumulator.keep(NoiseSample(np.ones(2), None, old))
    accumulator.keep(NoiseSample(np.ones(2), None, np.full((2, 2), np.nan)))
    assert accumulator.variance(1).tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(accumulator.covariance(), old)

    accumulator.recentred()
    new = 2.0 * old
    for _ in range(NoiseAccumulator.MIN_FRESH - 1):
        accumulator.keep(NoiseSample(2.0 * np.ones(2), None, new))
    np.testing.assert_array_equal(accumulator.covariance(), old)
    accumulator.keep(NoiseSample(2.0 * np.ones(2), None, new))
    np.testing.assert_array_equal(accumulator.covariance(), new)
    assert accumulator.variance(1).tolist() == [2.0, 2.0]
