"""Shared fixtures and posterior checks.

Compiling a model's functions is the slow part of this suite (PyTensor's Numba backend
JIT-compiles each new graph), so every model here is built once per session and its
``MinibatchModel`` layer (compiled functions, MAP) is shared by all the steps built on it.
"""

from __future__ import annotations

import arviz as az
import numpy as np
import pymc as pm
import pytest

import pymc_bigdata as pmbd
from pymc_bigdata.demo import make_data

#: two-sided normal quantile for the per-coordinate checks: with fixed seeds a check is
#: deterministic, and at 4.5 a correct sampler fails one coordinate with probability ~7e-6
Z_BOUND = 4.5


def check_posterior(
    idata,
    var: str,
    ref_mean: np.ndarray,
    ref_sd: np.ndarray,
    *,
    ref_mean_se: np.ndarray | float = 0.0,
    ref_sd_se: np.ndarray | float = 0.0,
    sd_bias_ratio: float = 1.0,
    z: float = Z_BOUND,
) -> dict[str, np.ndarray]:
    """Assert the draws of ``var`` match a reference within Monte Carlo error.

    Mean: ``|mean - ref_mean| <= z * sqrt(MCSE_mean^2 + ref_mean_se^2)``.
    Sd: must lie in ``[ref_sd - band, ref_sd * sd_bias_ratio + band]`` (or the reverse when
    the ratio is below 1), ``band = z * sqrt(MCSE_sd^2 + ref_sd_se^2)``: a sampler's known
    discretisation bias on the sd (``sd_bias_ratio``, documented per sampler) widens the
    band on one side only.
    """
    post = idata.posterior[var]
    mean = post.mean(("chain", "draw")).values
    sd = post.std(("chain", "draw")).values
    mcse_mean = az.mcse(idata, var_names=[var], method="mean")[var].values
    mcse_sd = az.mcse(idata, var_names=[var], method="sd")[var].values
    mean_band = z * np.sqrt(mcse_mean**2 + np.square(ref_mean_se))
    sd_band = z * np.sqrt(mcse_sd**2 + np.square(ref_sd_se))
    lo = np.minimum(ref_sd, ref_sd * sd_bias_ratio) - sd_band
    hi = np.maximum(ref_sd, ref_sd * sd_bias_ratio) + sd_band
    mean_z = np.abs(mean - ref_mean) / np.sqrt(mcse_mean**2 + np.square(ref_mean_se))
    assert np.all(np.abs(mean - ref_mean) <= mean_band), (
        f"{var}: mean off by {mean_z.max():.2f} MCSE (bound {z}); mean {mean}, reference {ref_mean}"
    )
    assert np.all((sd >= lo) & (sd <= hi)), (
        f"{var}: sd {sd} outside [{lo}, {hi}] (reference {ref_sd}, bias ratio {sd_bias_ratio})"
    )
    return {"mean_z": mean_z, "sd_ratio": sd / ref_sd}


def laplace_importance_reference(
    log_post, theta_map: np.ndarray, precision: np.ndarray, n_draws: int, seed: int, df: float = 8.0
) -> dict[str, np.ndarray]:
    """Posterior mean and sd by importance sampling from a Student-t Laplace proposal.

    ``log_post(thetas)`` returns the exact full-data log posterior of each row of ``thetas``.
    Standard errors come from the delta method with the weights' effective sample size.
    """
    rng = np.random.default_rng(seed)
    d = len(theta_map)
    chol = np.linalg.cholesky(np.linalg.inv(precision))
    normal = rng.standard_normal((n_draws, d))
    scale = np.sqrt(df / rng.chisquare(df, size=n_draws))
    draws = theta_map + (normal * scale[:, None]) @ chol.T
    white = normal * scale[:, None]
    log_q = -0.5 * (df + d) * np.log1p(np.sum(white**2, axis=1) / df)
    log_w = log_post(draws) - log_q
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ draws
    var = w @ (draws - mean) ** 2
    ess = 1.0 / np.sum(w**2)
    sd = np.sqrt(var)
    return {
        "mean": mean,
        "sd": sd,
        "mean_se": sd / np.sqrt(ess),
        "sd_se": sd / np.sqrt(2 * ess) * 1.5,  # kurtosis allowance for the sd's sampling error
        "ess": ess,
    }


def logistic_data(n_rows: int, n_coefs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Correlated features (equicorrelation 0.5) and Bernoulli-logit outcomes, beta ~ N(0, .5²)."""
    return make_data(n_rows, n_coefs, seed, coef_sd=0.5)


def sample_two_chains(model, step, seed: int, draws: int = 1000, tune: int = 1000):
    """pm.sample (by default with its defaults, 1000 tune, 1000 draws), two sequential chains."""
    with model:
        return pm.sample(
            step=step,
            tune=tune,
            draws=draws,
            chains=2,
            cores=1,
            random_seed=seed,
            progressbar=False,
            compute_convergence_checks=False,
        )


def logistic_model(features: np.ndarray, outcome: np.ndarray):
    """beta ~ N(0, 1), y ~ Bernoulli(logit_p = X beta); returns the model and its layer with
    the MAP computed."""
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 1.0, shape=features.shape[1])
        pm.Bernoulli("y", logit_p=pm.math.dot(features, beta), observed=outcome)
    layer = pmbd.MinibatchModel(model)
    layer.map_estimate()
    return model, layer


@pytest.fixture(scope="session")
def small_logistic():
    """A 5,000-row, 3-coefficient logistic regression and its shared layer."""
    return logistic_model(*logistic_data(5_000, 3, seed=11))


@pytest.fixture(scope="session")
def noisy_normal():
    """y_i ~ N(mu, 1), mu ~ N(0, 10), N = 20,000; analytic posterior."""
    y = np.random.default_rng(31).normal(0.3, 1.0, size=20_000)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        pm.Normal("y", mu, 1.0, observed=y)
    precision = 1 / 100 + len(y)
    return model, pmbd.MinibatchModel(model), y.sum() / precision, 1 / np.sqrt(precision)


class MapSearchRan(Exception):
    """Raised by :func:`layer_without_map_search`'s layer when anything starts a MAP search."""


def layer_without_map_search(model) -> pmbd.MinibatchModel:
    """A fresh layer whose MAP search raises: a step built on it must validate its settings
    before any full-data pass."""
    layer = pmbd.MinibatchModel(model)

    def no_map_search(*args, **kwargs):
        raise MapSearchRan("the MAP search ran before the settings were validated")

    layer.find_map = no_map_search
    layer.map_estimate = no_map_search
    return layer


def check_declared_stats(step, idata) -> None:
    """Every stat the step declares is recorded, with its dtype's kind (PyMC keeps
    ``tune`` and ``warning`` out of ``sample_stats``)."""
    stats = idata.sample_stats
    for name, (dtype, _) in step.stats_dtypes_shapes.items():
        if name in ("warning", "tune"):
            continue
        assert name in stats, name
        assert np.dtype(stats[name].dtype).kind == np.dtype(dtype).kind, name


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``--dist loadgroup`` (CI's slow job) and put the notebooks first.

    A file's tests form one group, so that its module fixtures are built once, on one worker;
    each notebook is a group of its own: the slow notebooks are the longest units (under
    ``--dist loadfile`` their one file held 31 of the slow job's 60 minutes on one worker).
    Placed first, they start at once and the files fill in around them. Other ``--dist``
    modes ignore the groups; runs without xdist ignore both.
    """
    for item in items:
        module = item.nodeid.split("::")[0]
        if module.endswith("test_notebooks.py"):
            group = "notebook-" + item.name.replace("[", "-").replace("]", "")
        else:
            group = module
        item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: not item.nodeid.split("::")[0].endswith("test_notebooks.py"))
