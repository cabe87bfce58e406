"""Per-draw batch sizes from the locally measured gradient noise
(:mod:`pymc_bigdata.step_methods.local_batch`, ``local_batch=True``)."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.adaptation import NOISE_SHARE_BOUND
from pymc_bigdata.step_methods.local_batch import LocalBatch, local_batch_size

SAMPLE_KW = {"tune": 60, "draws": 60, "progressbar": False, "compute_convergence_checks": False}


def _factor(n: int, pool: int, replace: bool) -> float:
    """The variance factor of an ``n``-row estimate (written out here, not imported)."""
    return 1.0 / n if replace else 1.0 / n - 1.0 / pool


@pytest.mark.parametrize("replace", [True, False])
@pytest.mark.parametrize("share", [0.051, 0.2, 1.0, 7.3, 400.0])
def test_the_batch_is_the_smallest_that_keeps_the_share_within_the_bound(share, replace):
    """The size returned keeps ``share * factor(n) / factor(base)`` within the bound, one row
    fewer does not (or it is the base), and it never passes the pool. Catches a rule
    that ignores ``1/N`` without replacement, rounds down, or scales by the square root."""
    base, pool, bound = 1_000, 60_000, 0.05
    n = local_batch_size(share, bound, base, pool, replace)
    assert base <= n <= pool
    scaled = share * _factor(n, pool, replace) / _factor(base, pool, replace)
    assert scaled <= bound * (1 + 1e-9) or n == pool
    if n > base:
        fewer = share * _factor(n - 1, pool, replace) / _factor(base, pool, replace)
        assert fewer > bound


def test_a_share_beyond_any_batch_reads_every_row():
    """Without replacement every row has no noise; with, the pool caps the batch."""
    assert local_batch_size(1e6, 0.05, 1_000, 60_000, False) == 60_000
    assert local_batch_size(1e6, 0.05, 1_000, 60_000, True) == 60_000


def test_a_share_within_the_bound_or_no_reading_keeps_the_base():
    assert local_batch_size(0.05, 0.05, 1_000, 60_000, False) == 1_000
    assert local_batch_size(0.01, 0.05, 1_000, 60_000, True) == 1_000
    assert local_batch_size(math.nan, 0.05, 1_000, 60_000, False) == 1_000


def test_the_next_batch_follows_the_last_reading_from_the_tuned_base():
    """The first draw after tuning fixes the base; each next batch comes from the last
    reading alone (a quiet reading goes back to the base, not to the grown batch); a missing
    or non-finite reading keeps the base; a new chain reads its base afresh. Catches a
    ratchet (growing from the current batch) and a base read at every draw."""

    class Rows:  # what LocalBatch reads of the minibatches: rows drawn with replacement
        size, pool_size, replace = 1_000, 100_000, True

        def batch_factor(self, n: int) -> float:
            return 1.0 / n

        def resize(self, n: int) -> None:
            self.size = n

    rows = Rows()
    local = LocalBatch(rows, shares=lambda noise_var: noise_var, noise_bound=0.05)  # share = var
    quiet, loud = np.array([10.0, 20.0]), np.array([10.0, 200.0])  # shares 0.02 and 0.2
    assert local.next_batch(1_000, quiet) == 1_000
    assert local.next_batch(1_000, loud) == 4_000
    assert local.next_batch(4_000, loud) == 4_000  # from the base, not from 4,000
    assert local.next_batch(4_000, quiet) == 1_000
    assert local.next_batch(4_000, None) == 1_000
    assert local.next_batch(4_000, np.array([np.nan, 1.0])) == 1_000
    local.restart()
    assert local.next_batch(2_000, quiet) == 2_000
    local.restart()
    local.after_draw(loud)  # the minibatches resized for the next draw, from their size now
    assert rows.size == 4_000
    local.after_draw(quiet)
    assert rows.size == 1_000


def _run(small_logistic, local_batch: bool, seed: int = 4):
    """SGLD with plain minibatch sums of 100 rows and a fixed step whose noise share is far
    above the bound (the step is not tuned to it)."""
    model, layer = small_logistic
    step = pmbd.SGLD(
        model=model,
        layer=layer,
        control_variates=False,
        batch_size=100,
        step_size=0.1,
        local_batch=local_batch,
    )
    with model:
        idata = pm.sample(step=step, chains=1, random_seed=seed, **SAMPLE_KW)
    return step, idata.sample_stats


def test_local_batch_brings_the_share_back_to_the_bound(small_logistic):
    """Off, every draw reads the given 100 rows at a noise share far above the bound. On,
    every draw after tuning measures and the next one reads more rows, so that the chain's
    running-mean share at the draws' batch sizes sits about the bound (each reading is one
    split's, so the sizes scatter), never below the 100 rows and never above N; the
    ``local_noise_share`` stat is finite on the measuring draws alone, about the running
    mean's share. Catches (watched): the resize skipped in ``astep`` or in ``after_draw``;
    ``np.max`` of the shares taken as ``np.min``; the stat read from the running mean, or at
    a 1-row batch."""
    _, off = _run(small_logistic, False)
    assert (off["batch_size"].values == 100).all()
    assert np.median(off["noise_share"].values) > 5 * NOISE_SHARE_BOUND
    local = off["local_noise_share"].values[0]  # one draw in 10 measures after tuning
    assert np.isfinite(local[::10]).all()
    assert np.isnan(np.delete(local, slice(None, None, 10))).all()
    # the draws' own readings scatter about the running mean's share at the same batch
    ratio = np.median(local[::10]) / np.median(off["noise_share"].values[0, ::10])
    assert 0.2 < ratio < 3, ratio

    step, on = _run(small_logistic, True)
    assert step.measure_every == 1
    batch = on["batch_size"].values[0]
    assert batch.min() == 100 and batch.max() <= 5_000
    assert np.mean(batch > 100) > 0.9
    median_share = np.median(on["noise_share"].values[0, 1:])
    assert np.isfinite(on["local_noise_share"].values).all()
    assert 0.3 * NOISE_SHARE_BOUND < median_share < 2 * NOISE_SHARE_BOUND, median_share


def test_local_batch_draws_are_reproducible(small_logistic):
    """The batch sizes follow the chain's own draws: one seed, the same draws and sizes."""
    _, first = _run(small_logistic, True, seed=9)
    _, second = _run(small_logistic, True, seed=9)
    np.testing.assert_array_equal(first["batch_size"].values, second["batch_size"].values)
    np.testing.assert_array_equal(first["lp_est"].values, second["lp_est"].values)


def test_bad_local_batch_settings_are_refused(small_logistic):
    """A non-boolean, or a sampler that evaluates its own estimates (no gradient oracle to
    size), is refused before any set-up."""
    model, layer = small_logistic
    with pytest.raises(ValueError, match="local_batch must be True or False"):
        pmbd.SGHMC(model=model, layer=layer, local_batch="yes")
    with pytest.raises(ValueError, match="local_batch sizes the minibatches"):
        pmbd.HMCECS(model=model, layer=layer, local_batch=True)
