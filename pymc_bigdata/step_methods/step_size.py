"""Step-size policies: the collaborator a sampler declares to choose its step size in tuning.

The step asks its policy at the schedule's draws (2, 5, every 10th, the window ends, the
terminal buffer's start) and once more when tuning stops (``final``), handing it a
:class:`StepContext` of what a policy may read; the policy answers with a :class:`StepChoice`
that the step applies (then it recomputes its transitions per draw from its own default).

* :class:`NoiseLimitedStepSize` (SGLD, SGHMC, EWSG): the largest step whose gradient noise
  feeds at most ``noise_bound`` of the stationary variance, with the batch size and the
  control variates' order chosen alongside.
* :class:`DualAveragingStepSize` (HMC-ECS, Austerity): dual averaging towards a target
  acceptance (:mod:`pymc_bigdata.dual_averaging`), updated at every accept decision; the
  averaged step when tuning stops.
* :class:`CurvatureStepSize` (SBPS's travel time): the sampler's curvature default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_bigdata.adaptation import largest_step_within_noise_bound, mean_share_bound
from pymc_bigdata.dual_averaging import dual_averaging_init, dual_averaging_update

__all__ = [
    "BATCH_CHANGE",
    "MAX_BATCH_GROWTH",
    "SECOND_ORDER_GAIN",
    "CurvatureStepSize",
    "DualAveragingStepSize",
    "NoiseLimitedStepSize",
    "StepChoice",
    "StepContext",
    "require_noise_model",
]

#: with the default batch size, tuning raises it (up to this multiple of the default, and
#: at most all rows) while the gradient noise limits the step size, and lowers it again
#: (never below the default) when it no longer does. The noise variance falls as
#: ``1/n - 1/N`` while the noise-limited step rises in proportion, so the travel per row
#: read is at least as good with the larger batch and the draws need fewer transitions
MAX_BATCH_GROWTH = 20
#: the batch size changes only by more than this factor (either way)
BATCH_CHANGE = 1.25

#: second order is chosen when its worst noise variance is below this fraction of first
#: order's and first order's would limit the step size
SECOND_ORDER_GAIN = 0.5


def require_noise_model(sampler: type, noise_limited: bool) -> None:
    """Refuse a sampler on the noise-limited step size (``noise_limited``) that states no
    noise model: ``noise_share(step_size, noise_var)``, the share of its stationary variance
    that gradient noise of variance ``noise_var`` feeds at ``step_size``."""
    if noise_limited and not callable(getattr(sampler, "noise_share", None)):
        raise TypeError(
            f"{sampler.__name__} uses the noise-limited step size: define noise_share(step_size, "
            "noise_var), or declare another policy with _make_step_policy()."
        )


class StepContext(NamedTuple):
    """What a policy may read of the step when it chooses.

    Attributes
    ----------
    default_step
        The sampler's curvature default for the step size, times the stability watch's
        factor.
    cv_order, batch_size
        The current control-variate order and batch size.
    noise_variance
        ``noise_variance(order, batch_size)``: the measured per-coordinate variance of a
        ``batch_size``-row estimate of that order (empty before any measurement).
    unit_noise_variance
        ``unit_noise_variance(order)``: the measured per-unit noise ``N^2 s^2`` (any batch).
    order_choice
        Whether first and second order may be chosen between (second order available and
        ``control_variates="auto"``).
    """

    default_step: float
    cv_order: int
    batch_size: int
    noise_variance: Callable[[int, int], np.ndarray]
    unit_noise_variance: Callable[[int], np.ndarray]
    order_choice: bool


class StepChoice(NamedTuple):
    """A policy's answer; None leaves the setting as it is. ``inner``: the step recomputes
    its transitions per draw from its default (at the new step size)."""

    step_size: float | None = None
    batch_size: int | None = None
    cv_order: int | None = None
    inner: bool = True


class NoiseLimitedStepSize:
    """The largest step size whose gradient noise feeds at most ``noise_bound`` of the
    stationary variance (``largest_step_within_noise_bound``), below the curvature default.

    Parameters
    ----------
    noise_share
        ``noise_share(step_size, noise_var)``: the share of the kernel's stationary variance
        that gradient noise of variance ``noise_var`` (per coordinate) feeds at
        ``step_size`` (the sampler's noise model; increasing in both).
    noise_bound
        Largest share of the stationary variance the gradient noise may feed.
    noise_shift_bound
        Largest shift of the draws' log density (in its posterior sds) the gradient noise
        may cause over all coordinates: the mean share is kept within
        :func:`~pymc_bigdata.adaptation.mean_share_bound`; None: no such bound.
    own_share
        ``own_share(step_size)``: the kernel's own inflation of every coordinate's variance
        (SGLD's ``eps / 4``), counted in the mean share; None: the kernel has none.
    fixed_step, fixed_batch
        A given step size or batch size is kept (the order is still chosen).
    default_batch, pool_size, replace
        The default batch size (the smallest the policy picks), the rows subsampled and
        whether rows are drawn with replacement (the noise falls as ``1/n`` or ``1/n - 1/N``).
    """

    def __init__(
        self,
        *,
        noise_share: Callable[[float, np.ndarray], np.ndarray],
        noise_bound: float,
        noise_shift_bound: float | None = None,
        own_share: Callable[[float], float] | None = None,
        fixed_step: bool,
        fixed_batch: bool,
        default_batch: int,
        pool_size: int,
        replace: bool,
    ):
        self.noise_share, self.noise_bound = noise_share, noise_bound
        self.noise_shift_bound, self.own_share = noise_shift_bound, own_share
        self.fixed_step, self.fixed_batch = fixed_step, fixed_batch
        self.default_batch, self.pool_size, self.replace = default_batch, pool_size, replace

    def observe(self, stats: dict) -> None:
        """A tuning draw's stats: nothing to learn from them."""

    def share(self, step_size: float, noise_var: np.ndarray) -> float:
        """The worst coordinate's share of the stationary variance fed by gradient noise of
        variance ``noise_var`` at ``step_size``."""
        return float(np.max(self.noise_share(step_size, noise_var)))

    def shares(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        """Each coordinate's share of the stationary variance fed by gradient noise of
        variance ``noise_var`` at ``step_size``."""
        return np.asarray(self.noise_share(step_size, noise_var), dtype=np.float64)

    def new_coordinates(self, step_size: float) -> None:
        """The preconditioner changed: nothing to restart (the noise decides)."""

    def mean_bound(self, dim: int) -> float | None:
        """The bound on the mean share over ``dim`` coordinates (None: none)."""
        if self.noise_shift_bound is None:
            return None
        return mean_share_bound(dim, self.noise_shift_bound)

    def _largest_step(self, noise_var: np.ndarray, default_step: float) -> float:
        return largest_step_within_noise_bound(
            self.noise_share,
            noise_var,
            default_step,
            self.noise_bound,
            mean_bound=self.mean_bound(noise_var.size),
            own_share=self.own_share,
        )

    def choose(self, context: StepContext, final: bool) -> StepChoice:
        """Order, batch size and step size from the measured noise (``final`` changes
        nothing: the last choice stands)."""
        order = self._order(context) if context.order_choice else context.cv_order
        if self.fixed_step:
            return StepChoice(cv_order=order, inner=False)
        noise_var = context.noise_variance(order, context.batch_size)
        batch = context.batch_size
        if noise_var.size and not self.fixed_batch:
            batch = self._batch(context, order)
            noise_var = context.noise_variance(order, batch)
        step = (
            self._largest_step(noise_var, context.default_step)
            if noise_var.size
            else context.default_step
        )
        return StepChoice(step, batch, order)

    def _order(self, context: StepContext) -> int:
        first = context.noise_variance(1, context.batch_size)
        second = context.noise_variance(2, context.batch_size)
        if not first.size or not second.size:
            return context.cv_order
        default = context.default_step
        limited = self._largest_step(first, default)
        better = np.max(second) < SECOND_ORDER_GAIN * np.max(first)
        return 2 if (limited < default and better) else 1

    def _batch(self, context: StepContext, order: int) -> int:
        """The batch size at which the noise share at the default step is at the bound
        (the worst coordinate's, and the mean's where :meth:`mean_bound` binds; see
        ``MAX_BATCH_GROWTH``); the current one when the change would be small."""
        unit_var = context.unit_noise_variance(order)
        per_unit = float(np.max(unit_var))
        share_per_unit = float(self.noise_share(context.default_step, np.array([per_unit]))[0])
        n = context.batch_size
        if not math.isfinite(share_per_unit):
            return n
        factor = self.noise_bound / share_per_unit if share_per_unit > 0 else math.inf
        mean_bound = self.mean_bound(unit_var.size)
        if mean_bound is not None:
            mean_per_unit = float(np.mean(self.noise_share(context.default_step, unit_var)))
            own = 0.0 if self.own_share is None else self.own_share(context.default_step)
            if mean_per_unit > 0:
                factor = min(factor, max(mean_bound - own, 0.0) / mean_per_unit)
        pool = self.pool_size
        if math.isinf(factor):
            wanted = 1.0
        elif factor <= 0:  # the kernel's own share fills the budget: as many rows as allowed
            wanted = float(pool)
        else:  # the largest factor 1/n (- 1/N) that keeps the shares within their bounds
            wanted = 1.0 / factor if self.replace else 1.0 / (factor + 1.0 / pool)
        largest = min(pool, MAX_BATCH_GROWTH * self.default_batch)
        new = int(min(max(math.ceil(wanted), self.default_batch), largest))
        if new == n or (max(new / n, n / new) <= BATCH_CHANGE and new != largest):
            return n
        return new


class DualAveragingStepSize:
    """Dual averaging of the step size towards ``target`` mean acceptance, updated by the
    sampler at each accept decision (:meth:`update`) and restarted when its coordinates
    change (:meth:`restart`); when tuning stops, the averaged step.

    Parameters
    ----------
    target
        The mean acceptance aimed at.
    step_size
        Where to start.
    fixed_step
        A given step size is kept.
    """

    def __init__(self, *, target: float, step_size: float, fixed_step: bool):
        self.target, self.fixed_step = target, fixed_step
        self.restart(step_size)

    def restart(self, step_size: float) -> None:
        """Start again from ``step_size`` (new coordinates)."""
        self._state = dual_averaging_init(step_size)

    def observe(self, stats: dict) -> None:
        """A tuning draw's stats: nothing to learn from them."""

    def share(self, step_size: float, noise_var: np.ndarray) -> float:
        """The worst coordinate's noise share at ``step_size`` (NaN: no gradient noise
        enters this sampler's target, its accept test or its bounces absorb it)."""
        return math.nan

    def shares(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        """Each coordinate's noise share (NaN, as :meth:`share`)."""
        return np.full(np.shape(noise_var), math.nan)

    def new_coordinates(self, step_size: float) -> None:
        """The preconditioner changed: the acceptance history belongs to the old
        coordinates, start again from ``step_size``."""
        self.restart(step_size)

    def update(self, accept_prob: float) -> float:
        """One accept decision's probability (0 for a divergence); returns the next step."""
        self._state = dual_averaging_update(self._state, accept_prob, self.target)
        return math.exp(self._state.log_step)

    def choose(self, context: StepContext, final: bool) -> StepChoice:
        """The averaged step when tuning stops; nothing before (:meth:`update` sets it)."""
        if final and not self.fixed_step:
            return StepChoice(step_size=math.exp(self._state.log_step_avg))
        return StepChoice()


class CurvatureStepSize:
    """The sampler's curvature default (e.g. SBPS's travel time, from the preconditioner's
    curvature), followed as the preconditioner changes; a given value is kept."""

    def __init__(self, *, fixed_step: bool):
        self.fixed_step = fixed_step

    def observe(self, stats: dict) -> None:
        """A tuning draw's stats: nothing to learn from them."""

    def share(self, step_size: float, noise_var: np.ndarray) -> float:
        """The worst coordinate's noise share at ``step_size`` (NaN: no gradient noise
        enters this sampler's target, its accept test or its bounces absorb it)."""
        return math.nan

    def shares(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        """Each coordinate's noise share (NaN, as :meth:`share`)."""
        return np.full(np.shape(noise_var), math.nan)

    def new_coordinates(self, step_size: float) -> None:
        """The preconditioner changed: the default follows it at the next choice."""

    def choose(self, context: StepContext, final: bool) -> StepChoice:
        """The default, unless fixed."""
        return StepChoice() if self.fixed_step else StepChoice(step_size=context.default_step)
