"""SGLD step method (Welling & Teh, 2011), preconditioned by the Laplace fit at the MAP."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pymc_bigdata.adaptation import mean_share_bound
from pymc_bigdata.kernels.sgld import sgld_steps
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.gradient_oracle import DrawRecord, GradientOracle
from pymc_bigdata.step_methods.progress import ProgressField

__all__ = ["SGLD"]


class SGLD(SubsamplingStep):
    """Stochastic gradient Langevin dynamics as a PyMC step method.

    ``z <- z + (eps/2) g(z) + N(0, eps)`` in coordinates ``theta = theta* + L z`` where
    ``L L^T`` is the Laplace covariance at the MAP (the preconditioner; ``"diag"`` gives
    pSGLD-style diagonal preconditioning).  ``g`` is the control-variate minibatch gradient.

    Defaults: ``eps = 0.2 / lambda_max``, at most ``2 x 0.5 / sqrt(d / 2)`` (binding above
    d = 50: Euler's inflation ``eps / 4`` of every coordinate's variance takes at most half of
    the budget ``noise_shift_bound`` = 0.5 posterior sds of the draws' log density, see
    :mod:`pymc_bigdata.adaptation`), lowered in tuning until the gradient noise feeds at most
    ``noise_bound`` of the stationary variance (share ``eps V / 4``) in the noisiest
    coordinate and the mean noise share plus ``eps / 4`` is within that budget, and
    ``inner_steps = ceil(2 / (eps lambda_min))``,
    with ``lambda`` the eigenvalues of the curvature in ``z`` (both 1 with the default dense
    preconditioner).  Bias: O(eps); for a Gaussian posterior the stationary variance is
    ``1 / (1 - eps lambda / 4)`` times the truth, i.e. sd ratio 1.026 at the default.

    See :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` for the shared parameters
    (``batch_size``, ``step_size``, ``inner_steps``, ``preconditioner``, ``control_variates``,
    ``replace``, ``layer``).
    """

    name = "sgld"
    #: the gradient noise's share of the stationary variance
    progress_field = ProgressField("noise_share", "Noise share", "0.3f")
    default_step_size: ClassVar[float] = 0.2
    #: Welling & Teh (2011), Eq. 4, with none of our extensions: plain minibatch gradients
    #: of rows drawn uniformly at random and independently, no preconditioner, no census
    #: rows, the model's own coordinates, no tuning (give ``step_size``). Not built: the
    #: paper's decreasing steps ``a (b + t)^-gamma``; the step stays at the given value. The
    #: chain still starts at a draw of the MAP's Laplace fit.
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = dict(SubsamplingStep.EXTENSIONS_OFF)

    def default_inner(self) -> int:
        lam_min = self.precond.curvature_range[0]
        return max(1, math.ceil(2.0 / (self.step_size * lam_min) - 1e-9))

    def default_step(self) -> float:
        # never beyond 2x the unit-curvature step (Euler is unstable at eps >= 4 / lambda)
        step = min(super().default_step(), 2.0 * self.default_step_size)
        if self.noise_shift_bound is None:
            return step
        # Euler's own inflation eps / 4 per coordinate adds up over d coordinates as the
        # noise's does: it may take half of the mean-share bound, the noise the rest
        return min(step, 2.0 * mean_share_bound(self.layer.dim, self.noise_shift_bound))

    def own_share(self, step_size: float) -> float:
        """Euler's own inflation of each coordinate's variance, ``eps / 4`` (unit curvature)."""
        return step_size / 4.0

    def noise_share(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        """Gradient noise adds ``(eps/2)^2 V`` per step to the injected ``eps``: ``eps V / 4``."""
        return step_size * np.asarray(noise_var) / 4.0

    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        z, info = sgld_steps(
            z0, oracle, self.step_size, self.inner_steps, self.rng, last_grad=oracle.last
        )
        return z, info.finite, oracle.record()
