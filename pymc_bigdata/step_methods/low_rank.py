"""A diagonal preconditioner corrected along the posterior's flattest and stiffest directions.

Beyond 200 parameters (``DENSE_PRECONDITIONER_MAX_DIM``) the steps map ``theta = c + D z``
with a diagonal ``D`` (the Laplace fit's, then the tuning windows' marginal sds). A diagonal
cannot turn a direction: where the likelihood reads only a sum (crossed effects read
``mu + r_j + i_k``: shifting ``mu`` one way and every effect the other is pinned by the
effects' prior alone) the posterior's curvature in ``z``, ``H_z = D (-H) D``, is 0.03 along
that direction where it is 0.5-3 elsewhere, and a step sized for the stiff directions
crawls along it (``benchmarks/results/preconditioned_spectrum.md``: condition 99-219 on the
crossed ratings). :func:`low_rank_corrected` reads the ``k`` smallest and ``k`` largest
eigenpairs of ``H_z`` at the preconditioner's centre by Lanczos
(:func:`scipy.sparse.linalg.eigsh`) on full-data Hessian-vector products, and corrects ``D``
along them (:meth:`~.preconditioner.Preconditioner.with_correction`): the curvature there
becomes 1 (along those of positive curvature beyond a factor :data:`UNCORRECTED_WITHIN` of 1;
see :data:`CURVATURE_FLOOR`). The steps read it (``low_rank=k``; ``"auto"``, the default:
2 with a diagonal preconditioner, :func:`~.settings.check_low_rank`) at the Laplace fit and
at every tuning window's end; a reading takes tens of full-data Hessian-vector passes (21-60
on ``many_groups_linear`` and the crossed ratings, :data:`LANCZOS_TOLERANCE`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import scipy.sparse.linalg as sla

from pymc_bigdata.errors import ModeWarning
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.preconditioner import Preconditioner

__all__ = [
    "LANCZOS_TOLERANCE",
    "UNCORRECTED_WITHIN",
    "curvature_in_z",
    "extreme_eigenpairs",
    "low_rank_corrected",
]

#: relative accuracy of the eigenvalues (a correction needs them to a few per cent)
LANCZOS_TOLERANCE = 1e-3

#: most Lanczos iterations per reading (both ends of the spectrum)
LANCZOS_MAX_ITERATIONS = 5000

#: a direction whose curvature is within this factor of 1 is left as the diagonal maps it
#: (its sd off by at most sqrt(2)): where the diagonal leaves no flat or stiff direction
#: (``many_groups_linear``: 0.97-1.03) the steps pay the reading but no O(d k) maps
UNCORRECTED_WITHIN = 2.0

#: positive curvatures are floored here (a direction at most ~31 times wider than the
#: diagonal's); a non-positive one (no mode along it: a centre away from the posterior's
#: bulk, e.g. a collapsed MAP) is not corrected
CURVATURE_FLOOR = 1e-3


def extreme_eigenpairs(
    curvature: Callable[[np.ndarray], np.ndarray], dim: int, k: int
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` smallest and ``k`` largest eigenvalues of the symmetric operator
    ``curvature`` (``v -> H v``, dimension ``dim``) and their orthonormal eigenvectors
    (columns), by Lanczos; all ``dim`` when ``2 k >= dim`` (a dense eigendecomposition).
    """
    if 2 * k >= dim - 1:
        dense = np.column_stack([curvature(e) for e in np.eye(dim)])
        values, vectors = np.linalg.eigh(0.5 * (dense + dense.T))
        return values, vectors
    op = sla.LinearOperator((dim, dim), matvec=curvature, dtype=np.float64)
    # both ends from one Krylov space ("BE": k from each end), half the products of two runs
    values, vectors = sla.eigsh(
        op, k=2 * k, which="BE", tol=LANCZOS_TOLERANCE, maxiter=LANCZOS_MAX_ITERATIONS
    )
    return values, vectors


def curvature_in_z(
    precond: Preconditioner, layer: MinibatchModel
) -> tuple[Callable[[np.ndarray], np.ndarray], list[int]]:
    """``v -> L^T (-H) L v``, the posterior's curvature in ``precond``'s ``z`` at its centre
    (full-data Hessian-vector products and the prior's Hessian), and a one-element list
    counting the products it takes."""
    centre = precond.center
    prior_hessian = layer.prior_hessian(centre)
    passes = [0]

    def curvature_z(v: np.ndarray) -> np.ndarray:
        passes[0] += 1
        d = precond.direction(v)
        return -precond.grad_z(layer.full_loglik_hvp(centre, d) + prior_hessian @ d)

    return curvature_z, passes


def low_rank_corrected(
    precond: Preconditioner, layer: MinibatchModel, k: int
) -> tuple[Preconditioner, int]:
    """``precond`` (diagonal) corrected along the ``k`` flattest and ``k`` stiffest
    directions of the posterior's curvature in its ``z`` at its centre (module docstring),
    and the full-data Hessian-vector products read. ``precond`` unchanged when ``k`` is 0,
    when no curvature read is positive and beyond a factor :data:`UNCORRECTED_WITHIN` of 1,
    and with a ``ModeWarning`` when the curvature cannot be read there (not finite, or
    Lanczos did not converge)."""
    if k <= 0:
        return precond, 0
    curvature_z, passes = curvature_in_z(precond, layer)
    try:
        with np.errstate(all="ignore"):
            values, basis = extreme_eigenpairs(curvature_z, layer.dim, k)
        readable = bool(np.all(np.isfinite(values)) and np.all(np.isfinite(basis)))
    except (ArithmeticError, ValueError, sla.ArpackError):
        readable = False
    if not readable:
        warnings.warn(
            f"low_rank={k}: the posterior's curvature could not be read at the "
            "preconditioner's centre; the diagonal preconditioner is kept uncorrected here.",
            ModeWarning,
            stacklevel=2,
        )
        return precond, passes[0]
    wanted = (values > 0.0) & ((values < 1.0 / UNCORRECTED_WITHIN) | (values > UNCORRECTED_WITHIN))
    if not wanted.any():
        return precond, passes[0]
    curvatures = np.maximum(values[wanted], CURVATURE_FLOOR)
    return precond.with_correction(basis[:, wanted], curvatures), passes[0]
