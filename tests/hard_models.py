"""Test targets where the Laplace (Gaussian-at-the-MAP) approximation is measurably wrong.

Every model comes as a deterministic data generator (``make_<name>_data``, numpy arrays from
``np.random.default_rng(seed)``), a builder taking that data (``<name>_model``) and a
shortcut with the default sizes (``<name>(...)``) that does both. ``HARD_MODELS`` maps the
names of the models with a stored reference posterior (``tests/references/<name>.npz``,
made by ``tests/references/make_references.py``) to zero-argument builders, and
``load_reference(name)`` reads one back.

Reference files hold, for every free variable, its unconstrained value variable (e.g.
``sigma_log__``) and the Deterministic ``a`` of the non-centred model, flattened arrays
``<var>__mean``, ``<var>__sd``, ``<var>__mean_se`` and ``<var>__sd_se`` (the Monte Carlo
standard errors of the reference itself), plus ``<value var>__laplace_mean`` and
``<value var>__laplace_sd`` (MAP and inverse-Hessian sd of ``model.logp(jacobian=True)`` in
the unconstrained space, the space PyMC samples in).

``many_groups_linear`` is exactly Gaussian: ``many_groups_linear_posterior`` gives its
posterior by linear algebra, so it has no stored file.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pymc as pm
import scipy.linalg
import scipy.optimize

from pymc_bigdata.datasets import sbps_paper_logistic

REFERENCE_DIR = Path(__file__).parent / "references"


# ---------------------------------------------------------------------------------------------
# a. skewed logistic regression


def make_skewed_logistic_data(n_rows: int = 400, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Rare-ish outcome logistic data: ``X = [1, x1, x2]``, true beta ``(-3, 1, -0.5)``.

    Returns
    -------
    X : ndarray, shape (n_rows, 3)
        A column of ones and two standard-normal covariates.
    y : ndarray of int, shape (n_rows,)
        Bernoulli outcomes, about 7% ones (about 30 events at 400 rows).
    """
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n_rows), rng.standard_normal((n_rows, 2))])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-X @ np.array([-3.0, 1.0, -0.5]))))
    return X, y


def skewed_logistic_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    """``beta ~ Normal(0, 2.5)`` (shape 3), ``y ~ Bernoulli(logit_p = X @ beta)``.

    What makes it hard: 400 rows and 31 events, so the posterior is skewed: the intercept
    has a long left tail (its posterior mean is ~0.2 sd below the MAP, the slope's ~0.1 sd
    beyond it) and the Laplace sds are 1-2% too small.
    """
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 2.5, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    return model


def skewed_logistic(n_rows: int = 400, seed: int = 1) -> pm.Model:
    """Skewed small-N logistic regression (see ``skewed_logistic_model``) on fresh data."""
    return skewed_logistic_model(*make_skewed_logistic_data(n_rows, seed))


# ---------------------------------------------------------------------------------------------
# b. linear regression with correlated predictors and an unknown scale


def make_scale_regression_data(
    n_rows: int = 5000, seed: int = 2, n_coefs: int = 25
) -> tuple[np.ndarray, np.ndarray]:
    """Equicorrelated (rho = 0.9) Gaussian features, true ``b ~ N(0, 0.5^2)``, noise sd 2.

    Returns
    -------
    X : ndarray, shape (n_rows, n_coefs)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    rho = 0.9
    common = rng.standard_normal((n_rows, 1))
    X = np.sqrt(rho) * common + np.sqrt(1.0 - rho) * rng.standard_normal((n_rows, n_coefs))
    b = rng.normal(0.0, 0.5, size=n_coefs)
    y = X @ b + rng.normal(0.0, 2.0, size=n_rows)
    return X, y


def scale_regression_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    """``b ~ Normal(0, 1)`` (shape 25), ``sigma ~ HalfStudentT(3, 1)``, ``y ~ N(X b, sigma)``.

    What makes it hard: the 25 predictors are strongly correlated (ill-conditioned
    posterior for a sampler without a dense mass matrix) and the scale ``sigma`` is sampled
    through ``sigma_log__``. The posterior is close to Gaussian in ``b`` (d = 26, 5,000
    rows), so this one mainly checks the scale parameter: the joint mode ignores the 25
    degrees of freedom spent on ``b``, so the Laplace mean of ``sigma_log__`` is ~0.26
    posterior sd too low (``log sigma`` off by ``p / 2n``).
    """
    with pm.Model() as model:
        b = pm.Normal("b", 0.0, 1.0, shape=X.shape[1])
        sigma = pm.HalfStudentT("sigma", nu=3, sigma=1.0)
        pm.Normal("y", mu=pm.math.dot(X, b), sigma=sigma, observed=y)
    return model


def scale_regression(n_rows: int = 5000, seed: int = 2) -> pm.Model:
    """Correlated-predictor regression with unknown scale (see ``scale_regression_model``)."""
    return scale_regression_model(*make_scale_regression_data(n_rows, seed))


# ---------------------------------------------------------------------------------------------
# c. normal mean and scale from few rows


def make_scale_few_rows_data(n_rows: int = 30, seed: int = 3) -> np.ndarray:
    """``y ~ Normal(1, 2)``: returns ``y``, shape (n_rows,)."""
    rng = np.random.default_rng(seed)
    return rng.normal(1.0, 2.0, size=n_rows)


def scale_few_rows_model(y: np.ndarray) -> pm.Model:
    """``mu ~ Normal(0, 10)``, ``sigma ~ HalfNormal(5)``, ``y ~ Normal(mu, sigma)``.

    What makes it hard: with 30 rows the posterior of ``sigma`` is visibly right-skewed
    and ``mu`` has Student-t-like tails; the Laplace fit understates the sd of ``mu`` by
    ~5% and of ``sigma_log__`` by ~4%, and puts the mean of ``sigma_log__`` ~0.26 sd low.
    """
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 10.0)
        sigma = pm.HalfNormal("sigma", 5.0)
        pm.Normal("y", mu=mu, sigma=sigma, observed=y)
    return model


def scale_few_rows(n_rows: int = 30, seed: int = 3) -> pm.Model:
    """Normal mean and scale from few rows (see ``scale_few_rows_model``)."""
    return scale_few_rows_model(make_scale_few_rows_data(n_rows, seed))


# ---------------------------------------------------------------------------------------------
# d. hierarchical logistic regression, very uneven groups


def make_hier_logistic_data(
    n_groups: int = 40, seed: int = 4
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group sizes ``round(20 * 100**(k / (n_groups - 1)))`` (20 to 2,000, shuffled).

    True ``mu_a = -1``, ``tau = 0.8``, ``slope = 0.5``; one standard-normal covariate.
    With 40 groups there are 17,798 rows.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
        Group index of each row, in ``0 .. n_groups - 1``.
    x : ndarray, shape (n_rows,)
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = np.round(20.0 * 100.0 ** (np.arange(n_groups) / (n_groups - 1))).astype(int)
    sizes = rng.permutation(sizes)
    group = np.repeat(np.arange(n_groups), sizes)
    a = -1.0 + 0.8 * rng.standard_normal(n_groups)
    x = rng.standard_normal(len(group))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(a[group] + 0.5 * x))))
    return group, x, y


def hier_logistic_model(
    group: np.ndarray, x: np.ndarray, y: np.ndarray, *, centred: bool, n_groups: int | None = None
) -> pm.Model:
    """Varying-intercept logistic regression, centred or non-centred.

    ``mu_a ~ Normal(0, 2)``, ``tau ~ HalfNormal(1)``, ``slope ~ Normal(0, 2)``; centred:
    ``a ~ Normal(mu_a, tau)``; non-centred: ``z ~ Normal(0, 1)``,
    ``a = Deterministic(mu_a + tau * z)``; ``y ~ Bernoulli(logit_p = a[group] + slope * x)``.

    What makes it hard: the group sizes span 20 to 2,000 rows, so small groups make a
    funnel in ``(tau, a)`` for the centred form while large groups make ``z`` strongly
    coupled to ``(mu_a, tau)`` in the non-centred form (NUTS mixes ``mu_a``, ``tau`` and
    ``z`` ~10x worse there). The Laplace fit depends on the parameterisation: centred, its
    ``tau_log__`` mean is ~0.8 sd low, its ``mu_a`` sd ~11% small and the small groups'
    ``a`` means 0.1-0.2 sd off; non-centred, the joint mode has ``tau`` ~3x too large
    (``tau_log__`` ~9 sd off) and the ``mu_a`` and ``z`` sds are off by factors 0.5-3.
    """
    n_groups = int(group.max()) + 1 if n_groups is None else n_groups
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0)
        if centred:
            a = pm.Normal("a", mu_a, tau, shape=n_groups)
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=n_groups)
            a = pm.Deterministic("a", mu_a + tau * z)
        pm.Bernoulli("y", logit_p=a[group] + slope * x, observed=y)
    return model


def hier_logistic(centred: bool, n_groups: int = 40, seed: int = 4) -> pm.Model:
    """Hierarchical logistic regression (see ``hier_logistic_model``); same data either way."""
    group, x, y = make_hier_logistic_data(n_groups, seed)
    return hier_logistic_model(group, x, y, centred=centred, n_groups=n_groups)


# ---------------------------------------------------------------------------------------------
# d2. the same hierarchy at big-data scale: groups of 8 to ~18,000 rows


def geometric_sizes(n_rows: int, n_groups: int, smallest: int) -> np.ndarray:
    """Group sizes ``smallest * r**k`` (k = 0 .. n_groups - 1), rounded, with the ratio ``r``
    solved so that they sum to ``n_rows`` (the largest group takes the rounding)."""
    ratio = scipy.optimize.brentq(
        lambda r: (smallest * r ** np.arange(n_groups)).sum() - n_rows, 1.0 + 1e-9, 10.0
    )
    sizes = np.round(smallest * ratio ** np.arange(n_groups)).astype(int)
    sizes[-1] += n_rows - sizes.sum()
    return sizes


def make_big_hier_logistic_data(
    n_rows: int = 100_000, n_groups: int = 40, seed: int = 6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 8 rows up, their ratio solved so that they sum to
    ``n_rows`` (8 to 17,957 rows at the defaults), shuffled; three standard-normal
    covariates. True ``mu_a = -1``, ``tau = 0.8``, ``slope = (0.5, -0.3, 0.2)``.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    X : ndarray, shape (n_rows, 3)
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = geometric_sizes(n_rows, n_groups, smallest=8)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    a = -1.0 + 0.8 * rng.standard_normal(n_groups)
    X = rng.standard_normal((n_rows, 3))
    eta = a[group] + X @ np.array([0.5, -0.3, 0.2])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-eta)))
    return group, X, y


def big_hier_logistic_model(
    group: np.ndarray, X: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """``hier_logistic_model`` with three covariates (``slope`` of shape 3): the
    varying-intercept logistic regression as PyMC's docs teach it, at 100,000 rows, where a
    data-rich group's ``z`` is pinned to ``(mu_a, tau)`` in the non-centred form."""
    n_groups = int(group.max()) + 1
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=3)
        if centred:
            a = pm.Normal("a", mu_a, tau, shape=n_groups)
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=n_groups)
            a = pm.Deterministic("a", mu_a + tau * z)
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    return model


def big_hier_logistic(centred: bool, n_rows: int = 100_000, seed: int = 6) -> pm.Model:
    """The big hierarchical logistic regression (see ``big_hier_logistic_model``)."""
    group, X, y = make_big_hier_logistic_data(n_rows, seed=seed)
    return big_hier_logistic_model(group, X, y, centred=centred)


# ---------------------------------------------------------------------------------------------
# d2b. a count hierarchy: Poisson, 60 groups of 5 to ~20,000 rows


def make_hier_poisson_data(
    n_rows: int = 150_000, n_groups: int = 60, seed: int = 7
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (shuffled), two
    standard-normal covariates; ``y ~ Poisson(exp(a[g] + X (0.3, -0.2)))`` with
    ``a ~ Normal(0.5, 0.6)``.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    X : ndarray, shape (n_rows, 2)
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = geometric_sizes(n_rows, n_groups, smallest=5)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    a = 0.5 + 0.6 * rng.standard_normal(n_groups)
    X = rng.standard_normal((n_rows, 2))
    y = rng.poisson(np.exp(a[group] + X @ np.array([0.3, -0.2])))
    return group, X, y


def hier_poisson_model(
    group: np.ndarray, X: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """Varying-intercept Poisson regression: ``mu_a ~ Normal(0, 2)``,
    ``tau ~ HalfNormal(1)``, ``slope ~ Normal(0, 2)`` (2); ``a ~ Normal(mu_a, tau)``
    (centred) or ``a = mu_a + tau * z`` (non-centred); ``y ~ Poisson(exp(a[g] + X slope))``."""
    n_groups = int(group.max()) + 1
    with pm.Model() as model:
        mu_a = pm.Normal("mu_a", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=2)
        if centred:
            a = pm.Normal("a", mu_a, tau, shape=n_groups)
        else:
            z = pm.Normal("z", 0.0, 1.0, shape=n_groups)
            a = pm.Deterministic("a", mu_a + tau * z)
        pm.Poisson("y", mu=pm.math.exp(a[group] + pm.math.dot(X, slope)), observed=y)
    return model


def hier_poisson(centred: bool, seed: int = 7) -> pm.Model:
    """The Poisson hierarchy (see ``hier_poisson_model``)."""
    group, X, y = make_hier_poisson_data(seed=seed)
    return hier_poisson_model(group, X, y, centred=centred)


# ---------------------------------------------------------------------------------------------
# d2t. heavy-tailed effects: Student-t group effects, 40 groups of 5 to 8,710 rows

#: the effects' degrees of freedom (in the data and in the model)
T_EFFECTS_DF = 4.0


def make_t_effects_data(
    n_rows: int = 50_000, n_groups: int = 40, seed: int = 15
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (5 to 8,710 at the
    defaults; shuffled), one standard-normal covariate; true ``a_j = 0.5 + 0.7 t_j`` with
    ``t_j`` Student-t with ``T_EFFECTS_DF`` degrees of freedom, and
    ``y = a[group] + 0.4 x + 1.5 e`` with standard normals ``e``.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    x : ndarray, shape (n_rows,)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = geometric_sizes(n_rows, n_groups, smallest=5)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    a = 0.5 + 0.7 * rng.standard_t(T_EFFECTS_DF, size=n_groups)
    x = rng.standard_normal(n_rows)
    y = a[group] + 0.4 * x + 1.5 * rng.standard_normal(n_rows)
    return group, x, y


def t_effects_model(
    group: np.ndarray, x: np.ndarray, y: np.ndarray, *, centred: bool, sampled_df: bool = False
) -> pm.Model:
    """Varying intercepts with heavy tails: ``mu ~ Normal(0, 2)``, ``tau ~ HalfNormal(1)``,
    ``a ~ StudentT(4, mu, tau)`` (centred) or ``z ~ StudentT(4, 0, 1)``, ``a = mu + tau * z``
    (non-centred); ``slope ~ Normal(0, 1)``, ``sigma ~ HalfNormal(2)``,
    ``y ~ Normal(a[group] + slope x, sigma)``. With ``sampled_df`` the degrees of freedom
    are sampled, ``nu ~ Gamma(2, 0.1)`` (the prior of Juárez & Steel 2010)."""
    n_groups = int(group.max()) + 1
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau = pm.HalfNormal("tau", 1.0)
        nu = pm.Gamma("nu", 2.0, 0.1) if sampled_df else T_EFFECTS_DF
        if centred:
            a = pm.StudentT("a", nu=nu, mu=mu, sigma=tau, shape=n_groups)
        else:
            z = pm.StudentT("z", nu=nu, mu=0.0, sigma=1.0, shape=n_groups)
            a = pm.Deterministic("a", mu + tau * z)
        slope = pm.Normal("slope", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", a[group] + slope * x, sigma, observed=y)
    return model


def t_effects(centred: bool, seed: int = 15, sampled_df: bool = False) -> pm.Model:
    """The Student-t effects model (see ``t_effects_model``)."""
    data = make_t_effects_data(seed=seed)
    return t_effects_model(*data, centred=centred, sampled_df=sampled_df)


# ---------------------------------------------------------------------------------------------
# d2u. three levels: 48 groups of 5 to 8,828 rows in 12 regions in 4 countries

#: each region's country and each group's region (fixed patterns)
THREE_LEVEL_COUNTRIES, THREE_LEVEL_REGIONS, THREE_LEVEL_GROUPS = 4, 12, 48


def make_three_level_data(
    n_rows: int = 60_000, seed: int = 21
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (shuffled); region ``r``
    in country ``r % 4``, group ``j`` in region ``j % 12``; true country effects
    ``0.5 + 0.6 e``, regions about them with sd 0.4, groups about theirs with sd 0.3, and
    ``y = a[group] + 0.4 x + e`` with standard normals ``x``, ``e``.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    x : ndarray, shape (n_rows,)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    n_c, n_r, n_g = THREE_LEVEL_COUNTRIES, THREE_LEVEL_REGIONS, THREE_LEVEL_GROUPS
    sizes = geometric_sizes(n_rows, n_g, smallest=5)
    group = np.repeat(np.arange(n_g), rng.permutation(sizes))
    country = 0.5 + 0.6 * rng.standard_normal(n_c)
    region = country[np.arange(n_r) % n_c] + 0.4 * rng.standard_normal(n_r)
    a = region[np.arange(n_g) % n_r] + 0.3 * rng.standard_normal(n_g)
    x = rng.standard_normal(n_rows)
    y = a[group] + 0.4 * x + rng.standard_normal(n_rows)
    return group, x, y


def three_level_model(
    group: np.ndarray, x: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """Groups in regions in countries: ``mu ~ Normal(0, 2)``, scales ``tc``, ``tr``, ``tg``
    ``~ HalfNormal(1)``; countries ``c`` about ``mu``, regions ``r`` about ``c[r % 4]``,
    groups ``a`` about ``r[j % 12]`` (centred ``Normal``, or ``loc + scale * z``);
    ``y ~ Normal(a[group] + slope x, sigma)``."""
    n_c, n_r, n_g = THREE_LEVEL_COUNTRIES, THREE_LEVEL_REGIONS, THREE_LEVEL_GROUPS
    in_country, in_region = np.arange(n_r) % n_c, np.arange(n_g) % n_r
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tc, tr, tg = (pm.HalfNormal(name, 1.0) for name in ("tc", "tr", "tg"))
        if centred:
            c = pm.Normal("c", mu, tc, shape=n_c)
            r = pm.Normal("r", c[in_country], tr, shape=n_r)
            a = pm.Normal("a", r[in_region], tg, shape=n_g)
        else:
            c = pm.Deterministic("c", mu + tc * pm.Normal("zc", 0.0, 1.0, shape=n_c))
            r = pm.Deterministic("r", c[in_country] + tr * pm.Normal("zr", 0.0, 1.0, shape=n_r))
            a = pm.Deterministic("a", r[in_region] + tg * pm.Normal("zg", 0.0, 1.0, shape=n_g))
        slope = pm.Normal("slope", 0.0, 1.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        pm.Normal("y", a[group] + slope * x, sigma, observed=y)
    return model


def three_level(centred: bool, seed: int = 21) -> pm.Model:
    """The three-level model (see ``three_level_model``)."""
    return three_level_model(*make_three_level_data(seed=seed), centred=centred)


# ---------------------------------------------------------------------------------------------
# d2c. two levels: groups nested in regions, 60 groups of 5 to ~7,000 rows in 6 regions


def make_two_level_logistic_data(
    n_rows: int = 60_000, n_regions: int = 6, n_groups: int = 60, seed: int = 11
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (shuffled), each group in
    region ``j % n_regions``; two standard-normal covariates. True region effects
    ``b ~ Normal(-1, 0.7)``, group effects ``a ~ Normal(b[region], 0.5)``, slope
    ``(0.5, -0.3)``.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    region : ndarray of int, shape (n_groups,)
        Each group's region.
    X : ndarray, shape (n_rows, 2)
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = geometric_sizes(n_rows, n_groups, smallest=5)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    region = np.arange(n_groups) % n_regions
    b = -1.0 + 0.7 * rng.standard_normal(n_regions)
    a = b[region] + 0.5 * rng.standard_normal(n_groups)
    X = rng.standard_normal((n_rows, 2))
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-(a[group] + X @ np.array([0.5, -0.3])))))
    return group, region, X, y


def _nested_effects(region: np.ndarray, mu, tau_b, tau_a, centred: bool):
    """Region effects ``b`` and group effects ``a`` nested in them (in the model context):
    ``b ~ Normal(mu, tau_b)``, ``a ~ Normal(b[region], tau_a)`` (centred), or
    ``b = mu + tau_b z_b``, ``a = b[region] + tau_a z_a`` (non-centred)."""
    n_regions, n_groups = int(region.max()) + 1, len(region)
    if centred:
        b = pm.Normal("b", mu, tau_b, shape=n_regions)
        return pm.Normal("a", b[region], tau_a, shape=n_groups)
    b = pm.Deterministic("b", mu + tau_b * pm.Normal("z_b", 0.0, 1.0, shape=n_regions))
    return pm.Deterministic("a", b[region] + tau_a * pm.Normal("z_a", 0.0, 1.0, shape=n_groups))


def two_level_logistic_model(
    group: np.ndarray, region: np.ndarray, X: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """Groups nested in regions: ``mu ~ Normal(0, 2)``, ``tau_b, tau_a ~ HalfNormal(1)``,
    ``slope ~ Normal(0, 2)`` (2); region effects ``b ~ Normal(mu, tau_b)`` and group effects
    ``a ~ Normal(b[region], tau_a)`` (centred), or ``b = mu + tau_b z_b`` and
    ``a = b[region] + tau_a z_a`` with standard-normal ``z_b``, ``z_a`` (non-centred);
    ``y ~ Bernoulli(logit_p = a[group] + X slope)``. The group effect's ``loc`` is another
    effect, indexed by the group's region."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau_b = pm.HalfNormal("tau_b", 1.0)
        tau_a = pm.HalfNormal("tau_a", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=2)
        a = _nested_effects(region, mu, tau_b, tau_a, centred)
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    return model


def two_level_logistic(centred: bool, seed: int = 11) -> pm.Model:
    """The two-level hierarchy (see ``two_level_logistic_model``)."""
    group, region, X, y = make_two_level_logistic_data(seed=seed)
    return two_level_logistic_model(group, region, X, y, centred=centred)


def make_sparse_regions_data(
    rich_regions: int = 3, poor_regions: int = 9, seed: int = 12
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Two levels where most regions are data-poor: ``rich_regions`` regions of 3 groups of
    1,000 to 4,000 rows, then ``poor_regions`` regions of 1 or 2 groups of 3 to 8 rows
    (rows in group order). True ``b ~ Normal(0.5, 0.4)``, ``a ~ Normal(b[region], 0.3)``,
    slope 0.7 on one standard-normal covariate, residual sd 1.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    region : ndarray of int, shape (n_groups,)
    x : ndarray, shape (n_rows,)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    per_region = [3] * rich_regions + list(rng.integers(1, 3, poor_regions))
    region = np.repeat(np.arange(len(per_region)), per_region)
    rich = region < rich_regions
    sizes = np.where(rich, rng.integers(1000, 4001, len(region)), rng.integers(3, 9, len(region)))
    group = np.repeat(np.arange(len(region)), sizes)
    b = 0.5 + 0.4 * rng.standard_normal(len(per_region))
    a = b[region] + 0.3 * rng.standard_normal(len(region))
    x = rng.standard_normal(len(group))
    y = a[group] + 0.7 * x + rng.standard_normal(len(group))
    return group, region, x, y


def sparse_regions_model(
    group: np.ndarray, region: np.ndarray, x: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """``y ~ Normal(a[group] + slope x, sigma)`` with groups nested in regions, written as
    ``two_level_logistic_model`` writes them (``mu ~ Normal(0, 2)``,
    ``tau_b, tau_a ~ HalfNormal(1)``, ``slope ~ Normal(0, 2)``, ``sigma ~ HalfNormal(2)``).
    Centred, the data-poor regions make a funnel in ``(tau_b, b)``."""
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 2.0)
        tau_b = pm.HalfNormal("tau_b", 1.0)
        tau_a = pm.HalfNormal("tau_a", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        a = _nested_effects(region, mu, tau_b, tau_a, centred)
        pm.Normal("y", a[group] + slope * x, sigma, observed=y)
    return model


def sparse_regions(centred: bool, seed: int = 12) -> pm.Model:
    """The two-level hierarchy with data-poor regions (see ``sparse_regions_model``)."""
    return sparse_regions_model(*make_sparse_regions_data(seed=seed), centred=centred)


# ---------------------------------------------------------------------------------------------
# d3. crossed random effects: thousands of raters x thousands of items, 20 ratings each


def _crossed_design(
    n_raters: int, n_items: int, per_rater: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each rater's ``per_rater`` rows, and the items in a random order, each rated as often
    (``n_raters * per_rater / n_items`` times): the rater and item index of every row."""
    n_rows = n_raters * per_rater
    rater = np.repeat(np.arange(n_raters), per_rater)
    item = rng.permutation(np.resize(np.arange(n_items), n_rows))
    return rater, item


def make_crossed_ratings_data(
    n_raters: int = 2000, n_items: int = 2000, per_rater: int = 20, seed: int = 9
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each rater rates ``per_rater`` items, each item is rated as often (every item
    ``n_raters * per_rater / n_items`` times); ``y = 3 + 0.5 zr[rater] + 0.8 zi[item] + e``
    with standard-normal ``zr``, ``zi`` and ``e``.

    Returns
    -------
    rater, item : ndarray of int, shape (n_rows,)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    rater, item = _crossed_design(n_raters, n_items, per_rater, rng)
    n_rows = len(rater)
    effects_r = 0.5 * rng.standard_normal(n_raters)
    effects_i = 0.8 * rng.standard_normal(n_items)
    y = 3.0 + effects_r[rater] + effects_i[item] + rng.standard_normal(n_rows)
    return rater, item, y


def crossed_ratings_model(
    rater: np.ndarray, item: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """``y ~ Normal(mu + r[rater] + i[item], sigma)`` with rater and item effects
    ``r ~ Normal(0, s_r)``, ``i ~ Normal(0, s_i)`` (centred) or ``r = s_r zr``,
    ``i = s_i zi`` with standard-normal ``zr``, ``zi`` (non-centred); ``mu ~ Normal(0, 5)``,
    ``s_r, s_i ~ HalfNormal(1)``, ``sigma ~ HalfNormal(2)``. d = 4,004 at the defaults: no
    dense Hessian, a diagonal preconditioner, and two effects of 2,000 groups each."""
    n_raters, n_items = int(rater.max()) + 1, int(item.max()) + 1
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        s_r = pm.HalfNormal("s_r", 1.0)
        s_i = pm.HalfNormal("s_i", 1.0)
        sigma = pm.HalfNormal("sigma", 2.0)
        if centred:
            r = pm.Normal("r", 0.0, s_r, shape=n_raters)
            i = pm.Normal("i", 0.0, s_i, shape=n_items)
            pm.Normal("y", mu + r[rater] + i[item], sigma, observed=y)
        else:
            zr = pm.Normal("zr", 0.0, 1.0, shape=n_raters)
            zi = pm.Normal("zi", 0.0, 1.0, shape=n_items)
            pm.Normal("y", mu + s_r * zr[rater] + s_i * zi[item], sigma, observed=y)
    return model


def crossed_ratings(centred: bool, seed: int = 9) -> pm.Model:
    """The crossed ratings model (see ``crossed_ratings_model``)."""
    rater, item, y = make_crossed_ratings_data(seed=seed)
    return crossed_ratings_model(rater, item, y, centred=centred)


def make_crossed_logistic_data(
    n_raters: int = 2000, n_items: int = 2000, per_rater: int = 20, seed: int = 11
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The crossed design of ``make_crossed_ratings_data`` with binary ratings: a
    standard-normal covariate ``x`` per rating and
    ``logit P(y = 1) = -0.5 + 0.7 x + 0.5 zr[rater] + 0.8 zi[item]`` with standard-normal
    ``zr``, ``zi``.

    Returns
    -------
    rater, item : ndarray of int, shape (n_rows,)
    x : ndarray, shape (n_rows,)
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    rater, item = _crossed_design(n_raters, n_items, per_rater, rng)
    x = rng.standard_normal(len(rater))
    effects_r = 0.5 * rng.standard_normal(n_raters)
    effects_i = 0.8 * rng.standard_normal(n_items)
    eta = -0.5 + 0.7 * x + effects_r[rater] + effects_i[item]
    y = (rng.random(len(rater)) < 1.0 / (1.0 + np.exp(-eta))).astype(np.int64)
    return rater, item, x, y


def crossed_logistic(centred: bool, seed: int = 11) -> pm.Model:
    """``y ~ Bernoulli(logit_p = mu + beta x + r[rater] + i[item])``, the rater and item
    effects as in ``crossed_ratings_model`` (``s_r, s_i ~ HalfNormal(1)``; ``mu ~ Normal(0,
    5)``, ``beta ~ Normal(0, 2)``). d = 4,004; each group's 20 binary ratings say little
    (``h_j`` about 1 and 2.6 at the true scales), so the centred form's joint density has no
    mode (its scales collapse) and the per-group coordinates, partly centred, have none
    either."""
    rater, item, x, y = make_crossed_logistic_data(seed=seed)
    n_raters, n_items = int(rater.max()) + 1, int(item.max()) + 1
    with pm.Model() as model:
        mu = pm.Normal("mu", 0.0, 5.0)
        beta = pm.Normal("beta", 0.0, 2.0)
        s_r = pm.HalfNormal("s_r", 1.0)
        s_i = pm.HalfNormal("s_i", 1.0)
        if centred:
            r = pm.Normal("r", 0.0, s_r, shape=n_raters)
            i = pm.Normal("i", 0.0, s_i, shape=n_items)
        else:
            r = s_r * pm.Normal("zr", 0.0, 1.0, shape=n_raters)
            i = s_i * pm.Normal("zi", 0.0, 1.0, shape=n_items)
        pm.Bernoulli("y", logit_p=mu + beta * x + r[rater] + i[item], observed=y)
    return model


# ---------------------------------------------------------------------------------------------
# d4. a group-level predictor: the groups' loc a regression on a covariate of each group


def make_group_regression_data(
    n_rows: int = 100_000, n_groups: int = 40, seed: int = 13
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (5 to about 18,000 at the
    defaults; shuffled), a standard-normal covariate ``u`` per group; true
    ``a_j = 1 + 0.6 u_j + 0.4 e_j`` and ``y = a[group] + e`` with standard normals ``e``.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    u : ndarray, shape (n_groups,)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = geometric_sizes(n_rows, n_groups, smallest=5)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    u = rng.standard_normal(n_groups)
    a = 1.0 + 0.6 * u + 0.4 * rng.standard_normal(n_groups)
    y = a[group] + rng.standard_normal(n_rows)
    return group, u, y


def group_regression_model(
    group: np.ndarray, u: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """Varying intercepts with a group-level predictor, as PyMC's multilevel primer writes
    the radon model: ``gamma ~ Normal(0, 2)`` (shape 2), ``tau ~ HalfNormal(1)``, ``a_j``
    about ``gamma[0] + gamma[1] u_j`` with sd ``tau`` (centred ``a ~ Normal``, or
    non-centred ``a = loc + tau * z``), ``y ~ Normal(a[group], 1)`` (a known residual sd,
    so that the posterior is Gaussian given ``tau``: an exact reference)."""
    with pm.Model() as model:
        gamma = pm.Normal("gamma", 0.0, 2.0, shape=2)
        tau = pm.HalfNormal("tau", 1.0)
        loc = gamma[0] + gamma[1] * u
        if centred:
            a = pm.Normal("a", loc, tau, shape=len(u))
        else:
            a = pm.Deterministic("a", loc + tau * pm.Normal("z", 0.0, 1.0, shape=len(u)))
        pm.Normal("y", a[group], 1.0, observed=y)
    return model


def group_regression(centred: bool, seed: int = 13) -> pm.Model:
    """The group-level predictor model (see ``group_regression_model``)."""
    return group_regression_model(*make_group_regression_data(seed=seed), centred=centred)


def make_group_logistic_data(
    n_rows: int = 60_000, n_groups: int = 40, seed: int = 14
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 8 rows up summing to ``n_rows`` (8 to about 11,000 at the
    defaults; shuffled), a standard-normal covariate ``u`` per group and two per row; true
    ``a_j = -1 + 0.6 u_j + 0.5 e_j``, slopes ``(0.5, -0.3)``, Bernoulli outcomes.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    u : ndarray, shape (n_groups,)
    X : ndarray, shape (n_rows, 2)
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = geometric_sizes(n_rows, n_groups, smallest=8)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    u = rng.standard_normal(n_groups)
    a = -1.0 + 0.6 * u + 0.5 * rng.standard_normal(n_groups)
    X = rng.standard_normal((n_rows, 2))
    eta = a[group] + X @ np.array([0.5, -0.3])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-eta)))
    return group, u, X, y


def group_logistic_model(
    group: np.ndarray, u: np.ndarray, X: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """``group_regression_model``'s group-level regression with a logistic likelihood and
    two row covariates: ``gamma ~ Normal(0, 2)`` (shape 2), ``tau ~ HalfNormal(1)``,
    ``slope ~ Normal(0, 2)`` (shape 2), ``a`` about ``gamma[0] + gamma[1] u`` (as
    PyMC's primer writes it: a ``pm.Deterministic`` loc of a ``pm.Data`` covariate),
    ``y ~ Bernoulli(logit_p = a[group] + X @ slope)``."""
    with pm.Model() as model:
        gamma = pm.Normal("gamma", 0.0, 2.0, shape=2)
        tau = pm.HalfNormal("tau", 1.0)
        slope = pm.Normal("slope", 0.0, 2.0, shape=2)
        loc = pm.Deterministic("loc", gamma[0] + gamma[1] * pm.Data("u", u))
        if centred:
            a = pm.Normal("a", loc, tau, shape=len(u))
        else:
            a = pm.Deterministic("a", loc + pm.Normal("z", 0.0, 1.0, shape=len(u)) * tau)
        pm.Bernoulli("y", logit_p=a[group] + pm.math.dot(X, slope), observed=y)
    return model


def group_logistic(centred: bool, seed: int = 14) -> pm.Model:
    """The logistic group-level predictor model (see ``group_logistic_model``)."""
    return group_logistic_model(*make_group_logistic_data(seed=seed), centred=centred)


def _exact_moments(
    first: dict[str, np.ndarray], second: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """A reference's keys from each quantity's first and second moments (Monte Carlo errors
    0: computed, not sampled)."""
    out = {}
    for name, m in first.items():
        out[f"{name}__mean"] = m
        out[f"{name}__sd"] = np.sqrt(second[name] - m**2)
        out[f"{name}__mean_se"] = np.zeros_like(m)
        out[f"{name}__sd_se"] = np.zeros_like(m)
    return out


def group_regression_exact(
    group: np.ndarray, u: np.ndarray, y: np.ndarray, n_grid: int = 4001
) -> dict[str, np.ndarray]:
    """The exact posterior moments of ``group_regression_model``: given ``tau`` the
    posterior of ``(gamma, a)`` is Gaussian (precision ``P``, linear term ``b``), and
    ``log tau``'s marginal density is ``log HalfNormal(tau) + log tau - J log tau
    - log|P| / 2 + b' P^-1 b / 2``, read on a grid wide enough that its ends hold nothing.

    Returns
    -------
    dict
        ``<name>__mean`` and ``<name>__sd`` for ``gamma``, ``tau_log__``, ``a`` and ``z``
        (with zero ``__mean_se``, ``__sd_se``).
    """
    n_groups = len(u)
    n = np.bincount(group, minlength=n_groups).astype(np.float64)
    sums = np.bincount(group, weights=y, minlength=n_groups)
    design = np.column_stack([np.ones(n_groups), u])
    rhs = np.concatenate([np.zeros(2), sums])

    def conditional(log_tau: float) -> tuple[float, np.ndarray, np.ndarray]:
        inv_var = np.exp(-2.0 * log_tau)
        precision = np.zeros((2 + n_groups, 2 + n_groups))
        precision[:2, :2] = np.eye(2) / 4.0 + inv_var * design.T @ design
        precision[:2, 2:] = -inv_var * design.T
        precision[2:, :2] = -inv_var * design
        precision[2:, 2:] = np.diag(n + inv_var)
        cov = np.linalg.inv(precision)
        mean = cov @ rhs
        log_det = np.linalg.slogdet(precision)[1]
        tau = np.exp(log_tau)
        log_density = -0.5 * tau**2 + log_tau - n_groups * log_tau - 0.5 * log_det
        return log_density + 0.5 * rhs @ mean, mean, cov

    coarse = np.linspace(-8.0, 3.0, 1101)
    log_density = np.array([conditional(t)[0] for t in coarse])
    mode = coarse[np.argmax(log_density)]
    grid = np.linspace(mode - 2.5, mode + 2.5, n_grid)
    parts = [conditional(t) for t in grid]
    weights = np.exp(np.array([p[0] for p in parts]) - max(p[0] for p in parts))
    weights /= weights.sum()
    if weights[0] > 1e-12 or weights[-1] > 1e-12:
        raise RuntimeError("group_regression_exact: the grid cuts off mass")
    first: dict[str, np.ndarray] = {}
    second: dict[str, np.ndarray] = {}
    for w, log_tau, (_, mean, cov) in zip(weights, grid, parts):
        tau = np.exp(log_tau)
        # z = (a - design gamma) / tau: a linear map of (gamma, a)
        z_map = np.hstack([-design, np.eye(n_groups)]) / tau
        rows = {"gamma": np.eye(2 + n_groups)[:2], "a": np.eye(2 + n_groups)[2:], "z": z_map}
        for name, lin in rows.items():
            m = lin @ mean
            first[name] = first.get(name, 0.0) + w * m
            second[name] = second.get(name, 0.0) + w * (
                np.einsum("ij,jk,ik->i", lin, cov, lin) + m**2
            )
    first["tau_log__"] = np.array([np.sum(weights * grid)])
    second["tau_log__"] = np.array([np.sum(weights * grid**2)])
    return _exact_moments(first, second)


# ---------------------------------------------------------------------------------------------
# d5. varying intercepts and slopes: two effects per group


def make_varying_slopes_data(
    n_rows: int = 100_000, n_groups: int = 40, seed: int = 21
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Geometric group sizes from 5 rows up summing to ``n_rows`` (shuffled), a standard-normal
    covariate per row; true ``a_j = 0.5 + 0.4 e_j``, ``b_j = -0.3 + 0.3 e'_j`` and
    ``y = a[group] + b[group] x + e`` with standard normals.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    x, y : ndarray, shape (n_rows,)
    """
    return slopes_rows(
        n_rows,
        n_groups,
        np.random.default_rng(seed),
        lambda e1, e2: (0.5 + 0.4 * e1, -0.3 + 0.3 * e2),
    )


def slopes_rows(
    n_rows: int,
    n_groups: int,
    rng: np.random.Generator,
    effects: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of a varying intercepts and slopes model: geometric group sizes from 5 rows up
    (shuffled), the groups' ``(a, b) = effects(e1, e2)`` of two standard-normal vectors, a
    standard-normal covariate ``x`` and ``y = a[group] + b[group] x + e``."""
    sizes = geometric_sizes(n_rows, n_groups, smallest=5)
    group = np.repeat(np.arange(n_groups), rng.permutation(sizes))
    a, b = effects(rng.standard_normal(n_groups), rng.standard_normal(n_groups))
    x = rng.standard_normal(n_rows)
    y = a[group] + b[group] * x + rng.standard_normal(n_rows)
    return group, x, y


def varying_slopes_model(
    group: np.ndarray, x: np.ndarray, y: np.ndarray, *, centred: bool
) -> pm.Model:
    """Varying intercepts and slopes (uncorrelated), as PyMC's multilevel primer writes them:
    ``mu_a, mu_b ~ Normal(0, 2)``, ``tau_a, tau_b ~ HalfNormal(1)``, ``a`` about ``mu_a``
    with sd ``tau_a`` and ``b`` about ``mu_b`` with sd ``tau_b`` (centred, or non-centred
    Deterministics), ``y ~ Normal(a[group] + b[group] x, 1)`` (a known residual sd: the
    posterior is Gaussian given the two scales)."""
    n_groups = int(group.max()) + 1
    with pm.Model() as model:
        mu_a, mu_b = pm.Normal("mu_a", 0.0, 2.0), pm.Normal("mu_b", 0.0, 2.0)
        tau_a, tau_b = pm.HalfNormal("tau_a", 1.0), pm.HalfNormal("tau_b", 1.0)
        if centred:
            a = pm.Normal("a", mu_a, tau_a, shape=n_groups)
            b = pm.Normal("b", mu_b, tau_b, shape=n_groups)
        else:
            a = pm.Deterministic("a", mu_a + tau_a * pm.Normal("z_a", 0.0, 1.0, shape=n_groups))
            b = pm.Deterministic("b", mu_b + tau_b * pm.Normal("z_b", 0.0, 1.0, shape=n_groups))
        pm.Normal("y", a[group] + b[group] * x, 1.0, observed=y)
    return model


def varying_slopes(centred: bool, seed: int = 21) -> pm.Model:
    """Varying intercepts and slopes (see ``varying_slopes_model``)."""
    return varying_slopes_model(*make_varying_slopes_data(seed=seed), centred=centred)


def varying_slopes_exact(
    group: np.ndarray, x: np.ndarray, y: np.ndarray, half_width: float = 1.2, n_grid: int = 81
) -> dict[str, np.ndarray]:
    """The exact posterior moments of ``varying_slopes_model``: given the two scales the
    posterior of ``(mu_a, mu_b, a, b)`` is Gaussian (precision ``P``, linear term ``r``), and
    ``(log tau_a, log tau_b)`` has the density ``sum_k [log HalfNormal(tau_k) + log tau_k -
    J log tau_k] - log|P| / 2 + r' P^-1 r / 2``, read on an ``n_grid`` x ``n_grid`` grid of
    ``half_width`` about its mode whose edges hold nothing. Keys as
    ``group_regression_exact``'s."""
    n_groups = int(group.max()) + 1
    n = np.bincount(group, minlength=n_groups).astype(np.float64)
    sx, sxx = np.bincount(group, x, n_groups), np.bincount(group, x * x, n_groups)
    rhs = np.concatenate(
        [[0.0, 0.0], np.bincount(group, y, n_groups), np.bincount(group, x * y, n_groups)]
    )
    dim, a_part, b_part = 2 + 2 * n_groups, slice(2, 2 + n_groups), slice(2 + n_groups, None)

    def conditional(log_a: float, log_b: float):
        inv_a, inv_b = np.exp(-2.0 * log_a), np.exp(-2.0 * log_b)
        precision = np.zeros((dim, dim))
        precision[0, 0], precision[1, 1] = 0.25 + n_groups * inv_a, 0.25 + n_groups * inv_b
        precision[0, a_part] = precision[a_part, 0] = -inv_a
        precision[1, b_part] = precision[b_part, 1] = -inv_b
        precision[a_part, a_part] = np.diag(n + inv_a)
        precision[b_part, b_part] = np.diag(sxx + inv_b)
        precision[a_part, b_part] = precision[b_part, a_part] = np.diag(sx)
        cov = np.linalg.inv(precision)
        mean = cov @ rhs
        log_density = -0.5 * np.linalg.slogdet(precision)[1] + 0.5 * rhs @ mean
        for log_tau in (log_a, log_b):
            log_density += -0.5 * np.exp(2.0 * log_tau) + log_tau - n_groups * log_tau
        return log_density, mean, cov

    coarse = np.linspace(-4.0, 1.0, 51)
    log_density = np.array([[conditional(a, b)[0] for b in coarse] for a in coarse])
    mode_a, mode_b = np.unravel_index(np.argmax(log_density), log_density.shape)
    grid_a = np.linspace(coarse[mode_a] - half_width, coarse[mode_a] + half_width, n_grid)
    grid_b = np.linspace(coarse[mode_b] - half_width, coarse[mode_b] + half_width, n_grid)
    parts = [[conditional(a, b) for b in grid_b] for a in grid_a]
    log_w = np.array([[p[0] for p in row] for row in parts])
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    if max(w[0].sum(), w[-1].sum(), w[:, 0].sum(), w[:, -1].sum()) > 1e-9:
        raise RuntimeError("varying_slopes_exact: the grid cuts off mass")
    ones, zeros, eye, block = (
        np.ones((n_groups, 1)),
        np.zeros((n_groups, 1)),
        np.eye(n_groups),
        np.zeros((n_groups, n_groups)),
    )
    first: dict[str, np.ndarray] = {}
    second: dict[str, np.ndarray] = {}
    for i, log_a in enumerate(grid_a):
        for j, log_b in enumerate(grid_b):
            if w[i, j] < 1e-14:
                continue
            _, mean, cov = parts[i][j]
            rows = {
                "mu_a": np.eye(dim)[:1],
                "mu_b": np.eye(dim)[1:2],
                "a": np.eye(dim)[a_part],
                "b": np.eye(dim)[b_part],
                "z_a": np.hstack([-ones, zeros, eye, block]) / np.exp(log_a),
                "z_b": np.hstack([zeros, -ones, block, eye]) / np.exp(log_b),
            }
            for name, lin in rows.items():
                m = lin @ mean
                first[name] = first.get(name, 0.0) + w[i, j] * m
                moment = np.einsum("ij,jk,ik->i", lin, cov, lin) + m**2
                second[name] = second.get(name, 0.0) + w[i, j] * moment
    for name, grid, axis in (("tau_a_log__", grid_a, 1), ("tau_b_log__", grid_b, 0)):
        marginal = w.sum(axis=axis)
        first[name] = np.array([np.sum(marginal * grid)])
        second[name] = np.array([np.sum(marginal * grid**2)])
    return _exact_moments(first, second)


# ---------------------------------------------------------------------------------------------
# e. rare events with a separated binary feature

#: rows of the binary feature in ``make_rare_event_logistic_data`` (none has an event)
RARE_EVENT_FLAG_ROWS = 250


def make_rare_event_logistic_data(
    n_rows: int = 500_000, seed: int = 5
) -> tuple[np.ndarray, np.ndarray]:
    """About 0.1% events: intercept -7, slopes (0.5, -0.3, 0.2) on standard normals.

    Column 4 is a binary flag set on exactly 250 random rows, whose outcomes are all forced
    to 0 (quasi-separation: the flag's coefficient is only bounded by its prior).

    Returns
    -------
    X : ndarray, shape (n_rows, 5)
        Ones, three standard-normal covariates, the flag.
    y : ndarray of int, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    flag = np.zeros(n_rows)
    flag[rng.choice(n_rows, size=RARE_EVENT_FLAG_ROWS, replace=False)] = 1.0
    X = np.column_stack([np.ones(n_rows), rng.standard_normal((n_rows, 3)), flag])
    eta = X[:, :4] @ np.array([-7.0, 0.5, -0.3, 0.2])
    y = rng.binomial(1, 1.0 / (1.0 + np.exp(-eta)))
    y[flag == 1.0] = 0
    return X, y


def rare_event_logistic_model(X: np.ndarray, y: np.ndarray) -> pm.Model:
    """``beta ~ Normal(0, 5)`` (shape 5), ``y ~ Bernoulli(logit_p = X @ beta)``.

    What makes it hard: 500,000 rows but only ~550 events, and the flag (``beta[4]``) has
    no event in its 250 rows, so its posterior is the prior's left half cut off smoothly
    on the right: strongly skewed, with a Laplace sd and mean far off. A subsampling
    method also sees the flag's rows only rarely.
    """
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 5.0, shape=X.shape[1])
        pm.Bernoulli("y", logit_p=pm.math.dot(X, beta), observed=y)
    return model


def rare_event_logistic(n_rows: int = 500_000, seed: int = 5) -> pm.Model:
    """Rare-event logistic regression with a separated flag (see ``rare_event_logistic_model``)."""
    return rare_event_logistic_model(*make_rare_event_logistic_data(n_rows, seed))


# ---------------------------------------------------------------------------------------------
# f. many groups, a million rows, exactly Gaussian posterior


def many_groups_sizes(n_rows: int = 1_000_000, n_groups: int = 1000) -> np.ndarray:
    """Group sizes from 28 to 4,851 rows (at the default sizes) summing to ``n_rows``.

    ``28 + 4823 * (r**u - 1) / (r - 1)`` for ``u`` evenly spaced on ``[0, 1]``, with the
    ratio ``r`` solved so the sizes sum to ``n_rows``, then rounded (largest remainders) so
    the sum is exact. For other ``n_rows`` and ``n_groups`` the ends scale with the mean.
    """
    mean = n_rows / n_groups
    low, span = 28.0 * mean / 1000.0, 4823.0 * mean / 1000.0
    u = np.arange(n_groups) / (n_groups - 1)

    def sizes(r: float) -> np.ndarray:
        return low + span * np.expm1(u * np.log(r)) / (r - 1.0)

    r = scipy.optimize.brentq(lambda r: sizes(r).sum() - n_rows, 1.0 + 1e-9, 1e6)
    raw = sizes(r)
    out = np.floor(raw).astype(int)
    short = n_rows - out.sum()
    out[np.argsort(out - raw)[:short]] += 1
    return out


def make_many_groups_linear_data(
    n_rows: int = 1_000_000, n_groups: int = 1000, seed: int = 6
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Varying intercepts ``a ~ N(0, 1)``, slopes ``b ~ N(0, 1)`` (3), noise sd 1.

    Group sizes from ``many_groups_sizes``, assigned to groups in a shuffled order; rows
    are in group order.

    Returns
    -------
    group : ndarray of int, shape (n_rows,)
    X : ndarray, shape (n_rows, 3)
    y : ndarray, shape (n_rows,)
    """
    rng = np.random.default_rng(seed)
    sizes = rng.permutation(many_groups_sizes(n_rows, n_groups))
    group = np.repeat(np.arange(n_groups), sizes)
    a = rng.standard_normal(n_groups)
    b = rng.standard_normal(3)
    X = rng.standard_normal((n_rows, 3))
    y = a[group] + X @ b + rng.standard_normal(n_rows)
    return group, X, y


def many_groups_linear_model(
    group: np.ndarray, X: np.ndarray, y: np.ndarray, n_groups: int | None = None
) -> pm.Model:
    """``a ~ Normal(0, 1)`` (one per group), ``b ~ Normal(0, 1)`` (3), ``y ~ N(a[g] + X b, 1)``.

    What makes it hard: d = 1,003 with groups of 28 to 4,851 rows, so the posterior scales
    differ by a factor ~13 between coordinates and a minibatch sees most groups only a few
    times. The posterior is exactly Gaussian (``many_groups_linear_posterior``).
    """
    n_groups = int(group.max()) + 1 if n_groups is None else n_groups
    with pm.Model() as model:
        a = pm.Normal("a", 0.0, 1.0, shape=n_groups)
        b = pm.Normal("b", 0.0, 1.0, shape=X.shape[1])
        pm.Normal("y", mu=a[group] + pm.math.dot(X, b), sigma=1.0, observed=y)
    return model


def many_groups_linear(n_rows: int = 1_000_000, n_groups: int = 1000, seed: int = 6) -> pm.Model:
    """Many-groups varying-intercept regression (see ``many_groups_linear_model``)."""
    group, X, y = make_many_groups_linear_data(n_rows, n_groups, seed)
    return many_groups_linear_model(group, X, y, n_groups)


def many_groups_linear_posterior(
    group: np.ndarray, X: np.ndarray, y: np.ndarray, n_groups: int | None = None
) -> dict[str, np.ndarray]:
    """Exact posterior of ``many_groups_linear_model``: keys ``a__mean``, ``a__sd``,
    ``b__mean``, ``b__sd`` (and zero ``__mean_se``/``__sd_se``, like a reference file).

    The design is ``[one-hot(group), X]`` with unit noise and unit prior precision, so the
    precision is ``I + D^T D``, built blockwise from group counts and per-group sums of
    ``X``, and the mean solves ``(I + D^T D) m = D^T y``.
    """
    n_groups = int(group.max()) + 1 if n_groups is None else n_groups
    k = X.shape[1]
    counts = np.bincount(group, minlength=n_groups).astype(float)
    cross = np.column_stack([np.bincount(group, X[:, j], n_groups) for j in range(k)])
    precision = np.zeros((n_groups + k, n_groups + k))
    precision[:n_groups, :n_groups] = np.diag(counts)
    precision[:n_groups, n_groups:] = cross
    precision[n_groups:, :n_groups] = cross.T
    precision[n_groups:, n_groups:] = X.T @ X
    precision += np.eye(n_groups + k)
    rhs = np.concatenate([np.bincount(group, y, n_groups), X.T @ y])
    factor = scipy.linalg.cho_factor(precision)
    mean = scipy.linalg.cho_solve(factor, rhs)
    sd = np.sqrt(np.diag(scipy.linalg.cho_solve(factor, np.eye(n_groups + k))))
    out = {
        "a__mean": mean[:n_groups],
        "a__sd": sd[:n_groups],
        "b__mean": mean[n_groups:],
        "b__sd": sd[n_groups:],
    }
    for var in ("a", "b"):
        out[f"{var}__mean_se"] = np.zeros_like(out[f"{var}__mean"])
        out[f"{var}__sd_se"] = np.zeros_like(out[f"{var}__sd"])
    return out


# ---------------------------------------------------------------------------------------------
# registry and reference files

#: models with a stored reference posterior: name -> zero-argument builder (default sizes)
HARD_MODELS = {
    "skewed_logistic": skewed_logistic,
    "scale_regression": scale_regression,
    "scale_few_rows": scale_few_rows,
    "hier_logistic_centred": partial(hier_logistic, centred=True),
    "hier_logistic_noncentred": partial(hier_logistic, centred=False),
    "rare_event_logistic": rare_event_logistic,
    # the SBPS paper's Sec. 7.1 logistic regression (N = 1000, d = 20, nearly separable)
    "sbps_paper_logistic": sbps_paper_logistic,
}


def load_reference(name: str) -> dict[str, np.ndarray]:
    """The arrays of ``tests/references/<name>.npz`` (see the module docstring for keys)."""
    with np.load(REFERENCE_DIR / f"{name}.npz") as ref:
        return {key: ref[key] for key in ref.files}
