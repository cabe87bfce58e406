"""The reference posterior every method is scored against.

A Laplace fit (the layer's MAP and Hessian, checked against an independent numpy Newton
solve) refined by Student-t importance sampling, cached per (N, seed) under
``benchmarks/results/reference_N{N}_seed{seed}.npz``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymc as pm
from protocol import RESULTS_DIR, Dataset

import pymc_bigdata as pmbd


@dataclass(frozen=True)
class Reference:
    """Reference posterior summary from importance sampling around the Laplace fit."""

    mean: np.ndarray
    sd: np.ndarray
    map_theta: np.ndarray
    precision: np.ndarray
    ess: float
    n_samples: int
    df: float
    seconds: float
    map_check: float
    cached: bool

    @property
    def mcse_mean(self) -> np.ndarray:
        """Approximate Monte Carlo standard error of the reference means."""
        return self.sd / math.sqrt(self.ess)


#: the arrays and numbers of a :class:`Reference` kept in its cache file
CACHED_FIELDS = (
    "mean",
    "sd",
    "map_theta",
    "precision",
    "ess",
    "n_samples",
    "df",
    "seconds",
    "map_check",
)


def logistic_loglik(
    X: np.ndarray, y: np.ndarray, betas: np.ndarray, max_elements: int = 1 << 23
) -> np.ndarray:
    """Full-data logistic log-likelihood ``sum_i y_i eta_i - softplus(eta_i)`` of many betas.

    Parameters
    ----------
    X, y
        Features (N, d) and 0/1 outcomes (N,).
    betas
        Coefficient vectors (S, d).
    max_elements
        Size of the (rows x S) block of linear predictors held at once.

    Returns
    -------
    ndarray, shape (S,)
    """
    betas = np.atleast_2d(betas)
    rows = max(1, max_elements // betas.shape[0])
    y = y.astype(np.float64)
    total = np.zeros(betas.shape[0])
    for start in range(0, X.shape[0], rows):
        eta = X[start : start + rows] @ betas.T
        total += y[start : start + rows] @ eta
        total -= np.logaddexp(0.0, eta).sum(axis=0)  # stable softplus
    return total


def log_prior(betas: np.ndarray) -> np.ndarray:
    """``N(0, 1)`` log prior of each row of ``betas``, up to a constant.

    Parameters
    ----------
    betas
        Coefficient vectors (S, d), or one (d,).

    Returns
    -------
    ndarray, shape (S,)
    """
    return -0.5 * np.sum(np.atleast_2d(betas) ** 2, axis=1)


def _negative_hessian(X: np.ndarray, beta: np.ndarray) -> np.ndarray:
    """Negative Hessian of the log posterior at ``beta``: ``X^T W X + I``."""
    p = 1.0 / (1.0 + np.exp(-(X @ beta)))
    return (X * (p * (1.0 - p))[:, None]).T @ X + np.eye(len(beta))


def newton_map(data: Dataset, iters: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Independent numpy MAP (Newton's method) and negative Hessian, to check the layer's.

    Parameters
    ----------
    data
        The data set.
    iters
        Most Newton steps.

    Returns
    -------
    beta, hessian : ndarray
        The MAP (d,) and the negative Hessian of the log posterior there (d, d).
    """
    beta = np.zeros(data.X.shape[1])
    y = data.y.astype(np.float64)
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(data.X @ beta)))
        grad = data.X.T @ (y - p) - beta
        step = np.linalg.solve(_negative_hessian(data.X, beta), grad)
        beta = beta + step
        if np.abs(step).max() < 1e-12:
            break
    return beta, _negative_hessian(data.X, beta)


def reference_path(n_rows: int, seed: int) -> Path:
    """Cache file of the reference of one (N, seed).

    Parameters
    ----------
    n_rows, seed
        Size and seed of the data set.

    Returns
    -------
    Path
    """
    return RESULTS_DIR / f"reference_N{n_rows}_seed{seed}.npz"


def _importance_moments(
    data: Dataset, theta: np.ndarray, chol: np.ndarray, n_samples: int, df: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Self-normalised importance-sampling mean, sd and weight ESS under a multivariate t.

    Parameters
    ----------
    data
        The data set (its seed and size seed the proposal's draws).
    theta, chol
        Centre and Cholesky factor of the scale of the t proposal.
    n_samples
        Number of proposal draws.
    df
        Degrees of freedom of the proposal.

    Returns
    -------
    mean, sd : ndarray
    ess : float
    """
    rng = np.random.default_rng([data.seed, data.n_rows, 7])
    z = rng.standard_normal((n_samples, len(theta)))
    scale = np.sqrt(df / rng.chisquare(df, size=n_samples))
    samples = theta + (z @ chol.T) * scale[:, None]
    mahalanobis = np.sum(z**2, axis=1) * scale**2
    log_q = -0.5 * (df + len(theta)) * np.log1p(mahalanobis / df)
    log_target = logistic_loglik(data.X, data.y, samples) + log_prior(samples)
    log_w = log_target - log_q
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    mean = w @ samples
    sd = np.sqrt(w @ (samples - mean) ** 2)
    return mean, sd, float(1.0 / np.sum(w**2))


def compute_reference(data: Dataset, model: pm.Model, n_samples: int, df: float) -> Reference:
    """Laplace fit (the layer's MAP and Hessian) refined by Student-t importance sampling.

    Proposal: multivariate t with ``df`` degrees of freedom centred at the MAP with the
    Laplace covariance; weights ``exp(log posterior - log proposal)`` self-normalised.

    Parameters
    ----------
    data
        The data set.
    model
        Its model (:func:`protocol.build_model`).
    n_samples
        Number of importance samples.
    df
        Degrees of freedom of the t proposal.

    Returns
    -------
    Reference
    """
    t0 = time.perf_counter()
    fit = pmbd.MinibatchModel(model).map_estimate()
    theta, precision = fit.theta, fit.hessian
    cov = np.linalg.inv(precision)
    chol = np.linalg.cholesky(0.5 * (cov + cov.T))
    newton_theta, _ = newton_map(data)
    map_check = float(np.max(np.abs(newton_theta - theta) / np.sqrt(np.diag(cov))))
    mean, sd, ess = _importance_moments(data, theta, chol, n_samples, df)
    return Reference(
        mean=mean,
        sd=sd,
        map_theta=theta,
        precision=precision,
        ess=ess,
        n_samples=n_samples,
        df=df,
        seconds=time.perf_counter() - t0,
        map_check=map_check,
        cached=False,
    )


def load_reference(path: Path, n_samples: int, df: float, dim: int) -> Reference | None:
    """The reference cached at ``path`` if it was computed with these settings.

    Parameters
    ----------
    path
        Cache file (:func:`reference_path`).
    n_samples, df
        Importance samples and degrees of freedom the reference must have used.
    dim
        Number of coefficients it must have.

    Returns
    -------
    Reference or None
        None when there is no cache file or it does not match.
    """
    if not path.exists():
        return None
    saved = np.load(path)
    if (
        int(saved["n_samples"]) != n_samples
        or float(saved["df"]) != df
        or saved["mean"].shape != (dim,)
    ):
        return None
    return Reference(
        mean=saved["mean"],
        sd=saved["sd"],
        map_theta=saved["map_theta"],
        precision=saved["precision"],
        ess=float(saved["ess"]),
        n_samples=n_samples,
        df=df,
        seconds=float(saved["seconds"]),
        map_check=float(saved["map_check"]),
        cached=True,
    )


def load_or_compute_reference(
    data: Dataset, model: pm.Model, n_samples: int, df: float
) -> Reference:
    """The cached reference for (N, seed) if it matches the settings, else compute and cache.

    Parameters
    ----------
    data
        The data set.
    model
        Its model (:func:`protocol.build_model`).
    n_samples
        Number of importance samples.
    df
        Degrees of freedom of the t proposal.

    Returns
    -------
    Reference
    """
    path = reference_path(data.n_rows, data.seed)
    cached = load_reference(path, n_samples, df, data.X.shape[1])
    if cached is not None:
        return cached
    ref = compute_reference(data, model, n_samples, df)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    np.savez(path, **{name: getattr(ref, name) for name in CACHED_FIELDS})
    return ref
