"""The crawl alarm: a chain with too few effective draws says so, a mixing chain does not.

What each test proves (and the one-line mutation of ``pymc_bigdata/step_methods/crawl.py`` it
was seen to fail on):

* on independent draws the watch is silent; on an AR(1) chain with autocorrelation 0.999 (an
  ESS near 0.05 % of the draws) it reports a crawl naming the slowest coordinate; a chain
  shorter than ``CRAWL_MIN_DRAWS`` is not judged;
* a chain above the 2 % share but below ``CRAWL_MIN_ESS`` effective draws crawls, one above
  both does not;
* an SGLD chain made to crawl on purpose (a fixed step 1,000 times below its default) ends in
  a BiasWarning that says so, while the defaults on the same model raise none.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods.crawl import (
    CRAWL_COORDINATES,
    CRAWL_MIN_DRAWS,
    CRAWL_MIN_ESS,
    CrawlWatch,
    watched_coordinates,
)

KW = {"tune": 200, "draws": 400, "chains": 1, "progressbar": False}
KW["compute_convergence_checks"] = False


def _ar1(n: int, dim: int, rho: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    out = np.empty((n, dim))
    x = rng.standard_normal(dim)
    for i in range(n):
        x = rho * x + np.sqrt(1 - rho**2) * rng.standard_normal(dim)
        out[i] = x
    return out


def test_independent_draws_are_not_a_crawl():
    """Mutation: ``if ess >= CRAWL_ESS_SHARE * self._count`` -> ``if ess < ...``: silent
    becomes an alarm."""
    watch = CrawlWatch(4, 1000)
    for row in _ar1(1000, 4, 0.0, seed=1):
        watch.add(row)
    assert watch.problem("X") is None


def test_a_crawling_chain_is_reported():
    """Mutation: ``np.argmin(ess)`` -> ``np.argmax(ess)`` in ``smallest_ess`` (the largest
    ESS judged): the crawl goes unreported."""
    draws = _ar1(1000, 3, 0.0, seed=2)
    draws[:, 1] = _ar1(1000, 1, 0.999, seed=3)[:, 0]
    watch = CrawlWatch(3, 1000)
    for row in draws:
        watch.add(row)
    ess, coordinate = watch.smallest_ess()
    assert coordinate == 1 and ess < 10
    assert "crawls" in watch.problem("X")
    # with the layer's labels, the message names the parameter that crawls
    named = CrawlWatch(3, 1000, label=lambda k: f"beta[{k}]")
    for row in draws:
        named.add(row)
    assert "in beta[1] (bulk ESS" in named.problem("X")


@pytest.mark.parametrize("rho, crawls", [(0.94, True), (0.7, False)], ids=["ess-39", "ess-137"])
def test_fewer_than_the_floor_of_effective_draws_is_a_crawl(rho, crawls):
    """1,000 draws of an AR(1) chain: at autocorrelation 0.94 (ESS 39: above the 2 %
    share, below the floor of 50) the chain crawls; at 0.7 (about 140) it does not.
    Mutation: ``max(CRAWL_ESS_SHARE * self._count, CRAWL_MIN_ESS)`` -> ``CRAWL_ESS_SHARE *
    self._count`` (the share alone): the first goes unreported."""
    watch = CrawlWatch(1, 1000)
    for row in _ar1(1000, 1, rho, seed=8):
        watch.add(row)
    ess = watch.smallest_ess()[0]
    assert (20 < ess < CRAWL_MIN_ESS) if crawls else ess > 2 * CRAWL_MIN_ESS
    assert (watch.problem("X") is not None) == crawls


def test_a_crawling_scalar_among_thousands_of_effects_is_reported():
    """Crossed ratings' shape (d = 4,004: four scalars, two effects of 2,000): the mean
    ``mu`` crawls and the 4,000 effects mix. Every scalar is watched, and the crawl is
    reported in ``mu``. Mutation: ``if size <= CRAWL_SMALL_VARIABLE`` -> ``if False`` in
    ``watched_coordinates`` (a random subset of 256 alone, which misses coordinate 0 here):
    the crawl goes unreported."""
    sizes = [1, 1, 1, 1, 2000, 2000]
    assert {0, 1, 2, 3} <= set(watched_coordinates(sizes))
    assert len(watched_coordinates(sizes)) == CRAWL_COORDINATES
    # without small variables, the same fixed random subset as before
    np.testing.assert_array_equal(
        watched_coordinates([4004]),
        np.sort(np.random.default_rng(0).choice(4004, CRAWL_COORDINATES, replace=False)),
    )
    draws = np.random.default_rng(5).standard_normal((1000, 4004))
    draws[:, 0] = _ar1(1000, 1, 0.999, seed=6)[:, 0]
    watch = CrawlWatch(4004, 1000, label=lambda k: "mu" if k == 0 else f"x[{k}]", sizes=sizes)
    for row in draws:
        watch.add(row)
    assert "in mu (bulk ESS" in watch.problem("X")


def test_short_chains_are_not_judged():
    watch = CrawlWatch(2, CRAWL_MIN_DRAWS - 1)
    for row in _ar1(CRAWL_MIN_DRAWS - 1, 2, 0.9999, seed=4):
        watch.add(row)
    assert watch.problem("X") is None


@pytest.mark.parametrize("crawl", [False, True], ids=["defaults", "tiny-step"])
def test_sgld_crawl_is_flagged(small_logistic, crawl):
    """SGLD with a fixed step 1,000 times below its default crawls (and is flagged); with
    its defaults it mixes (no BiasWarning at all)."""
    model, layer = small_logistic
    kwargs = {"step_size": 1e-4 * pmbd.SGLD.default_step_size, "inner_steps": 1} if crawl else {}
    step = pmbd.SGLD(model=model, layer=layer, **kwargs)
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.sample(step=step, random_seed=5, **KW)
    bias = [str(w.message) for w in caught if issubclass(w.category, pmbd.BiasWarning)]
    if crawl:
        assert any("crawls" in message for message in bias), bias
    else:
        assert not bias, bias


def test_a_step_watches_every_scalar_of_a_large_model():
    """A step on a model of 1,002 parameters (``mu``, ``tau`` and 1,000 effects) watches both
    scalars. Mutation: ``CrawlWatch(dim, draws, step.layer.coordinate_label)`` in
    ``chain_state.py`` (no sizes): a random subset of 256 that misses both."""
    rng = np.random.default_rng(7)
    group = np.repeat(np.arange(1000), 2)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 1.0)
        tau = pm.HalfNormal("tau", 1.0)
        a = pm.Normal("a", mu, tau, shape=1000)
        pm.Normal("y", a[group], 1.0, observed=rng.normal(size=2000))
    step = pmbd.SGHMC(model=model)
    watched = step._report.crawl.coordinates
    labels = {step.layer.coordinate_label(int(k)) for k in watched}
    assert {"mu", "tau_log__"} <= labels and len(watched) == CRAWL_COORDINATES
