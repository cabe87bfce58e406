"""A Gaussian at the posterior's bulk for a hierarchical model whose joint MAP is not there.

A hierarchical model's joint MAP can sit far from its bulk: written non-centred, the prior of
``z`` rewards a larger scale, and a correlated effect's ``L`` at the MAP of 40 data-poor
groups was 4.5 and 9 times the bulk's; written centred, scales collapse. The group fits
(:func:`~pymc_bigdata.model.group_fit.fit_groups`,
:func:`~pymc_bigdata.model.correlated_fit.fit_correlated_groups`) put the hyperparameters
``h`` (scales, a correlated effect's ``mu`` and ``L``) at the mode of their marginal
posterior, with a marginal precision ``S_h`` there, and each group's effect at its
conditional mean given them (the other parameters ``r``, e.g. coefficients, where the fits
read them): a :class:`BulkReading`.

:func:`bulk_precision` builds the Gaussian whose ``h``-marginal is ``N(h*, S_h^-1)`` and whose
conditional of ``r`` given ``h`` is the Laplace one at that point (the integrated nested
Laplace approximation's Gaussian: Rue, Martino & Chopin 2009, Sec. 3). With the full
precision ``P`` at the point (the log density's negative Hessian, blocks ``P_hh``, ``P_hr``,
``P_rr``), the Gaussian's precision keeps ``P_hr`` and ``P_rr`` and replaces ``P_hh`` by

    S_h + P_hr P_rr^-1 P_rh,

so that its Schur complement, the marginal precision of ``h``, is ``S_h``. ``P`` itself need
not be positive definite there (the point is no mode of the joint density: along ``h`` its
curvature is the profile's, not the marginal's).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from scipy.linalg import block_diag

__all__ = ["BulkReading", "bulk_precision", "bulk_reading", "finite_difference_hessian"]


class BulkReading(NamedTuple):
    """Where a layer's bulk is: :attr:`point` in the layer's coordinates, the indices of its
    hyperparameters and their marginal precision there (the module docstring)."""

    #: the bulk's point in the layer's coordinates, shape (d,)
    point: np.ndarray
    #: indices of the hyperparameters ``h`` in ``point``, shape (m,)
    hyper: np.ndarray
    #: ``S_h``, the precision of ``h``'s marginal posterior at :attr:`point`, shape (m, m)
    hyper_precision: np.ndarray

    def distance(self, theta: np.ndarray) -> float:
        """The largest ``|theta_h - h*|`` over the hyperparameters, in marginal sds."""
        sd = np.sqrt(np.diag(np.linalg.inv(self.hyper_precision)))
        return float(np.max(np.abs(theta[self.hyper] - self.point[self.hyper]) / sd))


def bulk_reading(
    point: np.ndarray, blocks: Iterable[tuple[np.ndarray, np.ndarray]]
) -> BulkReading | None:
    """The reading at ``point`` (the bulk's point, in the layer's coordinates) from each
    effect's hyperparameters: their indices and their marginal precision (e.g. ``1 / sd^2`` of
    a scale's ``log scale``; a correlated effect's ``L`` and ``mu``), taken as independent
    across effects. None without blocks, or where two blocks share an index."""
    blocks = list(blocks)
    if not blocks:
        return None
    index = np.concatenate([np.asarray(hyper, dtype=np.int64) for hyper, _ in blocks])
    if len(np.unique(index)) != len(index):
        return None
    precision = block_diag(*[np.atleast_2d(p) for _, p in blocks])
    return BulkReading(np.asarray(point, dtype=np.float64), index, precision)


def bulk_precision(precision: np.ndarray, reading: BulkReading) -> np.ndarray | None:
    """The Gaussian's precision (the module docstring) from the full precision ``precision``
    (d, d) at ``reading.point``; None where ``P_rr`` or the result is not positive definite or
    not finite."""
    precision = 0.5 * (precision + precision.T)
    hyper = reading.hyper
    rest = np.setdiff1d(np.arange(precision.shape[0]), hyper)
    p_rr = precision[np.ix_(rest, rest)]
    p_rh = precision[np.ix_(rest, hyper)]
    if not (np.all(np.isfinite(precision)) and np.all(np.isfinite(reading.hyper_precision))):
        return None
    try:
        factor = np.linalg.cholesky(p_rr)
        solved = np.linalg.solve(factor, p_rh)  # U^-1 P_rh, with P_rr = U U'
        out = precision.copy()
        out[np.ix_(hyper, hyper)] = reading.hyper_precision + solved.T @ solved
        np.linalg.cholesky(out)
    except np.linalg.LinAlgError:
        return None
    return out


def finite_difference_hessian(function, x: np.ndarray, step: float = 1e-3) -> np.ndarray:
    """The Hessian of a smooth scalar ``function`` at ``x`` by central differences (``step``
    along each axis; ``2 m^2 + 1`` evaluations for ``m`` coordinates), symmetrised."""
    x = np.asarray(x, dtype=np.float64)
    m = len(x)
    centre = function(x)
    out = np.empty((m, m))
    eye = np.eye(m) * step
    for i in range(m):
        out[i, i] = (function(x + eye[i]) - 2.0 * centre + function(x - eye[i])) / step**2
        for j in range(i):
            corners = (
                function(x + eye[i] + eye[j])
                - function(x + eye[i] - eye[j])
                - function(x - eye[i] + eye[j])
                + function(x - eye[i] - eye[j])
            )
            out[i, j] = out[j, i] = corners / (4.0 * step**2)
    return out
