"""HMC-ECS as a PyMC step method: settings, statistics, divergences, signs, reproducibility.

The posterior checks of both estimators against analytic and exact references are in
``test_statistical.py`` (conjugate normal, linear regression, logistic regression on 100,000
rows, 30 coefficients) and, on targets where the Laplace fit is wrong, ``test_hard_hmcecs_ewsg.py``.
"""

from __future__ import annotations

import math
import warnings

import arviz as az
import numpy as np
import pandas as pd
import pymc as pm
import pytest
from conftest import check_declared_stats, layer_without_map_search, sample_two_chains

import pymc_bigdata as pmbd


@pytest.fixture(scope="module")
def logistic(small_logistic):
    return small_logistic


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"estimator": "exact"}, ValueError, r"estimator must be 'perturbed' or 'signed'"),
        ({"blocks": 0}, ValueError, r"blocks must be a positive integer, got 0"),
        ({"subsample_size": 50, "blocks": 60}, ValueError, r"blocks \(G = 60\) must be at most"),
        (
            {"estimator": "signed", "products": 0, "lower_bound": 1.0},
            ValueError,
            r"products must be a positive integer",
        ),
        ({"estimator": "signed", "products": 3}, ValueError, r"Give both products and lower_bound"),
        (
            {"estimator": "signed", "lower_bound": float("nan"), "products": 2},
            ValueError,
            r"lower_bound must be a finite",
        ),
        ({"products": 2, "lower_bound": 0.0}, ValueError, r"products, lower_bound belong to the"),
        ({"estimator": "signed", "blocks": 10}, ValueError, r"subsample_size and blocks belong"),
        (
            {"estimator": "signed", "products": 2, "lower_bound": 0.0, "refreshed_products": 3},
            ValueError,
            r"refreshed_products \(3\) must be at most products \(2\)",
        ),
        ({"taylor_order": 3}, ValueError, r"taylor_order must be 0, 1 or 2, got 3"),
        ({"subsample_size": 10**7}, ValueError, r"subsample_size \(10000000\) must be at most"),
        ({"subsample_size": 0}, ValueError, r"subsample_size must be a positive integer, got 0"),
        ({"estimator": "signed", "minibatch": 10**7}, ValueError, r"minibatch \(10000000\) must"),
        ({"target_accept": 1.0}, ValueError, r"target_accept must be in \(0, 1\)"),
        ({"trajectory_length": -1.0}, ValueError, r"trajectory_length must be a positive"),
        ({"loglik_var_target": 0}, ValueError, r"loglik_var_target must be a positive"),
        ({"step_size": float("inf")}, ValueError, r"step_size must be a positive finite"),
        ({"batch_size": 100}, TypeError, r"HMCECS has no 'batch_size'"),
        ({"control_variates": False}, ValueError, r"HMCECS needs control variates"),
    ],
)
def test_bad_settings_fail_before_any_full_data_pass(logistic, kwargs, error, match):
    """Every out-of-range setting raises, naming the argument, before the MAP search."""
    model, _ = logistic
    with pytest.raises(error, match=match):
        pmbd.HMCECS(model=model, layer=layer_without_map_search(model), **kwargs)


@pytest.fixture(scope="module")
def perturbed_run(logistic):
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer)
    return step, sample_two_chains(model, step, seed=11, draws=300, tune=300)


def test_stats_are_declared_and_sensible(perturbed_run):
    step, idata = perturbed_run
    check_declared_stats(step, idata)
    stats = idata.sample_stats
    assert 0.5 < float(stats["accept_prob"].mean()) <= 1.0
    # the tuned m keeps u mobile (not a test of the u-update's decision: the kernel tests
    # test_subsample_update_accepts_with_the_exact_ratio and
    # test_subsample_chain_has_its_conditional_law catch an always-accept or inverted ratio)
    assert float(stats["subsample_accept"].mean()) > 0.9
    assert np.all(stats["sign"].values == 1)  # perturbed: L_hat > 0
    n_steps = stats["n_steps"].values
    m = stats["subsample_size"].values
    # one subsample proposal plus the leapfrog steps, m rows each
    assert np.all(stats["rows_touched"].values == m * (n_steps + 1))
    assert float(stats["loglik_var"].mean()) < 1.0
    assert int(stats["cv_order"].values[0, -1]) == 2
    # eps L = 1.2 (the paper's trajectory length), within one step
    eps = stats["step_size"].values
    assert np.all(eps * n_steps >= 1.2 - 1e-9) and np.all(eps * (n_steps - 1) < 1.2)


def test_same_seed_same_draws(logistic, perturbed_run):
    model, layer = logistic
    _, first = perturbed_run
    again = sample_two_chains(
        model, pmbd.HMCECS(model=model, layer=layer), seed=11, draws=300, tune=300
    )
    np.testing.assert_array_equal(first.posterior["beta"].values, again.posterior["beta"].values)


def test_signed_same_seed_same_draws_and_summary(logistic):
    model, layer = logistic
    runs = [
        sample_two_chains(
            model,
            pmbd.HMCECS(model=model, layer=layer, estimator="signed"),
            seed=12,
            draws=200,
            tune=200,
        )
        for _ in range(2)
    ]
    np.testing.assert_array_equal(
        runs[0].posterior["beta"].values, runs[1].posterior["beta"].values
    )
    summary = pmbd.sign_corrected_summary(runs[0])
    signs = runs[0].sample_stats["sign"].values
    assert set(np.unique(signs)) <= {-1, 1}
    assert list(summary.index) == ["beta[0]", "beta[1]", "beta[2]"]
    weights = pmbd.sign_weights(runs[0])
    assert float(weights.sum()) == pytest.approx(1.0)
    if np.all(signs == 1):
        plain = runs[0].posterior["beta"].mean(("chain", "draw")).values
        np.testing.assert_allclose(summary["mean"].values, plain)


def test_sign_correction_on_known_signs():
    """Eq. (5.3) by hand: draws 1, 2, 3, 4 with signs +, +, -, +: (1 + 2 - 3 + 4) / 2."""
    idata = az.from_dict(
        {
            "posterior": {"x": np.array([[1.0, 2.0, 3.0, 4.0]])},
            "sample_stats": {"sign": np.array([[1, 1, -1, 1]])},
        }
    )
    summary = pmbd.sign_corrected_summary(idata)
    assert summary.loc["x", "mean"] == pytest.approx(2.0)
    second = (1 + 4 - 9 + 16) / 2
    assert summary.loc["x", "sd"] == pytest.approx(np.sqrt(second - 4.0))
    assert summary.loc["x", "negative_fraction"] == pytest.approx(0.25)
    assert summary.loc["x", "ess_factor"] == pytest.approx(0.25)
    assert isinstance(summary, pd.DataFrame)
    bad = az.from_dict(
        {"posterior": {"x": np.ones((1, 2))}, "sample_stats": {"sign": np.array([[1, -1]])}}
    )
    with pytest.raises(ValueError, match="signs sum to 0"):
        pmbd.sign_weights(bad)
    with pytest.raises(ValueError, match="not sampled by pmbd.HMCECS"):
        pmbd.sign_weights(az.from_dict({"posterior": {"x": np.ones((1, 2))}}))


def test_blow_up_is_a_divergence_with_a_warning_not_a_nan_draw(logistic):
    """A step size far beyond stability: non-finite or exploding energies are rejected and
    recorded as diverging, with a DivergenceWarning; every draw stays finite."""
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, step_size=60.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = sample_two_chains(model, step, seed=13, draws=50, tune=20)
    assert np.all(np.isfinite(idata.posterior["beta"].values))
    assert int(idata.sample_stats["diverging"].values.sum()) > 10
    assert any(issubclass(w.category, pmbd.DivergenceWarning) for w in caught)


def test_fixed_subsample_size_and_blocks_are_kept(logistic):
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, subsample_size=200, blocks=20, taylor_order=1)
    idata = sample_two_chains(model, step, seed=14, draws=50, tune=50)
    assert np.all(idata.sample_stats["subsample_size"].values == 200)
    assert np.all(idata.sample_stats["cv_order"].values == 1)
    assert step.blocks == 20


def test_signed_stats(logistic):
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, estimator="signed", products=4, lower_bound=-4.0)
    idata = sample_two_chains(model, step, seed=15, draws=50, tune=50)
    stats = idata.sample_stats
    assert np.all(stats["products"].values == 4)
    assert np.all(stats["lower_bound"].values == -4.0)
    assert np.all(stats["subsample_size"].values == 30)
    # rows per estimate are random (Poisson counts of 30-row minibatches)
    assert np.all(stats["rows_touched"].values % 30 == 0)
    assert len(np.unique(stats["rows_touched"].values)) > 1


def test_many_negative_signs_raise_a_warning():
    """A lower bound ``a = +lambda`` where the minibatch estimates are near 0 (second-order
    control variates) makes every factor about -1: the sign is ``(-1)^(sum X_l)``, negative
    with probability ``(1 - exp(-2 lambda)) / 2 ~ 0.5``, and the end-of-chain check says the
    sign-corrected estimates are unreliable."""
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2_000, 2))
    y = rng.binomial(1, 0.5, size=2_000)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=2)
        pm.Bernoulli("y", logit_p=pm.math.dot(x, b), observed=y)
    step = pmbd.HMCECS(model=model, estimator="signed", products=6, lower_bound=6.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = sample_two_chains(model, step, seed=17, draws=200, tune=50)
    assert 0.3 < float((idata.sample_stats["sign"].values < 0).mean()) < 0.7
    messages = [str(w.message) for w in caught if issubclass(w.category, pmbd.BiasWarning)]
    assert any("negative" in m for m in messages)


def test_signed_divergent_draws_keep_their_sign(logistic):
    """A divergent signed draw records the sign of the estimate at the state the chain keeps
    (the kernel's rejected trajectory leaves theta and the new subsample u, whose estimate can
    be negative). Every trajectory diverges here (step size 50) and the lower bound sits
    far above every minibatch estimate, so each factor of (5.1) is negative and the sign is
    (-1)^(number of factors): negative draws are common. Fails when a divergence resets the
    evaluation and the stat falls back to +1 (Eq. 5.3's averages biased)."""
    model, layer = logistic
    step = pmbd.HMCECS(
        model=model,
        layer=layer,
        estimator="signed",
        products=1,
        lower_bound=1e6,
        step_size=50.0,
    )
    recorded, recomputed = [], []

    def check(trace, draw):
        recorded.append(int(draw.stats[0]["sign"]))
        diverging = bool(draw.stats[0]["diverging"])
        # the chain's state after the draw, evaluated as the kernel does
        kept = step._estimates().evaluate(step._last_z, step._subsample)
        recomputed.append((kept.sign, diverging))

    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.sample(
            step=step,
            tune=0,
            draws=60,
            chains=1,
            random_seed=4,
            progressbar=False,
            compute_convergence_checks=False,
            callback=check,
        )
    assert all(diverging for _, diverging in recomputed)
    assert recorded == [sign for sign, _ in recomputed]
    assert recorded.count(-1) > 0


def test_subsample_of_all_rows_is_the_exact_full_data_sum(logistic):
    """``m`` reaching the rows subsampled means the exact full-data log posterior (HMC on
    the full data), not ``m`` rows drawn with replacement: every draw's estimate equals the
    full-data log posterior at that draw, with ``sigma_hat^2 = 0``. Fails when ``m = N``
    still draws N rows with replacement (a noisy, perturbed estimate)."""
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, subsample_size=layer.n_rows)
    assert step.exact
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = pm.sample(
            step=step,
            tune=30,
            draws=20,
            chains=1,
            random_seed=9,
            progressbar=False,
            compute_convergence_checks=False,
        )
    assert not any(issubclass(w.category, pmbd.FullDataWarning) for w in caught)  # asked for
    stats = idata.sample_stats
    assert np.all(stats["loglik_var"].values == 0.0)
    betas = idata.posterior["beta"].values[0]
    lp = stats["lp_est"].values[0]
    for beta, estimate in zip(betas, lp):
        exact, _ = layer.full_logp_grad(beta)
        assert estimate == pytest.approx(exact, rel=1e-12)


def test_tuning_that_reaches_every_row_says_the_chain_is_full_data_hmc(logistic):
    """A ``loglik_var_target`` no subsample can meet makes tuning choose ``m`` = every row:
    the chain is then full-data HMC, and a ``FullDataWarning`` says so at the first kept
    draw (the method does not turn into another silently). Fails without the warning."""
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, loglik_var_target=1e-9)
    kwargs = dict(
        tune=60, draws=5, chains=1, random_seed=2, progressbar=False,
        compute_convergence_checks=False,
    )  # fmt: skip
    with model, pytest.warns(pmbd.FullDataWarning, match=r"every row .*full-data HMC"):
        idata = pm.sample(step=step, keep_warning_stat=True, **kwargs)
    assert step.exact
    notices = idata.sample_stats["warning"].values[0, :, 0]  # PyMC logs these (any process)
    assert "full-data HMC" in notices[0].message and not any(notices[1:])
    default = pmbd.HMCECS(model=model, layer=layer)  # a subsample suffices: no warning
    with model, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pm.sample(step=default, **kwargs)
    assert not default.exact
    assert not any(issubclass(w.category, pmbd.FullDataWarning) for w in caught)


def test_data_smaller_than_a_subsample_say_the_chain_is_full_data_hmc():
    """50 rows are fewer than HMC-ECS's smallest subsample (100): tuning takes every row,
    and the warning says why and names NUTS. Fails when the warning gives the noise target
    as the reason (it is not one here)."""
    y = np.random.default_rng(3).normal(0.5, 1.0, size=50)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    step = pmbd.HMCECS(model=model)
    with model, pytest.warns(pmbd.FullDataWarning, match=r"no more than its smallest.*NUTS"):
        idata = pm.sample(
            step=step, tune=40, draws=1, chains=1, random_seed=2, progressbar=False,
            compute_convergence_checks=False, keep_warning_stat=True,
        )  # fmt: skip
    assert step.exact
    # one kept draw, the first and the last: the chain's end (no bias warning) keeps the stat
    (notice,) = idata.sample_stats["warning"].values[0, :, 0]
    assert "no more than its smallest" in notice.message


def test_truncated_trajectories_are_a_stat_and_a_warning(logistic):
    """A step size so small that ``trajectory_length`` would need more than MAX_LEAPFROG
    steps runs MAX_LEAPFROG of them: each draw records ``trajectory_truncated`` and the chain
    ends with a warning. Fails when the cap shortens trajectories silently."""
    from pymc_bigdata.step_methods.hmcecs import MAX_LEAPFROG

    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, step_size=1.2 / (2 * MAX_LEAPFROG))
    with model, pytest.warns(pmbd.BiasWarning, match="leapfrog steps"):
        idata = pm.sample(
            step=step,
            tune=0,
            draws=5,
            chains=1,
            random_seed=9,
            progressbar=False,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    assert stats["trajectory_truncated"].values.all()
    assert np.all(stats["n_steps"].values == MAX_LEAPFROG)


def test_signed_blow_ups_at_the_estimate_s_zeros_are_not_divergences():
    """``hard_models.scale_few_rows`` (30 rows), signed, ``pm.sample``'s defaults at seed 2,
    the run of the three-seed alarm table (``docs/alarms.md``) with 5 rejected divergences
    after tuning and sd ratios 0.984-0.989: every one of them met a zero of ``L_hat`` (a
    factor within 0.00-0.03 of 0) from the bulk. They are now the stat ``estimator_zero``,
    with no divergence and no warning. Fails when the estimate does not report how near its
    nearest factor is to zero (``nearest_zero`` left inf: 5 divergences and a warning)."""
    from hard_models import scale_few_rows

    model = scale_few_rows()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        idata = sample_two_chains(model, pmbd.HMCECS(model=model, estimator="signed"), seed=2)
    stats = idata.sample_stats
    assert int(stats["diverging"].values.sum()) == 0
    zeros = stats["estimator_zero"].values
    assert zeros.sum() >= 1
    assert not stats["accepted"].values[zeros].any()
    assert not [w for w in caught if issubclass(w.category, pmbd.DivergenceWarning)]


@pytest.mark.parametrize("estimator", ["perturbed", "signed"])
def test_the_variance_wall_is_the_perturbed_estimates_alone(logistic, monkeypatch, estimator):
    """The kernel gets ``VARIANCE_WALL`` from the perturbed step (its estimate carries the
    factor ``exp(-sigma_hat^2 / 2)``) and no wall from the signed one, whose ``loglik_var``
    enters no factor; a kept draw's ``variance_wall`` stat is the kernel's. Fails when the
    step passes no wall (the default ``inf``) or the same wall to both."""
    from pymc_bigdata.kernels.hmcecs import VARIANCE_WALL
    from pymc_bigdata.step_methods import hmcecs as hmcecs_module

    walls, kernel = [], hmcecs_module.hmcecs_step

    def recorded(*args, **kwargs):
        walls.append(kwargs.get("variance_wall"))
        state, info = kernel(*args, **kwargs)
        return state, info._replace(at_variance_wall=len(walls) % 7 == 0)

    monkeypatch.setattr(hmcecs_module, "hmcecs_step", recorded)
    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, estimator=estimator)
    idata = sample_two_chains(model, step, seed=3, draws=30, tune=30)
    expected = VARIANCE_WALL if estimator == "perturbed" else math.inf
    assert walls and all(wall == expected for wall in walls)
    assert 0 < int(idata.sample_stats["variance_wall"].values.sum()) < 60


def test_the_anchor_stays_where_no_later_tuning_draw_re_chooses_lambda(logistic, monkeypatch):
    """Every tuning window is told the control variates were poor, so the anchor moves at
    each window's end, except the last (the terminal buffer's start): no later tuning draw
    would re-choose ``lambda`` and ``a`` for a new anchor, and a move there left them
    measured at the old one (signed, ``two_level_logistic_noncentred`` seed 2:
    ``Var log |L_hat|`` 38 times its target at the draws). Fails when ``_adapt`` lets that
    last window move the anchor (``may_move`` always True)."""
    from pymc_bigdata.step_methods.hmcecs_tuning import SubsampleTuning

    model, layer = logistic
    step = pmbd.HMCECS(model=model, layer=layer, estimator="signed")
    monkeypatch.setattr(SubsampleTuning, "poor_control_variates", lambda self: True)
    calls = []
    window_ended = step._tuner.window_ended

    def spy(may_move: bool = True):
        anchor = window_ended(may_move)
        calls.append((step._draw_index, may_move, anchor is not None))
        return anchor

    step._tuner.window_ended = spy
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm.sample(
            step=step,
            tune=1000,
            draws=5,
            chains=1,
            random_seed=3,
            progressbar=False,
            compute_convergence_checks=False,
        )
    *earlier, (last_index, may_move, anchor_moved) = calls
    assert earlier and all(moved for _, _, moved in earlier)
    assert last_index == step._adaptation.windows.terminal_start
    assert not may_move and not anchor_moved
