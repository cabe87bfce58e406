"""Sampler statistics in PyMC's progress bar (``pymc_bigdata/step_methods/progress.py``)."""

from __future__ import annotations

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods.progress import DIVERGENCES, STEP_SIZE, update_functions

STEPS = [pmbd.SGLD, pmbd.SGHMC, pmbd.SBPS, pmbd.pSBPS, pmbd.HMCECS, pmbd.EWSG, pmbd.AusterityMH]


@pytest.mark.parametrize("step_class", STEPS, ids=lambda c: c.__name__)
def test_every_column_is_a_declared_stat(step_class):
    """Each step shows divergences, step size and its own statistic, all stats it declares
    (a column naming a stat the step does not record would fail at the first draw)."""
    field = step_class.progress_field
    assert field is not None
    declared = step_class.stats_dtypes_shapes
    for stat in (DIVERGENCES.stat, STEP_SIZE.stat, field.stat):
        assert stat in declared, (step_class.__name__, stat)


def test_gibbs_columns_are_declared_stats():
    declared = pmbd.AusterityGibbs.stats_dtypes_shapes
    assert all(f.stat in declared for f in pmbd.AusterityGibbs.PROGRESS_FIELDS)


def test_the_bar_fails_once_the_chain_has_diverged():
    """``failing`` (a red bar) follows the running count, not the draw's own flag."""
    (update,) = update_functions([DIVERGENCES, STEP_SIZE])
    assert update({"divergences": 0, "step_size": 0.5}) == {
        "divergences": 0,
        "step_size": 0.5,
        "failing": False,
    }
    assert update({"divergences": 2, "step_size": 0.5})["failing"]


def test_the_progress_bar_renders_the_columns(small_logistic, capsys, monkeypatch):
    """``pm.sample`` with its progress bar shows each column's title and the chain's values
    (SGHMC: 0 divergences, its step size, its noise share), and the ``divergences`` stat
    counts the kept draws' diverging ones. Caught when broken: the step's PyMC hooks not
    found (PyMC's default shows no column), a field naming a missing stat (a KeyError)."""
    monkeypatch.setenv("COLUMNS", "200")
    model, layer = small_logistic
    step = pmbd.SGHMC(model=model, layer=layer)
    with model:
        idata = pm.sample(
            step=step, tune=30, draws=30, chains=1, random_seed=3, progressbar=True,
            compute_convergence_checks=False,
        )  # fmt: skip
    shown = capsys.readouterr().out
    for title in ("Divergences", "Step size", "Noise share"):
        assert title in shown
    stats = idata.sample_stats
    assert f"{float(stats.step_size.values[0, -1]):0.3g}" in shown
    counted = np.cumsum(stats.diverging.values[0])
    np.testing.assert_array_equal(stats.divergences.values[0], counted)
