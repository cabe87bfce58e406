"""PSIS-LOO on a subsample of rows (:mod:`pymc_bigdata.loo`).

References, all independent of the module:

* PyMC's own ``pm.compute_log_likelihood`` on the same draws (every row, or the rows of the
  subsample), and SciPy's densities;
* ``arviz_stats.loo`` on PyMC's full ``log_likelihood`` group (exact PSIS-LOO);
* the exact posterior of a conjugate regression with unknown noise variance
  (normal-inverse-gamma: ``sigma2 ~ InvGamma(a, b)``, ``beta | sigma2 ~ N(0, sigma2 v0 I)``),
  so the draws are exact and ``sigma2`` is sampled on the log scale (a transform).

Each model and its layer are built once per module (compiling is the slow part).
"""

from __future__ import annotations

import arviz as az
import arviz_stats as azs
import numpy as np
import pymc as pm
import pytest
from scipy import stats

import pymc_bigdata as pmbd
from pymc_bigdata.loo import add_log_likelihood, loo_subsample_inputs, pointwise_log_likelihood

N_ROWS = 300
CHAINS, DRAWS = 2, 500
A0, B0, V0 = 3.0, 2.0, 4.0
#: exact identities between two compiled implementations of the same densities
RTOL = 1e-10
#: the subsampled elpd must lie within this many of its own reported subsampling SEs of
#: exact LOO. The subsample's elpd_i are exact PSIS values, so subsampling is the only error;
#: but the differences elpd_i - plpd_i are skewed (skewness -4 here: a few outlying rows), so
#: a subsample of 100 of 300 rows often misses them and the reported SE understates the
#: error: over 600 seeds at m = 100, rms z = 1.14, |z| > 3 in 2.2 % and |z| > 4 in 0.33 % of
#: seeds. 4 SEs: a correct route fails with probability ~0.3 % per (fixed, so deterministic)
#: seed
SE_BAND = 4.0


def regression_data(seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    features = np.column_stack([np.ones(N_ROWS), rng.normal(size=N_ROWS)])
    outcome = features @ np.array([1.0, 2.0]) + 0.7 * rng.normal(size=N_ROWS)
    return features, outcome


def conjugate_model(features: np.ndarray, outcome: np.ndarray) -> pm.Model:
    with pm.Model() as model:
        sigma2 = pm.InverseGamma("sigma2", A0, B0)
        beta = pm.Normal("beta", 0.0, pm.math.sqrt(sigma2 * V0), shape=features.shape[1])
        pm.Normal("y", pm.math.dot(features, beta), pm.math.sqrt(sigma2), observed=outcome)
    return model


def exact_posterior(features: np.ndarray, outcome: np.ndarray, seed: int = 2):
    """Exact draws of the normal-inverse-gamma posterior, as a DataTree."""
    rng = np.random.default_rng(seed)
    n, k = features.shape
    precision = np.eye(k) / V0 + features.T @ features
    cov = np.linalg.inv(precision)
    mean = cov @ features.T @ outcome
    shape, rate = A0 + n / 2, B0 + 0.5 * (outcome @ outcome - mean @ precision @ mean)
    sigma2 = rate / rng.gamma(shape, size=CHAINS * DRAWS)
    white = rng.standard_normal((CHAINS * DRAWS, k)) @ np.linalg.cholesky(cov).T
    beta = mean + white * np.sqrt(sigma2)[:, None]
    return az.from_dict(
        {
            "posterior": {
                "sigma2": sigma2.reshape(CHAINS, DRAWS),
                "beta": beta.reshape(CHAINS, DRAWS, k),
            }
        }
    )


class Fit:
    """A model, its layer and exact posterior draws."""

    def __init__(self, features: np.ndarray, outcome: np.ndarray):
        self.features, self.outcome = features, outcome
        self.model = conjugate_model(features, outcome)
        self.layer = pmbd.MinibatchModel(self.model)
        self.idata = exact_posterior(features, outcome)

    def fresh(self):
        """The draws without any log_likelihood group."""
        return self.idata.copy()

    def pymc_log_likelihood(self):
        return pm.compute_log_likelihood(
            self.fresh(), model=self.model, extend_inferencedata=False, progressbar=False
        )


@pytest.fixture(scope="module")
def fit() -> Fit:
    return Fit(*regression_data())


@pytest.fixture(scope="module")
def intercept_fit() -> Fit:
    """A clearly worse model of the same data: the slope left out."""
    features, outcome = regression_data()
    return Fit(features[:, :1], outcome)


@pytest.fixture(scope="module")
def pymc_group(fit):
    return fit.pymc_log_likelihood()


@pytest.fixture(scope="module")
def full_group(fit):
    return add_log_likelihood(fit.fresh(), layer=fit.layer, rows=N_ROWS)


# ---------------------------------------------------------------------- (a) the values
def test_every_row_matches_pymc_compute_log_likelihood(full_group, pymc_group):
    ours = full_group.log_likelihood["y"]
    want = pymc_group["y"]
    assert ours.dims == want.dims == ("chain", "draw", "y_dim_0")
    np.testing.assert_array_equal(ours["y_dim_0"].values, np.arange(N_ROWS))
    np.testing.assert_allclose(ours.values, want.values, rtol=RTOL, atol=1e-12)
    attrs = full_group.log_likelihood.attrs
    assert attrs["n_rows"] == N_ROWS and attrs["is_subsample"] == 0


def test_subsample_rows_are_uniform_without_replacement_and_recoverable(fit, pymc_group):
    idata = add_log_likelihood(fit.fresh(), layer=fit.layer, rows=50, seed=7)
    group = idata.log_likelihood
    rows = group["y_dim_0"].values
    want_rows = np.sort(np.random.default_rng(7).choice(N_ROWS, 50, replace=False))
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_array_equal(group.attrs["row_indices"], rows)
    assert group.attrs["n_rows"] == N_ROWS
    assert group.attrs["subsample_size"] == 50 and group.attrs["is_subsample"] == 1
    assert group.attrs["seed"] == 7
    want = pymc_group["y"].isel(y_dim_0=rows)
    np.testing.assert_allclose(group["y"].values, want.values, rtol=RTOL, atol=1e-12)
    # given indices (another group's) give the same group
    again = add_log_likelihood(fit.fresh(), layer=fit.layer, rows=group.attrs["row_indices"])
    np.testing.assert_array_equal(again.log_likelihood["y"].values, group["y"].values)
    # pointwise_log_likelihood keeps the order given (and repeats)
    some = pointwise_log_likelihood(fit.idata, [5, 2, 5], layer=fit.layer)
    np.testing.assert_allclose(
        some.values, pymc_group["y"].isel(y_dim_0=[5, 2, 5]).values, rtol=RTOL, atol=1e-12
    )


def test_several_observed_dependent_transform_and_discrete_variable():
    """One joint term per row; an interval whose bound is another free variable (its
    transform needs that variable's draws); a Bernoulli variable held by the layer."""
    rng = np.random.default_rng(3)
    n = 120
    x = rng.normal(size=n)
    y = 1.0 + 0.5 * x + rng.normal(size=n)
    counts = rng.poisson(2.0, size=n)
    with pm.Model() as model:
        c = pm.HalfNormal("c", 2.0)
        u = pm.Uniform("u", 0.0, c)
        k = pm.Bernoulli("k", 0.5)
        b = pm.Normal("b", 0.0, 1.0)
        pm.Normal("y", u + k * b * x, 1.0, observed=y)
        pm.Poisson("z", c, observed=counts)
    shape = (2, 20)
    c_draws = np.abs(rng.normal(2.0, 0.1, shape))
    idata = az.from_dict(
        {
            "posterior": {
                "c": c_draws,
                "u": rng.uniform(0.1, 0.9, shape) * c_draws,
                "k": rng.integers(0, 2, shape),
                "b": rng.normal(0.5, 0.1, shape),
            }
        }
    )
    add_log_likelihood(idata, model, rows=n)
    want = pm.compute_log_likelihood(
        idata.copy(), model=model, extend_inferencedata=False, progressbar=False
    )
    group = idata.log_likelihood
    assert list(group.data_vars) == ["y+z"] and group["y+z"].dims[-1] == "row"
    np.testing.assert_allclose(
        group["y+z"].values, want["y"].values + want["z"].values, rtol=RTOL, atol=1e-12
    )


# ---------------------------------------------------------------------- (b) total_size trap
def test_minibatch_total_size_model_gives_unscaled_terms(fit, full_group):
    """PyMC's log-likelihood of a pm.Minibatch/total_size model is the minibatch's terms
    times N/n (pymc issue 8300); ours is every row's own term, as on the full-data model."""
    batch = 20
    with pm.Model() as model:
        features, outcome = pm.Minibatch(fit.features, fit.outcome, batch_size=batch)
        sigma2 = pm.InverseGamma("sigma2", A0, B0)
        beta = pm.Normal("beta", 0.0, pm.math.sqrt(sigma2 * V0), shape=2)
        pm.Normal(
            "y",
            pm.math.dot(features, beta),
            pm.math.sqrt(sigma2),
            observed=outcome,
            total_size=N_ROWS,
        )
    draws = fit.idata.isel(draw=slice(0, 10))
    idata = add_log_likelihood(draws.copy(), model, rows=N_ROWS)
    ours = idata.log_likelihood["y"]
    np.testing.assert_allclose(
        ours.values, full_group.log_likelihood["y"].isel(draw=slice(0, 10)).values, rtol=RTOL
    )
    post = draws.posterior
    loc = np.einsum("cdk,nk->cdn", post["beta"].values, fit.features)
    scale = np.sqrt(post["sigma2"].values)[..., None]
    np.testing.assert_allclose(
        ours.values, stats.norm.logpdf(fit.outcome, loc, scale), rtol=RTOL, atol=1e-12
    )
    # the trap: each of PyMC's values is N/n times one row's term
    scaled = pm.compute_log_likelihood(
        draws.copy(), model=model, extend_inferencedata=False, progressbar=False
    )["y"].values
    assert scaled.shape == (CHAINS, 10, batch)
    unscaled = scaled / (N_ROWS / batch)
    found = np.isclose(unscaled[..., :, None], ours.values[..., None, :], rtol=1e-9).any(-1)
    assert found.all()
    assert not np.isclose(scaled[..., :, None], ours.values[..., None, :], rtol=1e-9).any()


# ---------------------------------------------------------------------- (c) LOO
def test_loo_on_every_row_equals_loo_on_pymc_group(fit, full_group, pymc_group):
    reference = fit.fresh()
    reference["log_likelihood"] = pymc_group
    want = azs.loo(reference, pointwise=True)
    got = azs.loo(full_group, pointwise=True)
    for name in ("elpd", "se", "p"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=RTOL)
    np.testing.assert_allclose(got.elpd_i.values, want.elpd_i.values, rtol=RTOL)
    np.testing.assert_allclose(got.pareto_k.values, want.pareto_k.values, rtol=1e-8)


def test_loo_subsample_reads_only_its_rows_and_matches_exact_loo(fit, full_group):
    exact = azs.loo(full_group, pointwise=True)
    m, extra = 100, 50
    # a budget that any read of every row at every draw exceeds: loo_subsample, its plpd
    # pass (one point x N rows) and update_subsample must stay within it
    budget = CHAINS * DRAWS * (m + extra)
    assert budget < CHAINS * DRAWS * N_ROWS
    inputs = loo_subsample_inputs(fit.idata, layer=fit.layer, max_values=budget)
    assert "log_likelihood" not in fit.idata.children  # the results are not changed
    result = azs.loo_subsample(**inputs, observations=m, pointwise=True, seed=4)
    assert result.n_data_points == N_ROWS and result.subsample_size == m
    # the subsample's elpd_i are exact PSIS-LOO's
    rows = np.asarray(result.loo_subsample_observations)
    np.testing.assert_allclose(
        result.elpd_i.values[rows], exact.elpd_i.values[rows], rtol=RTOL, atol=1e-12
    )
    # the approximation of every row: log p(y_i | posterior mean), by SciPy
    post = fit.idata.posterior
    loc = fit.features @ post["beta"].mean(("chain", "draw")).values
    scale = np.sqrt(post["sigma2"].mean().item())
    np.testing.assert_allclose(
        np.asarray(result.elpd_loo_approx), stats.norm.logpdf(fit.outcome, loc, scale), rtol=RTOL
    )
    assert 0 < result.subsampling_se < 2.0
    assert abs(result.elpd - exact.elpd) <= SE_BAND * result.subsampling_se
    # new rows given as indices (what docs/loo.md advises for large N)
    candidates = np.random.default_rng(5).choice(N_ROWS, 2 * extra, replace=False)
    new_rows = candidates[~np.isin(candidates, rows)][:extra]
    updated = azs.update_subsample(result, **inputs, observations=new_rows)
    assert updated.subsample_size == m + extra
    assert updated.subsampling_se < result.subsampling_se
    assert abs(updated.elpd - exact.elpd) <= SE_BAND * updated.subsampling_se
    # exact LOO on the lazy group would read every row at every draw: refused, not run
    with pytest.raises(ValueError, match="max_values"):
        azs.loo(inputs["data"])


def test_subsample_estimate_is_unbiased_with_the_srs_spread(fit, full_group):
    """Over 40 subsamples of 100 rows, the errors against exact LOO have mean zero and the
    spread of simple random sampling without replacement, computed from every row's
    ``d_i = elpd_i - plpd_i``; the reported SEs are of the right size (they understate the
    error somewhat at this size, see ``SE_BAND``: rms z 1.14 over 600 seeds, 0.82 to 1.5 over
    blocks of 40)."""
    exact = azs.loo(full_group, pointwise=True)
    inputs = loo_subsample_inputs(fit.idata, layer=fit.layer)
    m, n_seeds = 100, 40
    errors, z = [], []
    for seed in range(n_seeds):
        result = azs.loo_subsample(**inputs, observations=m, seed=seed)
        errors.append(result.elpd - exact.elpd)
        z.append(errors[-1] / result.subsampling_se)
    approx = np.asarray(result.elpd_loo_approx)
    d = exact.elpd_i.values - approx
    srs_sd = N_ROWS * np.sqrt((1 - m / N_ROWS) * d.var(ddof=1) / m)
    assert abs(np.mean(errors)) < 4 * srs_sd / np.sqrt(n_seeds), errors
    assert 0.6 < np.std(errors) / srs_sd < 1.5, (np.std(errors), srs_sd)
    assert np.sqrt(np.mean(np.square(z))) < 2.0, z


# ---------------------------------------------------------------------- (d) comparison
def test_compare_ranks_the_better_model_first(fit, intercept_fit):
    # on the same subsample of rows (the same seed and N): a paired comparison
    groups = {
        "slope": add_log_likelihood(fit.fresh(), layer=fit.layer, rows=100),
        "intercept": add_log_likelihood(intercept_fit.fresh(), layer=intercept_fit.layer, rows=100),
    }
    np.testing.assert_array_equal(
        groups["slope"].log_likelihood["y_dim_0"], groups["intercept"].log_likelihood["y_dim_0"]
    )
    table = azs.compare(groups)
    assert list(table.index) == ["slope", "intercept"]
    assert table.loc["intercept", "elpd_diff"] < -5 * table.loc["intercept", "dse"]
    assert table.loc["slope", "weight"] > 0.9
    # the estimate for all N rows: loo_subsample of each, on the same observations
    results = {
        name: azs.loo_subsample(
            **loo_subsample_inputs(f.idata, layer=f.layer), observations=50, pointwise=True
        )
        for name, f in (("slope", fit), ("intercept", intercept_fit))
    }
    table = azs.compare(results, method="pseudo-BMA")
    assert list(table.index) == ["slope", "intercept"]
    assert table.loc["intercept", "elpd_diff"] < -5 * table.loc["intercept", "dse"]
    assert table.loc["intercept", "subsampling_dse"] > 0


# ---------------------------------------------------------------------- (e) bad input
@pytest.mark.parametrize("rows", [0, -3, N_ROWS + 1, [], [0, 0], [1, N_ROWS], [-1], [0.5]])
def test_bad_rows_are_refused(fit, rows):
    with pytest.raises(ValueError, match="`rows`"):
        add_log_likelihood(fit.fresh(), layer=fit.layer, rows=rows)


def test_idata_without_posterior_is_refused(fit, full_group):
    with pytest.raises(ValueError, match="`idata` has no posterior"):
        add_log_likelihood(az.from_dict({"observed_data": {"y": fit.outcome}}), layer=fit.layer)
    with pytest.raises(ValueError, match="`idata` has no posterior"):
        loo_subsample_inputs(az.from_dict({"observed_data": {"y": fit.outcome}}), layer=fit.layer)
    with pytest.raises(TypeError, match="`idata` must be an xarray.DataTree"):
        add_log_likelihood(fit.idata.posterior.to_dataset(), layer=fit.layer)
    with pytest.raises(ValueError, match="overwrite=True"):
        add_log_likelihood(full_group, layer=fit.layer)


def test_model_not_matching_the_posterior_is_refused(fit):
    features, outcome = regression_data()
    with pm.Model() as renamed:
        s = pm.HalfNormal("s", 1.0)
        beta = pm.Normal("beta", 0.0, 1.0, shape=2)
        pm.Normal("y", pm.math.dot(features, beta), s, observed=outcome)
    with pytest.raises(ValueError, match=r"free variables \['s'\].*`model`"):
        add_log_likelihood(fit.fresh(), renamed)
    with pm.Model() as reshaped:
        pm.InverseGamma("sigma2", A0, B0)
        beta = pm.Normal("beta", 0.0, 1.0, shape=3)
        pm.Normal(
            "y",
            pm.math.dot(np.column_stack([features, features[:, 1]]), beta),
            1.0,
            observed=outcome,
        )
    with pytest.raises(ValueError, match=r"'beta' has shape \(3,\).*\(2,\)"):
        loo_subsample_inputs(fit.idata, reshaped)
    with pytest.raises(ValueError, match="`layer` was built on another model"):
        add_log_likelihood(fit.fresh(), renamed, layer=fit.layer)
