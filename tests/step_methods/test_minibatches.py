"""The minibatches (step_methods/minibatches.py): census rows first with weight 1, the
others weighted (N - C) / n, the variance factors, resizing."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.step_methods.minibatches import Minibatches


@pytest.mark.parametrize("replace", [False, True])
def test_weights_census_and_variance_factor(small_logistic, replace):
    _, layer = small_logistic
    n_rows, census = layer.n_rows, np.array([3, 10, 42])
    batches = Minibatches(
        layer, 400, census, np.random.default_rng(0), replace=replace, reshuffle=not replace
    )
    pool = n_rows - len(census)
    assert batches.pool_size == pool
    np.testing.assert_array_equal(batches.weights[:3], 1.0)
    np.testing.assert_allclose(batches.weights[3:], pool / 400)
    for half in batches.half_weights:  # each half alone estimates the same sum
        np.testing.assert_allclose(half[3:].sum(), pool)
    expected = 1 / 400 if replace else 1 / 400 - 1 / pool
    assert batches.batch_factor(400) == pytest.approx(expected)
    indices = batches.draw_indices()
    assert len(indices) == 400 and not np.isin(indices, census).any()
    rows = batches.with_census(batches.draw())
    full = layer.take_rows(census)
    for column, census_column in zip(rows, full):
        assert len(column) == 403
        np.testing.assert_array_equal(column[:3], census_column)
    batches.resize(800)
    assert batches.size == 800 and len(batches.draw_indices()) == 800
    np.testing.assert_allclose(batches.weights[3:], pool / 800)
    batches.restore_default()
    assert batches.size == 400 and len(batches.weights) == 403


def test_a_measuring_call_reads_whole_minibatches_up_to_the_measure_rows(small_logistic):
    """With 10-row minibatches and ``measure_at_least(100)`` a measuring call reads the next
    10 minibatches (100 rows, census excluded, weighted (N - C) / 100, halves of 50 rows each
    estimating the whole sum), and the estimator's noise scale uses 100 rows; from 100 rows
    per minibatch on it reads the draw's own (the same draws as before). Mutations: the
    measuring weights of one minibatch, or ``measure_size`` left at the batch size."""
    _, layer = small_logistic
    census = np.array([3, 10, 42])
    pool = layer.n_rows - len(census)
    batches = Minibatches(
        layer, 10, census, np.random.default_rng(0), replace=False, reshuffle=True
    )
    batches.measure_at_least(100)
    assert batches.measure_batches == 10
    rows = batches.draw_measuring()
    assert all(len(column) == 100 for column in rows)
    weights, halves = batches.measure_weights
    np.testing.assert_array_equal(weights[:3], 1.0)
    np.testing.assert_allclose(weights[3:], pool / 100)
    for half in halves:
        assert len(half) == 53
        np.testing.assert_allclose(half[3:].sum(), pool)
    estimator = batches.estimator(None, None, 0, second_order=False, noise_measurement="split")
    assert estimator.measure_size == 100 and estimator.batch_size == 10
    batches.resize(200)
    assert batches.measure_batches == 1 and batches.measure_weights[0].shape == (203,)
    reference = Minibatches(
        layer, 200, census, np.random.default_rng(1), replace=False, reshuffle=True
    )
    again = Minibatches(layer, 200, census, np.random.default_rng(1), replace=False, reshuffle=True)
    again.measure_at_least(100)
    np.testing.assert_array_equal(again.draw_measuring()[0], reference.draw()[0])
