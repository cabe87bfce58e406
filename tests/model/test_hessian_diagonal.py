"""Hutchinson's estimate of a Hessian's diagonal (``pymc_bigdata.model.hessian_diagonal``).

The hard case is the one the crossed ratings met whitened: many unit-curvature coordinates,
each coupled a little to one coordinate of huge curvature (an intercept). Plain Rademacher
probes then read the unit curvatures with an sd of about the coupling (some below 0);
probes scaled by a first estimate read them well but the intercept badly; the two
combined read both. Where the plain probes place every curvature, they are all that is read.
"""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.model.hessian_diagonal import hutchinson_diagonal, refined_diagonal

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
    """32 plain probes and 32 scaled ones: the groups' unit curvatures within 0.05 and the
    intercept's within 1 % (plain probes alone: a group off by more than 1.5, and below 0;
    mutations: the second read unscaled; only the scaled read kept, which reads the
    intercept 4.9 % off; no second read)."""
    H = _intercept_and_groups()
    plain, _ = hutchinson_diagonal(lambda v: H @ v, GROUPS + 1, 32, np.random.default_rng(1))
    assert np.max(np.abs(plain[1:] - 1.0)) > 1.5 and plain[1:].min() < 0.0  # the hard case
    both = refined_diagonal(lambda v: H @ v, GROUPS + 1, 32, np.random.default_rng(1))
    assert np.max(np.abs(both[1:] - 1.0)) < 0.05
    assert abs(both[0] / BIG - 1.0) < 0.01


class _Counted:
    """``v -> H v``, counting the products."""

    def __init__(self, H: np.ndarray):
        self.H, self.calls = H, 0

    def __call__(self, v: np.ndarray) -> np.ndarray:
        self.calls += 1
        return self.H @ v


@pytest.mark.parametrize("n_probes", [1, 32])
def test_a_placed_diagonal_is_read_once(n_probes):
    """Groups of curvature 21 each coupled by 1 to 20 others (the crossed ratings in the
    per-group centring, where 32 plain probes place every curvature within 0.61 of its
    size): the plain estimate itself, from ``n_probes`` products, no second read (mutation:
    the second read always taken); one probe cannot judge, so it stands."""
    rng = np.random.default_rng(3)
    n = 400
    H = np.diag(np.full(n, 21.0))
    for j in range(n):
        partners = rng.choice(np.delete(np.arange(n), j), size=10, replace=False)
        H[j, partners] = H[partners, j] = 1.0
    counted = _Counted(H)
    out = refined_diagonal(counted, n, n_probes, np.random.default_rng(4))
    plain, _ = hutchinson_diagonal(lambda v: H @ v, n, n_probes, np.random.default_rng(4))
    assert counted.calls == n_probes
    np.testing.assert_array_equal(out, plain)
