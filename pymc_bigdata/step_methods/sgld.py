"""SGLD step method (Welling & Teh, 2011), preconditioned by the Laplace fit at the MAP."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pymc_bigdata.adaptation import mean_share_bound
from pymc_bigdata.kernels.sgld import sgld_steps, split_increments
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.gradient_oracle import DrawRecord, GradientOracle
from pymc_bigdata.step_methods.progress import ProgressField
from pymc_bigdata.step_methods.step_refinement import StepRefinement, check_max_refinements

__all__ = ["SGLD"]


class SGLD(SubsamplingStep):
    """Stochastic gradient Langevin dynamics as a PyMC step method.

    ``z <- z + (eps/2) g(z) + N(0, eps)`` in coordinates ``theta = theta* + L z`` where
    ``L L^T`` is the Laplace covariance at the MAP (the preconditioner; ``"diag"`` gives
    pSGLD-style diagonal preconditioning).  ``g`` is the control-variate minibatch gradient.

    Defaults: ``eps = 0.2 / lambda_max``, at most ``2 x 0.5 / sqrt(d / 2)`` (binding above
    d = 50: Euler's inflation ``eps / 4`` of every coordinate's variance takes at most half of
    the budget ``noise_shift_bound`` = 0.5 posterior sds of the draws' log density, see
    :mod:`pymc_bigdata.adaptation`; below ``N = 25 d`` rows the budget is
    ``0.1 sqrt(N / d)``, which keeps a residual scale within 0.1 of its sds,
    :func:`~pymc_bigdata.adaptation.residual_scale_shift_bound`), lowered in tuning until the
    gradient noise feeds at most ``noise_bound`` of the stationary variance (share
    ``eps V / 4``) in the noisiest coordinate and the mean noise share plus ``eps / 4`` is
    within that budget, and
    ``inner_steps = ceil(2 / (eps lambda_min))``,
    with ``lambda`` the eigenvalues of the curvature in ``z`` (both 1 with the default dense
    preconditioner).  Bias: O(eps); for a Gaussian posterior the stationary variance is
    ``1 / (1 - eps lambda / 4)`` times the truth, i.e. sd ratio 1.026 at the default.

    See :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` for the shared parameters
    (``batch_size``, ``step_size``, ``inner_steps``, ``preconditioner``, ``control_variates``,
    ``replace``, ``layer``).

    Parameters
    ----------
    max_refinements
        An extension, off by default (0, as in ``PAPER_SETTINGS``; give e.g. 6): how many
        times a draw whose path was too stiff for its step is re-run from its start at half
        the step, twice the steps (the same time) and the same Brownian path
        (:func:`~pymc_bigdata.kernels.sgld.split_increments`). Too stiff: a non-finite value,
        ``eps kappa`` above 2 (Euler is unstable at 4), or, above ``eps kappa = 0.25``, a
        path curvature ``kappa`` more than twice the chain's typical one
        (:class:`~pymc_bigdata.step_methods.step_refinement.StepRefinement` with
        ``order=1``). The stat ``step_refinements`` counts the halvings of each draw. Off by
        default: measured, they help only in a stiff tail (``sparse_regions``); on a skewed
        posterior (``rare_event_logistic``) they let tuning keep the default step where
        divergences had halved it, and with it Euler's first-order inflation of the sds
        (2.5 % there; ``docs/sgld.md``).
    """

    name = "sgld"
    #: Euler's inflation is realised in full, the gradient noise's largely (measured:
    #: ``tests/step_methods/test_sgld.py``): ``noise_shift_bound="auto"`` also keeps a
    #: residual scale within 0.1 sd
    realises_inflation: ClassVar[bool] = True
    #: the gradient noise's share of the stationary variance
    progress_field = ProgressField("noise_share", "Noise share", "0.3f")
    default_step_size: ClassVar[float] = 0.2
    #: Welling & Teh (2011), Eq. 4, with none of our extensions: plain minibatch gradients
    #: of rows drawn uniformly at random and independently, no preconditioner, no census
    #: rows, the model's own coordinates, no tuning (give ``step_size``). Not built: the
    #: paper's decreasing steps ``a (b + t)^-gamma``; the step stays at the given value. The
    #: chain still starts at a draw of the MAP's Laplace fit.
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        **SubsamplingStep.EXTENSIONS_OFF,
        "max_refinements": 0,
    }
    #: re-runs of a too-stiff draw at a halved step: none unless asked (see ``max_refinements``)
    default_max_refinements: ClassVar[int] = 0

    stats_dtypes_shapes = {
        **SubsamplingStep.stats_dtypes_shapes,
        "step_refinements": (np.int64, []),
    }

    def __init__(self, vars=None, *, max_refinements: int | None = None, **kwargs):
        self.max_refinements = check_max_refinements(max_refinements, self.default_max_refinements)
        self.refinement = StepRefinement(self.max_refinements, order=1)
        super().__init__(vars, **kwargs)

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

    def _reset_kernel_state(self) -> None:
        self._refinements = 0

    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        if not self.max_refinements:
            z, info = sgld_steps(
                z0, oracle, self.step_size, self.inner_steps, self.rng,
                last_grad=oracle.last, track_curvature=False,
            )  # fmt: skip
            return z, info.finite, oracle.record()
        if self._draw_index == 0:
            self.refinement.restart()

        def run_at(step: float, n_steps: int, innovations: np.ndarray) -> tuple[np.ndarray, Any]:
            return sgld_steps(
                z0, oracle, step, n_steps, self.rng, last_grad=oracle.last, innovations=innovations
            )

        innovations = self.rng.standard_normal((self.inner_steps, z0.shape[0]))
        z, info, refined = self.refinement.run(
            run_at,
            lambda coarse, _step: split_increments(coarse, self.rng),
            innovations,
            self.step_size,
            self.inner_steps,
            observe=self.tune,
            again=oracle.again,
        )
        self._refinements = refined.refinements
        return z, info.finite, oracle.record()

    def _extra_stats(self) -> dict[str, Any]:
        return {"step_refinements": self._refinements}
