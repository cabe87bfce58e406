"""The crawl alarm: a chain with too few effective draws says so, a mixing chain does not.

What each test proves (and the one-line mutation of ``pymc_bigdata/step_methods/crawl.py`` it
was seen to fail on):

* on independent draws the watch is silent; on an AR(1) chain with autocorrelation 0.999 (an
  ESS near 0.05 % of the draws) it reports a crawl naming the slowest coordinate; a chain
  shorter than ``CRAWL_MIN_DRAWS`` is not judged;
* an SGLD chain made to crawl on purpose (a fixed step 1,000 times below its default) ends in
  a BiasWarning that says so, while the defaults on the same model raise none.
"""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.step_methods.crawl import CRAWL_MIN_DRAWS, CrawlWatch

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
