"""The control-variate anchor: a point ``theta*`` and the full-data sums there.

An :class:`Anchor` holds the full-data log-likelihood and its gradient at ``theta*`` (first
order) and, for second-order control variates, the full-data log-likelihood Hessian at a
curvature point ``theta_h``.  :func:`map_anchor` takes them from the MAP search's result;
:func:`anchor_at` re-centres at any point with one gradient pass, keeping a curvature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse

from pymc_bigdata.model.laplace import MapResult

__all__ = ["SPARSE_HESSIAN_DENSITY", "Anchor", "anchor_at", "compact", "map_anchor"]

#: a Hessian with at most this fraction of non-zero entries is stored sparse (CSR)
SPARSE_HESSIAN_DENSITY = 0.1


@dataclass(frozen=True)
class Anchor:
    """The control-variate anchor theta* and the full-data quantities there.

    ``curvature_point`` and ``loglik_hessian`` (the full-data log-likelihood Hessian there)
    enable second-order control variates; both None for first order only.
    """

    theta: np.ndarray
    loglik: float
    loglik_grad: np.ndarray
    curvature_point: np.ndarray | None = None
    loglik_hessian: np.ndarray | None = None

    def second_order(
        self, theta: np.ndarray, grad_first: np.ndarray, row_curvature: np.ndarray
    ) -> np.ndarray:
        """The second-order estimate from :meth:`MinibatchModel.estimate_second_order_parts`."""
        return grad_first - row_curvature + self.loglik_hessian @ (theta - self.theta)


def compact(matrix: np.ndarray | None):
    """A CSR copy of a mostly-zero matrix (its matvec then costs O(nnz), not O(d^2))."""
    if matrix is None or scipy.sparse.issparse(matrix) or matrix.shape[0] < 100:
        return matrix
    if np.count_nonzero(matrix) > SPARSE_HESSIAN_DENSITY * matrix.size:
        return matrix
    return scipy.sparse.csr_matrix(matrix)


def map_anchor(fit: MapResult) -> Anchor:
    """The control-variate anchor at the MAP ``fit`` (where its full-data sums were read,
    ``fit.sums_point``), with its curvature when dense."""
    return Anchor(
        theta=fit.theta if fit.sums_point is None else fit.sums_point,
        loglik=fit.loglik,
        loglik_grad=fit.loglik_grad,
        curvature_point=fit.hessian_point if fit.loglik_hessian is not None else None,
        loglik_hessian=compact(fit.loglik_hessian),
    )


def anchor_at(
    theta: np.ndarray,
    full_loglik_grad: Callable[[np.ndarray], tuple[float, np.ndarray]],
    curvature_from: Anchor | None = None,
) -> Anchor:
    """A control-variate anchor at ``theta`` (one full-data gradient pass).

    The second-order curvature (point and Hessian) is carried over from
    ``curvature_from``: the correction stays unbiased with a Hessian taken elsewhere, so
    re-centring costs one gradient pass, not a Hessian.

    Parameters
    ----------
    theta
        The new anchor point.
    full_loglik_grad
        The full-data log-likelihood and its gradient at a point.
    curvature_from
        An anchor whose curvature point and Hessian are kept (default: first order only).
    """
    theta = np.asarray(theta, dtype=np.float64)
    loglik, loglik_grad = full_loglik_grad(theta)
    point = hess = None
    if curvature_from is not None and curvature_from.loglik_hessian is not None:
        point, hess = curvature_from.curvature_point, curvature_from.loglik_hessian
    return Anchor(theta, loglik, loglik_grad, point, compact(hess))
