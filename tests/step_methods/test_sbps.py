"""The SBPS step method: bad input, the per-proposal estimate, stats, continuous-time
estimates, the violation alarm, pSBPS, and a power check of the statistical tests."""

from __future__ import annotations

import warnings

import numpy as np
import pymc as pm
import pytest
from conftest import check_posterior

import pymc_bigdata as pmbd
from pymc_bigdata.errors import BiasWarning

SAMPLE_KW = dict(chains=2, progressbar=False, compute_convergence_checks=False)


@pytest.fixture(scope="module")
def regression():
    """y = X b + e, e ~ N(0, 1) known, b ~ N(0, 10^2 I), N = 4,000, d = 3: the analytic
    posterior, and a shared layer."""
    rng = np.random.default_rng(31)
    n, d = 4_000, 3
    x = rng.standard_normal((n, d)) @ np.linalg.cholesky(0.5 * np.eye(d) + 0.5).T
    y = x @ np.array([0.5, -1.0, 0.3]) + rng.standard_normal(n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 10.0, shape=d)
        pm.Normal("y", pm.math.dot(x, b), 1.0, observed=y)
    cov = np.linalg.inv(x.T @ x + np.eye(d) / 100.0)
    layer = pmbd.MinibatchModel(model)
    layer.map_estimate()
    return model, layer, cov @ x.T @ y, np.sqrt(np.diag(cov))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(k=0.0), "k must be"),
        (dict(k=-1.0), "k must be"),
        (dict(refresh_rate=-0.1), "refresh_rate must be"),
        (dict(travel_time=0.0), "travel_time must be"),
        (dict(travel_time=float("inf")), "travel_time must be"),
        (dict(batch_size=1), "at least 2"),
        (dict(metric_beta=1.0), "metric_beta"),
        (dict(metric_eps=0.0), "metric_eps"),
        (dict(prior_rate=0.0), "prior_rate"),
        (dict(control_variates="second"), "control_variates"),
        (dict(reshuffle=True), "independent minibatches"),
        (dict(path_functions=[np.sin]), "dict of name"),
        (dict(path_functions={"a b": np.sin}), "not a valid name"),
        (dict(path_functions={"f": 1.0}), "not callable"),
        (dict(path_functions={"f": lambda t: t.sum()}), "shape"),
        (dict(quadrature_nodes=0), "quadrature_nodes"),
    ],
)
def test_bad_settings_fail_before_any_full_data_pass(regression, monkeypatch, kwargs, match):
    model, layer, _, _ = regression

    def no_pass(*args, **kw):
        raise AssertionError("a full-data pass ran before the settings were checked")

    monkeypatch.setattr(pmbd.MinibatchModel, "find_map", no_pass)
    monkeypatch.setattr(pmbd.MinibatchModel, "full_loglik_grad", no_pass)
    with pytest.raises(ValueError, match=match):
        pmbd.SBPS(model=model, **kwargs)


def test_no_step_size(regression):
    model, layer, _, _ = regression
    with pytest.raises(TypeError, match="travel_time"):
        pmbd.SBPS(model=model, layer=layer, step_size=0.1)


def test_observation_is_unbiased_with_its_noise_and_consistent_gradient(regression):
    """G_hat averages the full-data directional derivative, its variance is Eq. 10's, and
    the bounce gradient is the same minibatch's (v . grad = G_hat exactly)."""
    model, layer, _, _ = regression
    step = pmbd.SBPS(model=model, layer=layer, batch_size=100)
    rng = np.random.default_rng(0)
    z, v = rng.standard_normal(3) * 2.0, rng.standard_normal(3)
    v /= np.linalg.norm(v)
    obs = [step._observe(z, v) for _ in range(1500)]
    values = np.array([o.value for o in obs])
    _, grad = layer.full_logp_grad(step.precond.theta(z))
    exact = -float(step.precond.direction(v) @ grad)
    assert abs(values.mean() - exact) < 4.5 * values.std() / np.sqrt(len(values))
    mean_noise = np.mean([o.noise_var for o in obs])
    assert mean_noise == pytest.approx(values.var(), rel=0.15)
    assert float(v @ obs[0].gradient()) == pytest.approx(obs[0].value, rel=1e-9, abs=1e-9)


def test_stats_declared_recorded_and_path_averages_match_draws(regression):
    """Every stat declared is in the result; the continuous-time estimates agree with the
    draws and with the analytic posterior, with cores=2 as with cores=1."""
    model, layer, mean, sd = regression
    step = pmbd.SBPS(model=model, layer=layer)
    with model:
        idata = pm.sample(step=step, tune=300, draws=1000, cores=2, random_seed=3, **SAMPLE_KW)
    stats = idata.sample_stats
    for name in step.stats_dtypes_shapes:
        if name not in ("warning", "tune"):  # PyMC keeps these apart
            assert name in stats, name
    assert stats["path_mean"].shape == (2, 1000, 3)
    assert int(stats["diverging"].sum()) == 0
    assert float(stats["proposals"].mean()) > 0 and float(stats["bounces"].mean()) > 0
    continuous = step.continuous_estimates(idata)
    check_posterior(idata, "b", mean, sd)
    draws_mean = idata.posterior["b"].mean(("chain", "draw")).values
    assert np.all(np.abs(continuous["b"].values - mean) < 4.5 * sd / np.sqrt(200))
    assert np.all(np.abs(continuous["b"].values - draws_mean) < 4.5 * sd / np.sqrt(200))
    assert continuous["b_sd"].values == pytest.approx(sd, rel=0.15)


def test_path_functions_integrate_along_the_skeleton(regression):
    """Path functions are exact time averages along the trajectory: ``theta`` and ``theta^2``
    reproduce the closed-form path stats to rounding (so the recorded lines join up and
    cover the whole travel), with cores=2; and the trajectory average of a function that
    varies faster than a segment is long, ``sin((b_0 - m) / r)`` with ``r`` a tenth of the
    posterior sd, matches its analytic value ``sin((mean_0 - m) / r) exp(-sd_0^2 / (2 r^2))``
    within 4.5 MCSE (its per-draw path averages' ESS)."""
    import arviz as az

    model, layer, mean, sd = regression
    shift, r = mean[0] - 0.5 * sd[0], 0.1 * sd[0]
    functions = {
        "theta": lambda t: t,
        "theta_sq": lambda t: t * t,
        "wave": lambda t: np.sin((t[:, 0] - shift) / r),
    }
    step = pmbd.SBPS(model=model, layer=layer, path_functions=functions, quadrature_nodes=64)
    with model:
        idata = pm.sample(step=step, tune=300, draws=1000, cores=2, random_seed=9, **SAMPLE_KW)
    stats = idata.sample_stats
    np.testing.assert_allclose(stats["path_theta"], stats["path_mean"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stats["path_theta_sq"], stats["path_sq_mean"], rtol=1e-9)
    truth = np.sin((mean[0] - shift) / r) * np.exp(-0.5 * (sd[0] / r) ** 2)
    wave = stats["path_wave"]
    mcse = float(wave.std()) / np.sqrt(float(az.ess(wave.values, method="mean")))
    estimate = float(step.continuous_estimates(idata)["path_wave"])
    assert abs(estimate - truth) < 4.5 * mcse, (estimate, truth, mcse)


def test_doubled_bounce_rate_fails_the_posterior_check(regression, monkeypatch):
    """Power: a step that bounces on twice the directional derivative (the target p^2, sds
    1/sqrt(2) too small) fails the same check the real one passes."""
    model, layer, mean, sd = regression
    step = pmbd.SBPS(model=model, layer=layer)
    observe = step._observe

    def doubled(z, v):
        obs = observe(z, v)
        return obs._replace(value=2 * obs.value, noise_var=4 * obs.noise_var)

    monkeypatch.setattr(step, "_observe", doubled)
    with model:
        idata = pm.sample(step=step, tune=300, draws=1000, cores=1, random_seed=4, **SAMPLE_KW)
    with pytest.raises(AssertionError):
        check_posterior(idata, "b", mean, sd)


def test_violations_raise_a_bias_warning(regression):
    """A band far too narrow (k = 0.01, plain minibatch estimates of 20 rows) violates the
    proposal rate far more often than the regression predicts: a BiasWarning after sampling."""
    model, layer, _, _ = regression
    step = pmbd.SBPS(model=model, layer=layer, k=0.01, batch_size=20, control_variates=False)
    with model, pytest.warns(BiasWarning, match="violated the proposal rate"):
        idata = pm.sample(step=step, tune=100, draws=200, cores=1, random_seed=5, **SAMPLE_KW)
    assert int(idata.sample_stats["violations"].sum()) > 10


def test_default_run_has_no_violation_warning(regression):
    model, layer, _, _ = regression
    with model, warnings.catch_warnings():
        warnings.simplefilter("error", BiasWarning)
        pm.sample(
            step=pmbd.SBPS(model=model, layer=layer),
            tune=200,
            draws=300,
            cores=1,
            random_seed=6,
            **SAMPLE_KW,
        )


def test_non_finite_gradient_is_a_divergence(regression, monkeypatch):
    model, layer, _, _ = regression
    step = pmbd.SBPS(model=model, layer=layer)
    observe = step._observe
    calls = {"n": 0}

    def sometimes_nan(z, v):
        calls["n"] += 1
        obs = observe(z, v)
        return obs._replace(value=np.nan) if calls["n"] % 50 == 0 else obs

    monkeypatch.setattr(step, "_observe", sometimes_nan)
    with model, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = pm.sample(step=step, tune=50, draws=100, cores=1, random_seed=7, **SAMPLE_KW)
    assert int(idata.sample_stats["diverging"].sum()) > 0
    assert np.all(np.isfinite(idata.posterior["b"].values))


@pytest.fixture(scope="module")
def anisotropic():
    """Axis-aligned anisotropic Gaussian posterior: covariates with sds 1 and 30."""
    rng = np.random.default_rng(32)
    n = 3_000
    x = rng.standard_normal((n, 2)) * np.array([1.0, 30.0])
    y = x @ np.array([1.0, 0.05]) + rng.standard_normal(n)
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 10.0, shape=2)
        pm.Normal("y", pm.math.dot(x, b), 1.0, observed=y)
    cov = np.linalg.inv(x.T @ x + np.eye(2) / 100.0)
    return model, cov @ x.T @ y, np.sqrt(np.diag(cov))


def test_psbps_beats_unpreconditioned_sbps_per_data_pass(anisotropic):
    """Sec. 5: on an axis-aligned anisotropic posterior (sds 30x apart) the adaptive metric
    gives more ESS per row read than SBPS on the model's own coordinates, and is accurate."""
    import arviz as az

    model, mean, sd = anisotropic
    results = {}
    for name, step in (
        ("psbps", pmbd.pSBPS(model=model, batch_size=100)),
        ("sbps", pmbd.SBPS(model=model, batch_size=100, preconditioner="identity")),
    ):
        with model, warnings.catch_warnings():
            # SBPS on the raw coordinates violates its band on 0.9 % of its proposals here
            warnings.simplefilter("ignore", BiasWarning)
            idata = pm.sample(step=step, tune=300, draws=600, cores=1, random_seed=8, **SAMPLE_KW)
        ess = float(az.ess(idata, method="bulk")["b"].min())
        rows = float(idata.sample_stats["rows_touched"].sum())
        results[name] = (ess / rows, idata)
    check_posterior(results["psbps"][1], "b", mean, sd)
    assert results["psbps"][0] > 1.5 * results["sbps"][0], results


def test_proposal_budget_stops_the_draw_without_undoing_it(regression, monkeypatch):
    """A draw that runs out of proposals (``MAX_PROPOSALS``) stops where the process is,
    records ``proposals_exhausted`` and its shorter travel time, and the chain goes on from
    there; the chain ends with a BiasWarning. Fails when the budget throws the travel away
    and restarts from the draw's start (a trajectory-dependent rejection: every draw would
    be diverging and the chain would never move)."""
    import pymc_bigdata.kernels.sbps as sbps_kernel

    model, layer, _, _ = regression
    monkeypatch.setattr(sbps_kernel, "MAX_PROPOSALS", 3)
    step = pmbd.SBPS(model=model, layer=layer)
    with model, pytest.warns(BiasWarning, match="stopped after 3 bounce proposals"):
        idata = pm.sample(
            step=step,
            tune=20,
            draws=40,
            chains=1,
            random_seed=5,
            progressbar=False,
            compute_convergence_checks=False,
        )
    stats = idata.sample_stats
    exhausted = stats["proposals_exhausted"].values[0]
    assert exhausted.sum() >= 5
    assert not stats["diverging"].values.any()
    assert np.all(stats["travel_time"].values[0][exhausted] < step.step_size)
    draws = idata.posterior["b"].values[0]
    assert np.all(np.any(np.diff(draws, axis=0) != 0, axis=1))
