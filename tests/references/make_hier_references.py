"""Reference posteriors of the hierarchies of ``tests/hard_models.py`` at big-data scale.

Full-data NUTS (PyMC's, no subsampling, nothing of pymc_bigdata), 4 chains, on each model
written partially centred by hand: an effect ``a_j = loc + scale^(1 - c_j) (w_j - c_j loc)``
with ``w_j ~ Normal(c_j loc, scale^c_j)`` and a fixed ``c_j = h_j / (1 + h_j)`` from a rough
information ``h_j`` (rows of the group times the likelihood's curvature and the true scale's
square, below). Any fixed ``c`` gives the same posterior of the model's variables (a
bijection with its Jacobian in ``w``'s prior); these spare NUTS both the funnel of the small
groups and the ridge of the large ones (in the non-centred form its trees ran to hundreds of
steps). Both parameterisations' variables come from the same draws (``a``, and
``z = (a - loc) / scale``). Stored as ``tests/references/<name>.npz`` with the keys of the
other references (``<var>__mean``, ``__sd``, ``__mean_se``, ``__sd_se``) and the run's
metadata. Run from the repository root, one model at a time::

    OMP_NUM_THREADS=1 .venv/bin/python tests/references/make_hier_references.py big_hier_logistic
"""

from __future__ import annotations

import math
import sys
import time
from functools import partial
from pathlib import Path

import arviz as az
import numpy as np
import pymc as pm

sys.path.insert(0, str(Path(__file__).parents[1]))
from hard_models import (  # noqa: E402
    REFERENCE_DIR,
    T_EFFECTS_DF,
    THREE_LEVEL_COUNTRIES,
    THREE_LEVEL_GROUPS,
    THREE_LEVEL_REGIONS,
    make_big_hier_logistic_data,
    make_crossed_logistic_data,
    make_crossed_ratings_data,
    make_group_logistic_data,
    make_hier_poisson_data,
    make_sparse_regions_data,
    make_t_effects_data,
    make_three_level_data,
    make_two_level_logistic_data,
)

DRAWS, TUNE, CHAINS, TARGET_ACCEPT = 2500, 1000, 4, 0.9
#: models whose funnel (data-poor regions, few of them; four countries) left divergences at 0.9
TARGET_ACCEPT_OF = {"sparse_regions": 0.99, "three_level": 0.99}


def summaries(name: str, draws: np.ndarray) -> dict[str, np.ndarray]:
    """Mean, sd and their Monte Carlo standard errors of ``draws`` (chain, draw, ...)."""
    data = az.convert_to_dataset({name: draws})
    mean_se = az.mcse(data, method="mean")[name].values
    sd_se = az.mcse(data, method="sd")[name].values
    flat = draws.reshape(-1, *draws.shape[2:])
    return {
        f"{name}__mean": np.ravel(flat.mean(axis=0)),
        f"{name}__sd": np.ravel(flat.std(axis=0)),
        f"{name}__mean_se": np.ravel(mean_se),
        f"{name}__sd_se": np.ravel(sd_se),
    }


def partially_centred(name: str, loc, scale, h: np.ndarray) -> pm.Deterministic:
    """The effect ``name`` (and its ``z_name``) written with ``c = h / (1 + h)``."""
    c = h / (1.0 + h)
    w = pm.Normal(f"w_{name}", c * loc, scale**c, shape=len(h))
    effect = pm.Deterministic(name, loc + scale ** (1.0 - c) * (w - c * loc))
    pm.Deterministic(f"z_{name}", (effect - loc) / scale)
    return effect


def big_hier_logistic() -> tuple[pm.Model, dict[str, str]]:
    """``big_hier_logistic``; ``h_j = 0.13 n_j`` (``p (1 - p) ~ 0.2``, ``tau^2 ~ 0.64``)."""
    group, X, y = make_big_hier_logistic_data()
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=3)
        a = partially_centred("a", mu_a, tau, 0.13 * np.bincount(group))
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    return model, {"mu_a": "mu_a", "tau": "tau", "slope": "slope", "a": "a", "z_a": "z"}


def hier_poisson() -> tuple[pm.Model, dict[str, str]]:
    """``hier_poisson``; ``h_j = 0.8 n_j`` (``exp(eta) ~ 2.2``, ``tau^2 ~ 0.36``)."""
    group, X, y = make_hier_poisson_data()
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=2)
        a = partially_centred("a", mu_a, tau, 0.8 * np.bincount(group))
        pm.Poisson("y", mu=pm.math.exp(a[group] + pm.math.dot(X, slope)), observed=y)
    return model, {"mu_a": "mu_a", "tau": "tau", "slope": "slope", "a": "a", "z_a": "z"}


def crossed_ratings() -> tuple[pm.Model, dict[str, str]]:
    """``crossed_ratings``; ``h = 20 s^2`` (20 ratings, sigma ~ 1, s_r ~ 0.5, s_i ~ 0.8)."""
    rater, item, y = make_crossed_ratings_data()
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        s_r = pm.HalfNormal("s_r", 1.0)
        s_i = pm.HalfNormal("s_i", 1.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        r = partially_centred("r", 0.0, s_r, np.full(rater.max() + 1, 20 * 0.25))
        i = partially_centred("i", 0.0, s_i, np.full(item.max() + 1, 20 * 0.64))
        pm.Normal("y", mu + r[rater] + i[item], sigma, observed=y)
    names = {"mu": "mu", "s_r": "s_r", "s_i": "s_i", "sigma": "sigma"}
    return model, names | {"r": "r", "z_r": "zr", "i": "i", "z_i": "zi"}


def crossed_logistic() -> tuple[pm.Model, dict[str, str]]:
    """``crossed_logistic``; ``h = 0.2 * 20 s^2`` (20 binary ratings, ``p (1 - p) ~ 0.2``,
    s_r ~ 0.5, s_i ~ 0.8)."""
    rater, item, x, y = make_crossed_logistic_data()
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        beta = pm.Normal("beta", 0.0, 2.0)
        s_r = pm.HalfNormal("s_r", 1.0)
        s_i = pm.HalfNormal("s_i", 1.0)
        r = partially_centred("r", 0.0, s_r, np.full(rater.max() + 1, 4 * 0.25))
        i = partially_centred("i", 0.0, s_i, np.full(item.max() + 1, 4 * 0.64))
        pm.Bernoulli("y", logit_p=mu + beta * x + r[rater] + i[item], observed=y)
    names = {"mu": "mu", "beta": "beta", "s_r": "s_r", "s_i": "s_i"}
    return model, names | {"r": "r", "z_r": "zr", "i": "i", "z_i": "zi"}


def two_level_logistic() -> tuple[pm.Model, dict[str, str]]:
    """``two_level_logistic``; groups ``h_j = 0.05 n_j`` (``p (1 - p) ~ 0.2``,
    ``tau_a^2 ~ 0.25``); regions ``h_r = 0.49 sum_j 1 / (0.25 + 1 / (0.2 n_j))`` over the
    region's groups (``tau_b^2 ~ 0.49``)."""
    group, region, X, y = make_two_level_logistic_data()
    counts = np.bincount(group, minlength=len(region))
    per_group = 1.0 / (0.25 + 1.0 / (0.2 * counts))
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau_b = pm.HalfNormal("tau_b", 1.0)
        tau_a = pm.HalfNormal("tau_a", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=2)
        b = partially_centred("b", mu, tau_b, 0.49 * np.bincount(region, weights=per_group))
        a = partially_centred("a", b[region], tau_a, 0.05 * counts)
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    names = {"mu": "mu", "tau_b": "tau_b", "tau_a": "tau_a", "slope": "slope"}
    return model, names | {"b": "b", "z_b": "z_b", "a": "a", "z_a": "z_a"}


def sparse_regions() -> tuple[pm.Model, dict[str, str]]:
    """``sparse_regions``; groups ``h_j = 0.09 n_j`` (``tau_a^2 ~ 0.09``, ``sigma = 1``);
    regions non-centred."""
    group, region, x, y = make_sparse_regions_data()
    counts = np.bincount(group, minlength=len(region))
    per_group = 1.0 / (0.09 + 1.0 / counts)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau_b = pm.HalfNormal("tau_b", 1.0)
        tau_a = pm.HalfNormal("tau_a", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        # regions non-centred (c = 0): with 12 regions tau_b reaches near 0, where any c > 0
        # kept a divergence at target_accept 0.99 (h_r = 0.16 sum_j 1 / (0.09 + 1 / n_j))
        b = partially_centred("b", mu, tau_b, 0.0 * np.bincount(region, weights=per_group))
        a = partially_centred("a", b[region], tau_a, 0.09 * counts)
        pm.Normal("y", a[group] + slope * x, sigma, observed=y)
    names = {"mu": "mu", "tau_b": "tau_b", "tau_a": "tau_a", "slope": "slope", "sigma": "sigma"}
    return model, names | {"b": "b", "z_b": "z_b", "a": "a", "z_a": "z_a"}


def group_logistic() -> tuple[pm.Model, dict[str, str]]:
    """``group_logistic``; ``h_j = 0.05 n_j`` (``p (1 - p) ~ 0.2``, ``tau^2 ~ 0.25``), about
    the groups' regression ``gamma[0] + gamma[1] u``."""
    group, u, X, y = make_group_logistic_data()
    with pm.Model() as model:
        gamma = pm.Normal("gamma", 0.0, 2.0, shape=2)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=2)
        a = partially_centred("a", gamma[0] + gamma[1] * u, tau, 0.05 * np.bincount(group))
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    return model, {"gamma": "gamma", "tau": "tau", "slope": "slope", "a": "a", "z_a": "z"}


def gaussian_rows(group: np.ndarray, x: np.ndarray, y: np.ndarray, a, slope, sigma) -> None:
    """``y ~ Normal(a[group] + slope x, sigma)`` as a ``pm.Potential``, read through each
    group's sufficient statistics: the same log-likelihood, exactly, at the cost of a few
    dozen groups instead of tens of thousands of rows."""
    count = np.bincount(group).astype(np.float64)
    sums = {
        name: np.bincount(group, weights=values, minlength=len(count))
        for name, values in {"y": y, "x": x, "xy": x * y, "xx": x * x, "yy": y * y}.items()
    }
    squares = (
        sums["yy"] - 2.0 * a * sums["y"] - 2.0 * slope * sums["xy"] + count * a**2
        + 2.0 * a * slope * sums["x"] + slope**2 * sums["xx"]
    )  # fmt: skip
    pm.Potential("y", pm.math.sum(-0.5 * squares / sigma**2 - count * pm.math.log(sigma)))


def t_effects(sampled_df: bool = False) -> tuple[pm.Model, dict[str, str]]:
    """``t_effects``, its Gaussian rows read through each group's sufficient statistics
    (:func:`gaussian_rows`); ``h_j =
    0.2 n_j`` (``tau^2 / sigma^2 ~ 0.49 / 2.25``), the effect written partially centred with
    a Student-t ``w_j ~ StudentT(4, c_j mu, tau^c_j)`` (the same loc-scale map); with
    ``sampled_df`` (``t_effects_nu``), ``nu ~ Gamma(2, 0.1)`` in place of 4."""
    group, x, y = make_t_effects_data()
    count = np.bincount(group)
    n_groups = len(count)
    c = 0.2 * count / (1.0 + 0.2 * count)
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        nu = pm.Gamma("nu", 2.0, 0.1) if sampled_df else T_EFFECTS_DF
        w = pm.StudentT("w_a", nu=nu, mu=c * mu, sigma=tau**c, shape=n_groups)
        a = pm.Deterministic("a", mu + tau ** (1.0 - c) * (w - c * mu))
        pm.Deterministic("z_a", (a - mu) / tau)
        slope = pm.Normal("slope", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        gaussian_rows(group, x, y, a, slope, sigma)
    names = {"mu": "mu", "tau": "tau", "slope": "slope", "sigma": "sigma", "a": "a", "z_a": "z"}
    return model, names | ({"nu": "nu"} if sampled_df else {})


def three_level() -> tuple[pm.Model, dict[str, str]]:
    """``three_level``, its Gaussian rows read through each group's sufficient statistics (as
    ``t_effects``); the groups partially centred with ``h_j = 0.09 n_j`` (``tg^2 / sigma^2``),
    the regions and countries non-centred."""
    group, x, y = make_three_level_data()
    n_c, n_r, n_g = THREE_LEVEL_COUNTRIES, THREE_LEVEL_REGIONS, THREE_LEVEL_GROUPS
    in_country, in_region = np.arange(n_r) % n_c, np.arange(n_g) % n_r
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tc, tr, tg = (pm.HalfNormal(name, 1.0) for name in ("tc", "tr", "tg"))
        c = pm.Deterministic("c", mu + tc * pm.Normal("w_c", 0.0, 1.0, shape=n_c))
        r = pm.Deterministic("r", c[in_country] + tr * pm.Normal("w_r", 0.0, 1.0, shape=n_r))
        a = partially_centred("a", r[in_region], tg, 0.09 * np.bincount(group))
        pm.Deterministic("z_c", (c - mu) / tc)
        pm.Deterministic("z_r", (r - c[in_country]) / tr)
        slope = pm.Normal("slope", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        gaussian_rows(group, x, y, a, slope, sigma)
    names = {"mu": "mu", "tc": "tc", "tr": "tr", "tg": "tg", "slope": "slope", "sigma": "sigma"}
    return model, names | {"c": "c", "r": "r", "a": "a", "z_c": "zc", "z_r": "zr", "z_a": "zg"}


#: name: (builder returning the model and {variable in it: name in the reference}, seed)
MODELS = {
    "big_hier_logistic": (big_hier_logistic, 108),
    "hier_poisson": (hier_poisson, 109),
    "crossed_ratings": (crossed_ratings, 110),
    "crossed_logistic": (crossed_logistic, 114),
    "two_level_logistic": (two_level_logistic, 111),
    "sparse_regions": (sparse_regions, 112),
    "group_logistic": (group_logistic, 113),
    "t_effects": (t_effects, 115),
    "t_effects_nu": (partial(t_effects, sampled_df=True), 116),
    "three_level": (three_level, 117),
}


def main(name: str) -> None:
    build, seed = MODELS[name]
    target_accept = TARGET_ACCEPT_OF.get(name, TARGET_ACCEPT)
    model, names = build()
    start = time.time()
    with model:
        idata = pm.sample(
            DRAWS,
            tune=TUNE,
            chains=CHAINS,
            cores=1,
            nuts_sampler="pymc",
            target_accept=target_accept,
            random_seed=seed,
            progressbar=False,
        )
    wall = time.time() - start
    post = idata.posterior
    out, min_ess = {}, math.inf
    for var, key in names.items():
        draws = post[var].values
        is_scale = var in ("tau", "s_r", "s_i", "sigma", "tau_a", "tau_b", "nu", "tc", "tr", "tg")
        out |= summaries(f"{key}_log__" if is_scale else key, np.log(draws) if is_scale else draws)
        ess = az.ess(az.from_dict({"posterior": {"x": draws}}), method="bulk")["x"].values
        min_ess = min(min_ess, float(np.min(ess)))
    divergences = int(idata.sample_stats["diverging"].values.sum())
    out |= {
        "method": np.array("nuts"),
        "n_draws": np.array(DRAWS * CHAINS),
        "seed": np.array(seed),
        "target_accept": np.array(target_accept),
        "wall_time_s": np.array(wall),
        "min_bulk_ess": np.array(min_ess),
        "divergences": np.array(divergences),
    }
    np.savez_compressed(REFERENCE_DIR / f"{name}.npz", **out)
    print(f"{name}: {wall:.0f} s, min bulk ESS {min_ess:.0f}, {divergences} divergences")


if __name__ == "__main__":
    main(sys.argv[1])
