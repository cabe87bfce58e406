"""Per-draw batch sizes from the locally measured gradient noise
(:mod:`pymc_bigdata.step_methods.local_batch`, ``local_batch=True``)."""

from __future__ import annotations

import math

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.adaptation import NOISE_SHARE_BOUND
from pymc_bigdata.step_methods.local_batch import (
    MIN_READINGS,
    LocalBatch,
    chance_ratio,
    local_batch_size,
)

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


class _Rows:
    """What LocalBatch reads of the minibatches: rows drawn with replacement."""

    def __init__(self, size: int = 1_000):
        self.size, self.pool_size, self.replace = size, 100_000, True

    def batch_factor(self, n: int) -> float:
        return 1.0 / n

    def resize(self, n: int) -> None:
        self.size = n


def _settled(local: LocalBatch, batch: int = 1_000) -> None:
    """``MIN_READINGS`` quiet readings (shares 0.01 and 0.005 at 1,000 rows) after tuning."""
    for _ in range(MIN_READINGS):
        assert local.next_batch(batch, QUIET) == batch


QUIET, LOUD, LOUDER = np.array([10.0, 5.0]), np.array([10.0, 200.0]), np.array([10.0, 250.0])


def test_a_persistent_excess_sizes_the_next_batch_a_single_one_does_not():
    """After ``MIN_READINGS`` quiet readings, one loud reading (the second coordinate's
    share 0.2, above the chance ratio of 2 coordinates times its mean) keeps the base; the
    second loud reading in a row grows the batch from the smaller of the two (0.2 / 0.05:
    4 times the base), the third from the base again (0.25 / 0.05); a quiet reading goes
    back to the size of the readings' mean (their mean share 755 / 14 / 1,000 is just above
    the bound), not to the grown batch. Catches (watched): the old rule (the worst share of
    the last reading alone), a ratchet from the current batch, sizing from the larger
    reading."""
    local = LocalBatch(_Rows(), shares=lambda noise_var: noise_var, noise_bound=0.05)
    assert 3.8 < chance_ratio(2) < 3.9  # chi-square (1 dof) beyond it: 5 % per coordinate
    _settled(local)
    assert local.next_batch(1_000, LOUD) == 1_000  # once: chance
    assert local.next_batch(1_000, LOUDER) == 4_000  # twice running: the smaller reading
    assert local.next_batch(4_000, LOUDER) == 5_000  # from the base, not from 4,000
    assert local.next_batch(5_000, QUIET) == math.ceil(755 / 14 / 0.05)


def test_a_missing_or_non_finite_reading_breaks_the_run():
    """A missing or non-finite reading keeps the base and the next loud reading starts a
    new run (sized by the mean alone: 750 / 13 / 1,000). Catches a run that survives a
    missing reading, and a non-finite reading added to the mean."""
    local = LocalBatch(_Rows(), shares=lambda noise_var: noise_var, noise_bound=0.05)
    _settled(local)
    assert local.next_batch(1_000, LOUD) == 1_000
    assert local.next_batch(1_000, None) == 1_000
    assert local.next_batch(1_000, LOUDER) == 1_000
    assert local.next_batch(1_000, np.array([np.nan, 250.0])) == 1_000
    assert local.next_batch(1_000, LOUDER) == math.ceil(750 / 13 / 0.05)


def test_a_mean_above_the_bound_sizes_every_batch_and_a_new_chain_starts_afresh():
    """Readings whose mean share is above the bound everywhere (a step too long for its
    noise) grow every batch from ``MIN_READINGS`` on, by the mean's share; before, the base;
    a restarted chain reads its base and its mean afresh; ``after_draw`` resizes the
    minibatches. Catches a mean kept across chains and a rule blind to a uniform excess."""
    rows = _Rows()
    local = LocalBatch(rows, shares=lambda noise_var: noise_var, noise_bound=0.05)
    loud = np.array([100.0, 200.0])  # shares 0.1 and 0.2 at 1,000 rows, every draw
    sizes = [local.next_batch(1_000, loud) for _ in range(MIN_READINGS + 2)]
    assert sizes[: MIN_READINGS - 1] == [1_000] * (MIN_READINGS - 1)
    assert sizes[MIN_READINGS - 1 :] == [4_000] * 3
    local.restart()
    _settled(local, batch=2_000)  # a new base of 2,000 and a quiet mean
    local.restart()
    for _ in range(MIN_READINGS):
        local.after_draw(loud)
    assert rows.size == 4_000
    local.after_draw(QUIET)  # the mean still above the bound: smaller
    assert 1_000 < rows.size < 4_000


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
    every draw after tuning measures, and from ``MIN_READINGS`` readings on the readings'
    mean, above the bound everywhere, sizes the next batch, so that the chain's
    running-mean share at the draws' batch sizes sits about the bound, never below the 100
    rows and never above N; the
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
    assert np.mean(batch[MIN_READINGS:] > 100) > 0.9
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
