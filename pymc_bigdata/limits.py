"""Limits the whole package shares.

``DENSE_HESSIAN_MAX_DIM``: up to this many parameters the package forms dense ``d x d``
matrices: the full-data Hessian (the Laplace precision, second-order control variates, the
re-fit at the draws' bulk, the fallback's curvature), the exact eigenvalues of the curvature
in the preconditioned coordinates, and HMC-ECS's expansion in the likelihood's inputs. Beyond
it (memory ``8 d^2`` bytes, time ``N d`` forward passes per Hessian) only diagonals and
stochastic estimates are computed.

``PRIOR_DIAGONAL_MAX_DIM``: beyond the dense Hessian and up to this many parameters, a
diagonal precision (the MAP's Laplace fit, the bulk's Gaussian) includes the prior's
curvature, read from the prior's dense Hessian (``8 d^2`` bytes: 128 MB at d = 4,000; the
prior's graph is cheap, no pass over the rows).
"""

from __future__ import annotations

__all__ = ["DENSE_HESSIAN_MAX_DIM", "PRIOR_DIAGONAL_MAX_DIM"]

DENSE_HESSIAN_MAX_DIM = 2_000

PRIOR_DIAGONAL_MAX_DIM = 20_000
