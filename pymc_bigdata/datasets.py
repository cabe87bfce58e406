"""Generated data sets that the docs, notebooks, benchmarks and tests share."""

from __future__ import annotations

import numpy as np
import pymc as pm

__all__ = ["sbps_paper_logistic", "sbps_paper_logistic_data"]


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
