"""HMC-ECS's subsample choice in tuning: when to measure, on which rows, and what to use.

A :class:`SubsampleTuner` drives one chain's :class:`~.hmcecs_tuning.SubsampleTuning`. At the
chain's first tuning draw (:meth:`~SubsampleTuner.pilot`) and then on the tuning's schedule
(:meth:`~SubsampleTuner.after_draw`) it measures the Taylor residuals' spread on fresh rows of
the pool (all rows but the census stratum) in each candidate space, keeps the space whose
residuals vary less, and re-chooses ``m`` (perturbed) or ``lambda`` and ``a`` (signed). It
answers with the :class:`SubsampleSettings` the step should use from then on; the step applies
them (a new space re-evaluates the estimate, a new ``m``, ``lambda`` or ``a`` redraws the
subsample). At a tuning window's end it gives the anchor to move to
(:meth:`~SubsampleTuner.window_ended`): re-centred on the window's draws where the control
variates were poor (Sec. 6.3).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pymc_bigdata.kernels.hmcecs import Evaluation
from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.hmcecs_estimates import (
    anchor_at,
    residual_spreads,
    take_pool_rows,
)
from pymc_bigdata.step_methods.hmcecs_settings import GivenCounts
from pymc_bigdata.step_methods.hmcecs_tuning import SubsampleTuning, candidate_spaces

__all__ = ["MIN_REFIT_DRAWS", "MIN_SUBSAMPLE", "SubsampleSettings", "SubsampleTuner"]

#: the smallest automatic subsample size (perturbed): below it sigma_hat^2 is itself noisy
MIN_SUBSAMPLE = 100

#: a window re-fits the anchor only from at least this many draws
MIN_REFIT_DRAWS = 20

#: rows of the pool that one measurement of the residuals' spread reads (at most)
MEASURED_ROWS = 1000


class SubsampleSettings(NamedTuple):
    """What the tuning chooses: the Taylor space, ``m`` (perturbed), ``lambda`` and ``a``
    (signed)."""

    taylor_space: str
    subsample_size: int
    products: int
    lower_bound: float


class SubsampleTuner:
    """One chain's choice of the Taylor space and of ``m`` or ``lambda``, ``a`` (see the
    module docstring).

    Parameters
    ----------
    layer
        The model layer: its rows and difference terms give the residuals.
    pool_rows
        The subsampled rows' indices (None: all rows, no census).
    pool
        ``N``, the number of subsampled rows.
    estimator
        ``"perturbed"`` or ``"signed"``.
    given, given_space, given_lower_bound
        The counts, the ``taylor_space`` and the ``lower_bound`` the user gave (None: tuned).
    taylor_order
        The control variates' order.
    minibatch
        The signed estimator's rows per minibatch estimate.
    loglik_var_target, sign_tolerance
        The variance aimed at, and the signed estimator's largest ``1 - E[sign]``.
    """

    def __init__(
        self,
        layer: MinibatchModel,
        *,
        pool_rows: np.ndarray | None,
        pool: int,
        estimator: str,
        given: GivenCounts,
        given_space: str,
        given_lower_bound: float | None,
        taylor_order: int,
        minibatch: int,
        loglik_var_target: float,
        sign_tolerance: float,
    ):
        self.layer, self.pool_rows, self.pool = layer, pool_rows, pool
        self.signed = estimator == "signed"
        self.taylor_order, self.minibatch = taylor_order, minibatch
        #: the Taylor spaces to choose between
        recentred = layer.reparam is not None and layer.reparam.moves_coordinates
        self.spaces = candidate_spaces(
            given_space, estimator, taylor_order, layer.likelihood_inputs, recentred
        )
        #: ``m`` (perturbed) or ``lambda``, ``a`` (signed) given: only the space is chosen
        self.fixed = (given.products if self.signed else given.subsample_size) is not None
        n_rows = layer.n_rows
        #: the smallest automatic ``m``
        self.min_subsample = min(n_rows, max(MIN_SUBSAMPLE, given.blocks or 0))
        #: the settings a chain starts from
        self.start = SubsampleSettings(
            self.spaces[0] if given_space == "auto" else given_space,
            given.subsample_size or min(1000, n_rows),
            given.products or 1,
            given_lower_bound if given_lower_bound is not None else -1.0,
        )
        self.loglik_var_target, self.sign_tolerance = loglik_var_target, sign_tolerance
        self.restart(None)

    def restart(self, anchor: Anchor | None) -> None:
        """A new chain, at ``anchor``: no measurements, no pilot yet, an empty window."""
        self.tuning = SubsampleTuning(
            signed=self.signed,
            loglik_var_target=self.loglik_var_target,
            sign_tolerance=self.sign_tolerance,
            min_subsample=self.min_subsample,
        )
        self.piloted = False
        self._anchor_seen = anchor
        self._window_sum, self._window_count = np.zeros(self.layer.dim), 0

    # ------------------------------------------------------------------ m, lambda, a and the space
    def pilot(
        self,
        theta: np.ndarray,
        current: SubsampleSettings,
        anchor: Anchor,
        rng: np.random.Generator,
    ) -> SubsampleSettings:
        """At a chain's first tuning draw, at ``theta``: the Taylor space (``"auto"``) and one
        estimate of the residuals' spread (``min(1000, N)`` rows), so that the first
        iterations already use a sensible size. Nothing to choose: no measurement, no random
        numbers used."""
        self.piloted = True
        if self.fixed and len(self.spaces) == 1:
            return current
        chosen = self._choose_space([theta], current, anchor, rng, force=True)
        if not self.fixed:
            chosen = self._retune(chosen)
        self.tuning.forget()
        return chosen

    def after_draw(
        self,
        theta: np.ndarray,
        evaluation: Evaluation,
        current: SubsampleSettings,
        index: int,
        last: int,
        anchor: Anchor,
        rng: np.random.Generator,
    ) -> SubsampleSettings:
        """Tuning draw ``index`` (from 1) at ``theta``, with its estimate ``evaluation``:
        collect what the automatic ``m`` (or ``lambda``, ``a``) is chosen from, and re-choose
        it (and the space) on the schedule, up to draw ``last`` (the terminal buffer's start,
        so that the step size settles with it)."""
        self.tuning.note_position(theta)
        exact = not self.signed and current.subsample_size >= self.pool
        if not exact:  # exact: nothing to learn
            self.tuning.measure(evaluation, current.subsample_size, current.products)
        if not self.tuning.due(index, last):
            return current
        chosen = self._choose_space(self.tuning.recent_thetas, current, anchor, rng)
        return self._retune(chosen)

    def _choose_space(
        self,
        thetas: list[np.ndarray],
        current: SubsampleSettings,
        anchor: Anchor,
        rng: np.random.Generator,
        force: bool = False,
    ) -> SubsampleSettings:
        """Measure the residuals' spread at ``thetas`` on one fresh set of ``min(1000, N)``
        rows in each candidate space, keep the space whose ``SIZE_QUANTILE`` of the spread is
        smaller (ties: the parameters) and seed the measurements for ``m`` (or ``lambda``,
        ``a``) with its numbers. Without a choice to make, only ``force`` (the pilot)
        measures."""
        if not thetas or (len(self.spaces) == 1 and not force):
            return current
        positions = rng.integers(self.pool, size=min(MEASURED_ROWS, self.pool))
        rows = take_pool_rows(self.layer, self.pool_rows, positions)
        ddof = 1 if self.signed else 0  # as (4.3), and the signed rule's
        terms, order = self.layer.difference_terms, self.taylor_order
        spreads = residual_spreads(terms, rows, anchor, order, self.spaces, thetas, self.pool, ddof)
        if not spreads:
            return current
        best = self.tuning.best_space(spreads)
        if best != current.taylor_space:  # the measurements so far belong to the other one
            current = current._replace(taylor_space=best)
            self.tuning.forget()
        self.tuning.seed(spreads[best], self.pool, self.minibatch)
        return current

    def _retune(self, current: SubsampleSettings) -> SubsampleSettings:
        """The tuning's ``m`` (perturbed) or ``lambda``, ``a`` (signed), unless given."""
        if self.fixed:
            return current
        if not self.signed:
            size = self.tuning.subsample_size(self.pool)
            if size is not None and size != current.subsample_size:
                return current._replace(subsample_size=size)
            return current
        settings = self.tuning.signed_settings(self.pool, self.minibatch)
        if settings is not None and settings != (current.products, current.lower_bound):
            return current._replace(products=settings.products, lower_bound=settings.lower_bound)
        return current

    # ------------------------------------------------------------------ the anchor
    def window_draw(self, theta: np.ndarray) -> None:
        """A draw of the tuning window the base collects (its mean may become the anchor)."""
        self._window_sum += theta
        self._window_count += 1

    def window_ended(self, may_move: bool = True) -> Anchor | None:
        """A tuning window ended: where the control variates were poor
        (:meth:`~.hmcecs_tuning.SubsampleTuning.poor_control_variates`), the anchor moved to
        the mean of the window's draws (at least ``MIN_REFIT_DRAWS``) with the full-data
        curvature there (:func:`~.hmcecs_estimates.anchor_at`: second order, ``d <= 2000``;
        one gradient and one Hessian pass over the data); else None.

        ``may_move=False`` (the signed estimator, where no later tuning draw re-chooses
        ``lambda`` and ``a``): the anchor stays with the settings measured at it. Moved at the
        terminal buffer's start, it left ``a = mu - lambda`` at the old anchor's level
        (``two_level_logistic_noncentred`` seed 2: ``Var log |L_hat|`` 38 times its target at
        the draws, 15 % negative signs; re-measuring there on the pilot's 1,000 rows chose
        ``lambda`` 3 on the other chain, whose draws then had a variance of 5,879). The
        perturbed estimator's ``m`` stays valid for a better anchor, which only shrinks the
        residuals: it still moves (kept from there, ``hier_logistic_centred`` in
        ``test_hard_hmcecs_ewsg.py`` ended 4.6 MCSE off)."""
        poor = self.tuning.poor_control_variates()
        anchor = None
        if poor and may_move and self._window_count >= MIN_REFIT_DRAWS:
            center = self._window_sum / self._window_count
            anchor = anchor_at(self.layer, center, self.taylor_order)
        self._window_sum, self._window_count = np.zeros(self.layer.dim), 0
        self.tuning.window_ended()
        return anchor

    def watch_anchor(self, anchor: Anchor) -> None:
        """The anchor now in use: a moved one voids the measurements (the residuals
        changed)."""
        if anchor is not self._anchor_seen:
            self._anchor_seen = anchor
            self.tuning.forget()
