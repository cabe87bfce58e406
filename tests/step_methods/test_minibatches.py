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
