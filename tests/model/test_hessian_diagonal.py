"""Hutchinson's estimate of a Hessian's diagonal (``pymc_bigdata.model.hessian_diagonal``).

The hard case is the one the crossed ratings met whitened: many unit-curvature coordinates,
each coupled a little to one coordinate of huge curvature (an intercept). Plain Rademacher
probes then read the unit curvatures with an sd of about the coupling (some below 0);
probes scaled by a first estimate read them well but the intercept badly; the two
combined read both.
"""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.model.hessian_diagonal import hutchinson_diagonal, two_scale_diagonal

#: the crossed ratings' whitened numbers at the mode: the intercept's curvature, each
#: group's coupling to it, the groups' count and curvature
BIG, COUPLING, GROUPS = 43_600.0, 4.3, 2_000


def _intercept_and_groups() -> np.ndarray:
    """``[[BIG, c 1^T], [c 1, I]]``: positive definite (``c^2 GROUPS < BIG``)."""
    H = np.eye(GROUPS + 1)
    H[0, 0] = BIG
    H[0, 1:] = H[1:, 0] = COUPLING
    return H


def test_scaled_probes_are_unbiased():
    """``v_j (H (s v))_j / s_j`` has mean ``H_jj`` whatever the scale ``s`` (mutation: the
    division by ``scale`` dropped, which reads ``H_jj s_j``), and the reported variance is
    the spread of the mean (within 25 % of the exact ``sum_k H_jk^2 s_k^2 / s_j^2 / n``)."""
    rng = np.random.default_rng(0)
    A = rng.standard_normal((6, 6))
    H = A @ A.T + np.diag([1.0, 10.0, 100.0, 1.0, 0.1, 5.0])
    scale = np.array([1.0, 0.3, 0.1, 2.0, 3.0, 0.5])
    n = 20_000
    estimate, variance = hutchinson_diagonal(lambda v: H @ v, 6, n, rng, scale=scale)
    off = H**2 * (scale[None, :] ** 2 / scale[:, None] ** 2)
    exact_var = (off.sum(axis=1) - np.diag(off)) / n
    np.testing.assert_allclose(estimate, np.diag(H), atol=5 * np.sqrt(exact_var.max()))
    np.testing.assert_allclose(variance, exact_var, rtol=0.25)


def test_two_scales_read_both_the_intercept_and_the_groups():
    """With 32 products, the groups' unit curvatures within 0.15 and the intercept's within
    2 % (plain probes: a group off by more than 1.5, and below 0; mutations: the second half
    unscaled, or only the scaled half kept, which reads the intercept about 23 % off)."""
    H = _intercept_and_groups()
    plain, _ = hutchinson_diagonal(lambda v: H @ v, GROUPS + 1, 32, np.random.default_rng(1))
    assert np.max(np.abs(plain[1:] - 1.0)) > 1.5 and plain[1:].min() < 0.0  # the hard case
    both = two_scale_diagonal(lambda v: H @ v, GROUPS + 1, 32, np.random.default_rng(1))
    assert np.max(np.abs(both[1:] - 1.0)) < 0.15
    assert abs(both[0] / BIG - 1.0) < 0.02


@pytest.mark.parametrize("n_probes", [1, 3])
def test_few_probes_are_plain(n_probes):
    """Below 4 products no second half: the plain estimate (exact on a diagonal matrix)."""
    H = np.diag([2.0, 30.0, 0.5])
    out = two_scale_diagonal(lambda v: H @ v, 3, n_probes, np.random.default_rng(0))
    np.testing.assert_allclose(out, [2.0, 30.0, 0.5])
