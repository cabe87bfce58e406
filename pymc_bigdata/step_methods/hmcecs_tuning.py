"""HMC-ECS's subsample tuning: ``m`` (perturbed), ``lambda`` and ``a`` (signed), the Taylor
space, and whether the control variates are poor enough to move the anchor.

:class:`~.hmcecs_subsample.SubsampleTuner` hands a :class:`SubsampleTuning` the estimator's
variance at every tuning draw (:meth:`~SubsampleTuning.measure`) and the residuals' spread it
measured on fresh rows (:meth:`~SubsampleTuning.best_space`, :meth:`~SubsampleTuning.seed`);
the tuning answers with the settings to use.

* ``m`` (Sec. 3.1): the ``SIZE_QUANTILE`` of ``m sigma_hat^2`` (4.3) over the draws, over
  ``loglik_var_target``, within ``[min_subsample, pool]``.
* ``lambda``, ``a`` (Sec. 5): :func:`~pymc_bigdata.kernels.hmcecs.block_poisson_settings`
  from the minibatch estimates' level and spread over the later half of the draws measured
  since the anchor (or the space) last changed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pymc_bigdata.kernels.hmcecs import Evaluation, block_poisson_settings
from pymc_bigdata.model.likelihood_inputs import LikelihoodInputs

__all__ = [
    "AUTO_SPACE_ESTIMATORS",
    "RECENTRED_SPACE",
    "RETUNE_AT",
    "RETUNE_EVERY",
    "SIZE_QUANTILE",
    "SignedSettings",
    "SubsampleTuning",
    "candidate_spaces",
]

#: the automatic m holds this quantile of sigma_hat^2 over the tuning draws at the target: the
#: bias correction exp(-sigma_hat^2 / 2) of (4.5) is exact only for normal estimates, and the
#: variance grows fast away from the anchor (as |theta - theta*|^6 with second-order
#: control variates), so a mean near 1 lets the tails carry variances of 5-20, where the
#: perturbed posterior is visibly too light (measured: sd ratio 0.835 on a hierarchical model)
SIZE_QUANTILE = 0.9

#: tuning draws after which ``m`` (or ``lambda``, ``a``) is re-chosen, then every this many
RETUNE_AT = (10, 25, 50)
RETUNE_EVERY = 50

#: ``taylor_space="auto"`` compares the expansions for the signed estimator only. The
#: perturbed one keeps the parameters in the model's own coordinates: its gradient (4.7)
#: carries ``grad sigma_hat^2``, whose row weights ``(N/m)^2`` make the fixed-subsample energy
#: rough when a better expansion lets ``m`` drop. On the non-centred hierarchical model in its
#: own coordinates (benchmarks/results/hard_targets_hmcecs_spaces.md) the inputs' expansion
#: gave m = 100 and 0.118 sd (outside the 0.1 bar; a one-off run with the same seed got ESS
#: 19, one chain's step size 0.10), and with m = 1000 0.060 sd; the parameters' meets the
#: bars at m = 7,769. In re-centred coordinates (``RECENTRED_SPACE``) it expands in the inputs.
AUTO_SPACE_ESTIMATORS = ("signed",)

#: the perturbed estimator's space where the step samples group effects re-centred
#: (:mod:`~pymc_bigdata.step_methods.coordinates`): the map from the sampler's ``w_j`` to the
#: effects ``a_j = loc + scale^(1 - c_j) (w_j - c_j loc)`` is nonlinear for every partially
#: centred group, and a second-order expansion in the parameters carries its curvature into
#: the residuals, heavy-tailed there (kurtosis 600-3,700 on the two-level hierarchy, the
#: 100-row sigma_hat^2 four times below the pool's). Measured at seed 2026
#: (benchmarks/results/hard_targets_hmcecs_recentred_{a,b}.md): max error over the 8
#: re-centred hierarchies 0.416 sd in the parameters, 0.126 in the inputs
RECENTRED_SPACE = "likelihood_inputs"

#: the recent tuning draws at which ``taylor_space="auto"`` compares the two expansions
SPACE_DRAWS = 10


def candidate_spaces(
    given: str,
    estimator: str,
    taylor_order: int,
    inputs: LikelihoodInputs,
    recentred: bool = False,
) -> list[str]:
    """The Taylor spaces ``taylor_space=given`` may choose between (the first is the
    start): the given one, or with ``"auto"`` the likelihood's inputs beside the parameters
    where they are a nonlinear function of them (signed estimator, ``AUTO_SPACE_ESTIMATORS``),
    or the inputs alone for the perturbed one in ``recentred`` coordinates
    (``RECENTRED_SPACE``)."""
    if given != "auto":
        return [given]
    nonlinear = taylor_order >= 1 and inputs.available and not inputs.linear
    if estimator not in AUTO_SPACE_ESTIMATORS:
        return [RECENTRED_SPACE] if recentred and nonlinear else ["parameters"]
    return ["parameters", "likelihood_inputs"] if nonlinear else ["parameters"]


class SignedSettings(NamedTuple):
    """The signed estimator's ``lambda`` (products) and ``a`` (lower bound)."""

    products: int
    lower_bound: float


class SubsampleTuning:
    """One chain's measurements for ``m`` or ``lambda``/``a`` (see the module docstring).

    Parameters
    ----------
    signed
        The block-Poisson estimator (else the perturbed one).
    loglik_var_target, sign_tolerance
        The variance aimed at, and the signed estimator's largest ``1 - E[sign]``.
    min_subsample
        The smallest automatic ``m``.
    """

    def __init__(
        self, *, signed: bool, loglik_var_target: float, sign_tolerance: float, min_subsample: int
    ):
        self.signed, self.target = signed, loglik_var_target
        self.sign_tolerance, self.min_subsample = sign_tolerance, min_subsample
        #: perturbed: m sigma_hat^2 per tuning draw
        self._unit_vars: list[float] = []
        #: signed: (mu_hat, variance of one minibatch estimate) per tuning draw
        self._level_draws: list[tuple[float, float]] = []
        #: the window's m sigma_hat^2 (or sigma^2)
        self._window_spread: list[float] = []
        #: the recent tuning draws the space is chosen from
        self.recent_thetas: list[np.ndarray] = []

    @staticmethod
    def due(index: int, last: int) -> bool:
        """Whether ``m`` (or ``lambda``) is re-chosen after tuning draw ``index``, up to
        draw ``last`` (the terminal buffer's start: the step size settles with it)."""
        scheduled = index in RETUNE_AT or (index > RETUNE_AT[-1] and index % RETUNE_EVERY == 0)
        return scheduled and index <= last

    def note_position(self, theta: np.ndarray) -> None:
        """A tuning draw's position, for the next choice of space."""
        self.recent_thetas = [*self.recent_thetas[-(SPACE_DRAWS - 1) :], theta]

    def measure(self, evaluation: Evaluation, subsample_size: int, products: int) -> None:
        """A tuning draw's estimate: its ``sigma_hat^2`` (perturbed, as ``m sigma_hat^2``) or
        its level and one minibatch estimate's variance (signed)."""
        if not math.isfinite(evaluation.loglik_var):
            return
        if not self.signed:
            unit_var = evaluation.loglik_var * subsample_size
            self._unit_vars.append(unit_var)
            self._window_spread.append(unit_var)
        elif math.isfinite(evaluation.level):
            sigma2 = evaluation.loglik_var * products
            self._level_draws.append((evaluation.level, sigma2))
            self._window_spread.append(sigma2)

    def forget(self) -> None:
        """The residuals changed (a new anchor or space): the measurements so far are void."""
        self._unit_vars, self._level_draws = [], []

    def window_ended(self) -> None:
        """A tuning window ended: :meth:`poor_control_variates` starts again."""
        self._window_spread = []

    def poor_control_variates(self) -> bool:
        """Whether the window's estimates needed more rows than the smallest automatic ``m``
        (their ``SIZE_QUANTILE`` of ``m sigma_hat^2`` above ``loglik_var_target`` times it):
        the Taylor expansion is then off where the chain is (e.g. an anchor at a MAP far from
        the posterior's bulk), which only a better anchor can fix cheaply."""
        if not self._window_spread:
            return False
        spread = float(np.quantile(self._window_spread, SIZE_QUANTILE))
        if not self.signed:  # m sigma_hat^2: the m that would meet the target
            return spread / self.target > self.min_subsample
        return spread > self.target  # one minibatch estimate's variance

    def best_space(self, spreads: dict[str, list[tuple[float, float]]]) -> str:
        """The space whose ``0.9`` quantile of the residuals' spread is smallest (ties: the
        first, the parameters)."""
        return min(spreads, key=lambda sp: float(np.quantile([v for _, v in spreads[sp]], 0.9)))

    def seed(self, measured: list[tuple[float, float]], pool: int, minibatch: int) -> None:
        """Seed the measurements with the chosen space's ``(level, per-row variance)``
        measured on fresh rows: ``m sigma_hat^2`` (perturbed) or ``m sigma^2`` (signed) is
        the per-row variance times ``N``."""
        unit = [pool * var for _, var in measured]
        if not self.signed:
            self._unit_vars = [*self._unit_vars, *unit]
        else:
            levels = [(level, u / minibatch) for (level, _), u in zip(measured, unit)]
            self._level_draws = [*self._level_draws, *levels]

    def subsample_size(self, pool: int) -> int | None:
        """``m = quantile(m sigma_hat^2) / target``, within ``[min_subsample, pool]`` (None
        without measurements); the measurements are used up."""
        if not self._unit_vars:
            return None
        wanted = float(np.quantile(self._unit_vars, SIZE_QUANTILE)) / self.target
        size = int(min(pool, max(self.min_subsample, math.ceil(wanted))))
        self._unit_vars = []
        return size

    def signed_settings(self, pool: int, minibatch: int) -> SignedSettings | None:
        """``lambda`` and ``a`` from the measurements (None without any)."""
        if not self._level_draws:
            return None
        # the later half of the draws measured since the anchor (or the Taylor space) last
        # changed: sigma^2 at a draw does not depend on lambda, so they all count (one
        # window's 50 draws gave lambda from 4 to 34 on one chain)
        recent = self._level_draws[len(self._level_draws) // 2 :]
        levels = np.array([level for level, _ in recent])
        within = np.array([sigma2 for _, sigma2 in recent])
        # one minibatch estimate's variance about a fixed a: within a draw (its
        # SIZE_QUANTILE over the draws, as for m), plus across draws
        spread = float(np.quantile(within, SIZE_QUANTILE))
        variance = spread + (float(np.var(levels)) if len(levels) > 1 else 0.0)
        lam, a = block_poisson_settings(
            float(np.mean(levels)),
            math.sqrt(variance),
            self.target,
            self.sign_tolerance,
            max_products=max(1, math.ceil(pool / minibatch)),
        )
        return SignedSettings(lam, a)
