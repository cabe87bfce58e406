"""A regression whose two coefficients have unit posterior sds and correlation 0.9.

The covariates are drawn with covariance ``Sigma^-1`` and scaled by ``1/sqrt(N)``, the noise
sd is 1 and the priors ``N(0, 10^2)``, so the posterior is Gaussian, known exactly, and (up
to the sample's own ``X^T X``) the ``Sigma`` of the SGHMC paper's Figure 3. Its minibatch
gradient noise is about ``(N/n) Sigma^-1``, as correlated: the case where SGHMC's noise
correction must be a matrix (``tests/step_methods/test_sghmc.py``,
``benchmarks/bhat_matrix.py``).
"""

from __future__ import annotations

import numpy as np
import pymc as pm

CORRELATION = 0.9


def correlated_regression(rows: int = 5_000) -> tuple[pm.Model, np.ndarray, np.ndarray]:
    """The model, the exact posterior mean and covariance."""
    rng = np.random.default_rng(2014)
    sigma = np.array([[1.0, CORRELATION], [CORRELATION, 1.0]])
    x = rng.multivariate_normal(np.zeros(2), np.linalg.inv(sigma), size=rows) / np.sqrt(rows)
    y = x @ np.array([1.0, -0.5]) + rng.standard_normal(rows)
    cov = np.linalg.inv(x.T @ x + np.eye(2) / 10.0**2)
    with pm.Model() as model:
        beta = pm.Normal("beta", 0.0, 10.0, shape=2)
        pm.Normal("y", pm.Data("x", x) @ beta, 1.0, observed=y)
    return model, cov @ (x.T @ y), cov
