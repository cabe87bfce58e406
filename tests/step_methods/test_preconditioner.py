"""The coordinate map theta = c + L z (``step_methods/preconditioner.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from pymc_bigdata.step_methods.preconditioner import Preconditioner

PRECISION = np.array([[4.0, 1.0], [1.0, 2.0]])
CENTER = np.array([0.5, -1.0])


@pytest.mark.parametrize("kind", ["dense", "diag", "identity"])
def test_maps_are_inverse_and_chain_rule_holds(kind):
    pre = Preconditioner.from_precision(CENTER, PRECISION, kind)
    z = np.array([0.3, -0.7])
    np.testing.assert_allclose(pre.z(pre.theta(z)), z)

    # log p(theta) = -theta^T P theta / 2: grad_z = L^T grad_theta, checked by finite differences
    def logp_z(zz):
        t = pre.theta(zz)
        return -0.5 * t @ PRECISION @ t

    fd = np.array([(logp_z(z + e) - logp_z(z - e)) / 2e-6 for e in np.eye(2) * 1e-6])
    np.testing.assert_allclose(pre.grad_z(-PRECISION @ pre.theta(z)), fd, rtol=1e-6)


def test_dense_laplace_coordinates_have_unit_curvature():
    pre = Preconditioner.from_precision(CENTER, PRECISION, "dense")
    assert pre.curvature_range == pytest.approx((1.0, 1.0))
    np.testing.assert_allclose(pre.covariance(), np.linalg.inv(PRECISION))


def test_diagonal_precision_and_adapted_covariance():
    diag_only = Preconditioner.from_precision(CENTER, np.diag(PRECISION), "diag")
    np.testing.assert_allclose(diag_only.covariance(), 1 / np.diag(PRECISION))
    pre = Preconditioner.from_precision(CENTER, PRECISION, "diag")
    np.testing.assert_allclose(pre.covariance(), np.diag(np.linalg.inv(PRECISION)))
    adapted = Preconditioner.from_covariance(CENTER, np.linalg.inv(PRECISION), "dense", pre)
    np.testing.assert_allclose(adapted.covariance(), np.linalg.inv(PRECISION))
    assert adapted.curvature_range[1] == pytest.approx(1.0)
