"""The map ``theta = c + L z`` between the model's and the kernels' coordinates."""

from __future__ import annotations

import copy

import numpy as np

from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.laplace import symmetrised

__all__ = ["Preconditioner"]

#: up to this many parameters the curvature range uses the exact eigenvalues of L^T P L
EXACT_CURVATURE_MAX_DIM = DENSE_HESSIAN_MAX_DIM


class Preconditioner:
    """``theta = center + L z``, and the Laplace curvature of the posterior in ``z``.

    Build with :meth:`from_precision` (the Laplace fit: ``L L^T = P^{-1}``) or
    :meth:`from_covariance` (an adapted covariance ``L L^T = S``).  ``kind``: ``"dense"``
    (``L`` a Cholesky factor), ``"diag"`` (``L`` the marginal standard deviations) or
    ``"identity"``.

    A diagonal ``L = D`` may carry a low-rank correction (:meth:`with_correction`):
    ``L = D M`` with ``M = I + U (Λ^{-1/2} - 1) U^T`` for orthonormal directions ``U`` along
    which the posterior's curvature in ``D``'s coordinates is ``Λ`` (:mod:`.low_rank`); ``M``
    is symmetric, so ``L^T = M D``, and ``M^{-1} = I + U (Λ^{1/2} - 1) U^T``. Each map then
    costs ``O(d k)``.

    Attributes
    ----------
    curvature_range : tuple of float
        Smallest and largest eigenvalue of the Laplace precision in z, ``L^T P L`` (both 1
        for the dense Laplace preconditioner); the kernels' default step sizes use it.
    precision : ndarray
        The Laplace precision ``P`` (dense, or its diagonal) the range was computed from.
    """

    def __init__(
        self, center: np.ndarray, matrix: np.ndarray, kind: str, precision: np.ndarray | None
    ):
        self.center = np.asarray(center, dtype=np.float64)
        self.kind = kind
        self.precision = precision
        self._diagonal = kind != "dense"
        if self._diagonal:
            self._scale = np.asarray(matrix, dtype=np.float64)  # the diagonal of L
            self.matrix = None
        else:
            self.matrix = matrix
            self._to_z = np.linalg.inv(matrix)
        self.curvature_range = self._curvature_range(precision)
        #: the low-rank correction ``(U, Λ^{-1/2} - 1, Λ^{1/2} - 1)``, or None
        self.correction: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def with_correction(self, basis: np.ndarray, curvatures: np.ndarray) -> Preconditioner:
        """This diagonal map corrected along the orthonormal columns of ``basis`` (d, k), where
        the posterior's curvature in this map's ``z`` is ``curvatures`` (k,): in the new ``z``
        it is 1 there, and unchanged on the orthogonal complement. Its ``curvature_range`` is
        read again where this map's was exact (a dense precision of at most
        ``EXACT_CURVATURE_MAX_DIM`` parameters), else kept (the diagonal's own estimate)."""
        if not self._diagonal or self.correction is not None:
            raise ValueError("A low-rank correction applies to an uncorrected diagonal map.")
        corrected = copy.copy(self)
        curvatures = np.asarray(curvatures, dtype=np.float64)
        corrected.correction = (basis, curvatures**-0.5 - 1.0, curvatures**0.5 - 1.0)
        corrected.curvature_range = corrected._corrected_curvature_range()
        return corrected

    def _corrected_curvature_range(self) -> tuple[float, float]:
        """The extreme eigenvalues of ``M D P D M`` where they are read exactly (see
        :meth:`with_correction`)."""
        precision = self.precision
        if precision is None or precision.ndim == 1 or len(precision) > EXACT_CURVATURE_MAX_DIM:
            return self.curvature_range
        basis, stretch, _ = self.correction
        curvature = precision * np.outer(self._scale, self._scale)
        curvature = curvature + ((curvature @ basis) * stretch) @ basis.T  # C M
        curvature = curvature + basis @ (stretch[:, None] * (basis.T @ curvature))  # M C M
        eig = np.linalg.eigvalsh(symmetrised(curvature))
        return float(eig[0]), float(eig[-1])

    def _stretch(self, v: np.ndarray, inverse: bool = False) -> np.ndarray:
        """``M v`` (or ``M^{-1} v``); ``v`` itself without a correction."""
        if self.correction is None:
            return v
        basis, stretch, shrink = self.correction
        return v + basis @ ((shrink if inverse else stretch) * (basis.T @ v))

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_precision(cls, center: np.ndarray, precision: np.ndarray, kind: str) -> Preconditioner:
        """``L L^T = P^{-1}`` (``P`` positive definite, dense or its diagonal)."""
        dim = len(center)
        if kind == "dense":
            upper = np.linalg.cholesky(_dense(precision))  # P = U U^T
            return cls(center, np.linalg.inv(upper.T), kind, precision)
        if kind == "diag":
            if precision.ndim == 2:
                sd = np.sqrt(np.diag(np.linalg.inv(precision)))
            else:
                sd = 1.0 / np.sqrt(precision)
            return cls(center, sd, kind, precision)
        if kind == "identity":
            return cls(center, np.ones(dim), kind, precision)
        raise ValueError(f"preconditioner must be 'dense', 'diag' or 'identity', got {kind!r}.")

    @classmethod
    def from_covariance(
        cls,
        center: np.ndarray,
        covariance: np.ndarray,
        kind: str,
        laplace: Preconditioner | None,
    ) -> Preconditioner:
        """``L L^T = S`` (dense ``S``, or its diagonal), keeping ``laplace``'s precision for
        the curvature range; without one (``S`` estimated from draws alone) the posterior is
        taken to have unit scale in z: range (1, 1)."""
        precision = None if laplace is None else laplace.precision
        if kind == "dense":
            return cls(center, np.linalg.cholesky(_dense(covariance)), kind, precision)
        if kind == "diag":
            var = np.diag(covariance) if covariance.ndim == 2 else covariance
            return cls(center, np.sqrt(var), kind, precision)
        return cls(center, np.ones(len(center)), kind, precision)

    # ------------------------------------------------------------------ maps
    def theta(self, z: np.ndarray) -> np.ndarray:
        """``c + L z``."""
        if self._diagonal:
            return self.center + self._scale * self._stretch(z)
        return self.center + self.matrix @ z

    def direction(self, v: np.ndarray) -> np.ndarray:
        """``L v``: a velocity or displacement in z mapped to theta (no centre)."""
        if self._diagonal:
            return self._scale * self._stretch(v)
        return self.matrix @ v

    def z(self, theta: np.ndarray) -> np.ndarray:
        """``L^{-1} (theta - c)``."""
        if self._diagonal:
            return self._stretch((theta - self.center) / self._scale, inverse=True)
        return self._to_z @ (theta - self.center)

    def grad_z(self, grad_theta: np.ndarray) -> np.ndarray:
        """Chain rule: ``L^T grad_theta``."""
        if self._diagonal:
            return self._stretch(self._scale * grad_theta)
        return self.matrix.T @ grad_theta

    def linear_map(self) -> tuple[np.ndarray, np.ndarray]:
        """``(c, L)``, with ``L`` dense ``(d, d)`` or its diagonal ``(d,)`` (for compiled code
        that maps as :meth:`theta` and :meth:`grad_z` do; not with a low-rank correction)."""
        if self.correction is not None:
            raise ValueError(
                "This code maps coordinates in compiled code, with a dense or diagonal "
                "preconditioner only: use low_rank=0 with it."
            )
        return self.center, self._scale if self._diagonal else self.matrix

    def grad_z_rows(self, grads_theta: np.ndarray) -> np.ndarray:
        """:meth:`grad_z` applied to every row of an (n, d) array."""
        if not self._diagonal:
            return grads_theta @ self.matrix
        scaled = grads_theta * self._scale
        if self.correction is None:
            return scaled
        basis, stretch, _ = self.correction
        return scaled + ((scaled @ basis) * stretch) @ basis.T

    def covariance(self) -> np.ndarray:
        """``L L^T`` (dense), or its diagonal for a diagonal ``L`` (``D^2 diag(M^2)``)."""
        if not self._diagonal:
            return self.matrix @ self.matrix.T
        if self.correction is None:
            return self._scale**2
        basis, stretch, _ = self.correction
        return self._scale**2 * (1.0 + basis**2 @ ((1.0 + stretch) ** 2 - 1.0))

    def laplace_sd(self) -> np.ndarray:
        """Marginal sds of the Laplace fit in theta (from ``precision``; ones without one)."""
        cached = getattr(self, "_laplace_sd", None)
        if cached is not None:
            return cached
        if self.precision is None:
            sd = np.ones(len(self.center))
        elif self.precision.ndim == 1:
            sd = 1.0 / np.sqrt(self.precision)
        else:
            sd = np.sqrt(np.diag(np.linalg.inv(_dense(self.precision))))
        self._laplace_sd = sd
        return sd

    # ------------------------------------------------------------------ curvature
    def _curvature_range(self, precision: np.ndarray | None) -> tuple[float, float]:
        if precision is None:
            return 1.0, 1.0
        if precision.ndim == 1:
            scale = self._scale if self._diagonal else np.sqrt(np.sum(self.matrix**2, axis=1))
            diag = scale**2 * precision
            return float(diag.min()), float(diag.max())
        if len(precision) > EXACT_CURVATURE_MAX_DIM:
            diag = (self._scale**2) * np.diag(precision)
            return float(diag.min()), float(diag.max())
        if self._diagonal:
            curvature = precision * np.outer(self._scale, self._scale)
        else:
            curvature = self.matrix.T @ precision @ self.matrix
        eig = np.linalg.eigvalsh(symmetrised(curvature))
        return float(eig[0]), float(eig[-1])


def _dense(matrix: np.ndarray) -> np.ndarray:
    return np.diag(matrix) if matrix.ndim == 1 else symmetrised(matrix)
