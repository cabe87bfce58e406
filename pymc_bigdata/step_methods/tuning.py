"""The tuning windows as a collaborator: collect a chain's draws, re-fit at a window's end.

A step holds one :class:`WindowAdaptation` per chain. It collects the tuning draws after the
initial buffer (:func:`~pymc_bigdata.adaptation.window_ends`); at a window's end it judges
them (:mod:`.windows`) and answers with a :class:`WindowOutcome`: the preconditioner, the
Laplace fit and the anchor to use from now on, and what the step must start afresh. It
changes no other object; the step applies the outcome.

* A trusted Laplace fit whose centre lies outside the draws' bulk is re-fitted at their mean
  (a ``ModeWarning`` once, where it is a MAP's fit in the model's own coordinates): the
  full-data curvature there, floored by the draws' own precision
  (:func:`~.windows.bulk_precision`), and the anchor moved there; the step starts its noise
  measurements, stability watch and step size afresh (``refit``). Where that is not
  possible (no dense Hessian, a degenerate window) the fit stops being trusted.
* Otherwise the preconditioner is re-estimated from the window
  (:func:`~.windows.window_covariance`) and the anchor moves to the window's mean when it is
  far from it (``recentred``).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np

from pymc_bigdata.adaptation import RunningMoments, window_ends
from pymc_bigdata.errors import ModeWarning
from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.laplace import symmetrised
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.low_rank import low_rank_corrected
from pymc_bigdata.step_methods.preconditioner import Preconditioner
from pymc_bigdata.step_methods.stability import StabilityWatch
from pymc_bigdata.step_methods.windows import (
    MIN_TRAVEL,
    bulk_precision,
    mode_distance,
    mode_outside_bulk,
    recentre_wanted,
    window_covariance,
    window_settled,
)

__all__ = ["Geometry", "WindowAdaptation", "WindowOutcome", "step_size_due"]


class Geometry(NamedTuple):
    """Where a step stands: its Laplace fit, its preconditioner (``theta = c + L z``) and
    its control-variate anchor (None without control variates)."""

    laplace: Preconditioner
    precond: Preconditioner
    anchor: Anchor | None


class WindowOutcome(NamedTuple):
    """What a window's end changed.

    Attributes
    ----------
    geometry
        The fit, preconditioner and anchor to use from now on.
    refit
        The Laplace fit moved to the draws' bulk: the noise measurements (taken in the old
        coordinates, around the old anchor), the stability watch and the step size start
        afresh.
    recentred
        The anchor moved to the window's mean (the measured noise belongs to the old one).
    restart_kernel
        The kernel restarts (new coordinates, or a window that held an excursion).
    """

    geometry: Geometry
    refit: bool = False
    recentred: bool = False
    restart_kernel: bool = True


def step_size_due(index: int, terminal_start: int) -> bool:
    """Whether the step size is re-chosen after tuning draw ``index``: at draws 2 and 5,
    every 10th and at the terminal buffer's start."""
    return index in (2, 5) or index % 10 == 0 or index == terminal_start


class WindowAdaptation:
    """One chain's tuning windows (see the module docstring).

    Parameters
    ----------
    layer
        The model layer (full-data Hessians for a re-fit, labels for the warning).
    preconditioner_kind
        ``"dense"``, ``"diag"`` or ``"identity"``.
    sampler
        The sampler's name, for the ``ModeWarning``.
    tune
        Tuning draws of the chain (0: no windows).
    trust_laplace
        Whether the chain starts from a usable Laplace fit (the MAP is a mode).
    dense
        Whether the preconditioner is dense (the windows then collect covariances).
    refits
        Whether windows re-fit anything (False: only the schedule's step-size draws).
    low_rank
        Directions at each end of the spectrum each window's diagonal preconditioner is
        corrected along (:mod:`.low_rank`; 0: none).
    """

    def __init__(
        self,
        layer: MinibatchModel,
        preconditioner_kind: str,
        sampler: str,
        tune: int,
        trust_laplace: bool,
        dense: bool,
        refits: bool = True,
        low_rank: int = 0,
    ):
        self.layer, self.kind, self.sampler = layer, preconditioner_kind, sampler
        self.low_rank = low_rank
        self.init_buffer, self.ends, self.terminal_start = window_ends(tune)
        if not refits:
            self.ends = []
        self.trust_laplace = trust_laplace
        self._dense = dense
        self._moments = RunningMoments(layer.dim, dense=self._dense)
        self._virials: list[float] = []
        self._window_seen = False
        self._warned_mode = False

    def collecting(self, index: int) -> bool:
        """Whether tuning draw ``index`` belongs to a window (after the initial buffer)."""
        return bool(self.ends) and index > self.init_buffer

    def collect(self, index: int, theta: np.ndarray, virial: float) -> bool:
        """Collect tuning draw ``index`` (after the initial buffer); True at a window's end."""
        if not self.ends:
            return False
        if index > self.init_buffer:
            self._moments.add(theta)
            self._virials.append(virial)
        if index != self.ends[0]:
            return False
        self.ends.pop(0)
        return True

    def end_window(
        self, geometry: Geometry, watch: StabilityWatch | None, travel: float
    ) -> WindowOutcome | None:
        """Judge the window's draws (``travel``: the step's ``step_size * inner_steps``);
        None when nothing changes."""
        moments, virials = self._moments, self._virials
        self._moments = RunningMoments(self.layer.dim, dense=self._dense)
        self._virials = []
        if moments.count < 3:
            return None
        first_window, lost_trust = not self._window_seen, False
        self._window_seen = True
        if self.trust_laplace and mode_outside_bulk(moments, geometry.laplace):
            if not self._warned_mode and _a_map_in_own_coordinates(self.layer, geometry.laplace):
                self._warned_mode = True
                self._warn_mode_outside_bulk(moments, geometry.laplace)
            if not window_settled(virials):
                return None  # still travelling (e.g. back from a start's excursion): wait
            refitted = self._refit_at_bulk(moments, geometry.anchor)
            if refitted is not None:
                return WindowOutcome(refitted, refit=True)
            lost_trust = True
            self.trust_laplace = False
        if (first_window or lost_trust) and watch is not None:
            watch.forget_failures()
        unsettled = watch is not None and watch.take_window_failures() > 0
        if self.trust_laplace and unsettled:
            # a divergence or a heating block: the window holds an excursion (e.g. beyond a
            # likelihood wall) whose spread would mislead the scales and the anchor
            return WindowOutcome(geometry)
        return self._rescale(moments, geometry, decorrelated=travel >= MIN_TRAVEL)

    def _rescale(
        self, moments: RunningMoments, geometry: Geometry, decorrelated: bool
    ) -> WindowOutcome | None:
        """The preconditioner from the window (and the anchor at its mean if far)."""
        laplace = geometry.laplace if self.trust_laplace else None
        cov = window_covariance(moments, geometry.precond, laplace, decorrelated)
        try:
            precond = Preconditioner.from_covariance(
                moments.mean, cov, geometry.precond.kind, laplace
            )
        except (np.linalg.LinAlgError, ValueError):  # degenerate window (e.g. all rejected)
            return None
        precond = low_rank_corrected(precond, self.layer, self.low_rank)[0]
        anchor, recentred = geometry.anchor, False
        if anchor is not None and recentre_wanted(moments, anchor.theta, cov):
            anchor = self.layer.anchor_at(moments.mean, curvature_from=anchor)
            recentred = True
        return WindowOutcome(Geometry(geometry.laplace, precond, anchor), recentred=recentred)

    def _refit_at_bulk(self, moments: RunningMoments, anchor: Anchor | None) -> Geometry | None:
        """A Laplace fit at the draws' mean: the full-data curvature there (eigenvalues
        below ``BULK_CURVATURE_FLOOR`` of the draws' own precision, non-positive ones
        included, raised to it), and the anchor (value, gradient and second-order curvature)
        moved there. None without a dense Hessian (d > ``DENSE_HESSIAN_MAX_DIM``) or when the
        window's mean or curvature is not finite."""
        layer, center = self.layer, moments.mean
        if layer.dim > DENSE_HESSIAN_MAX_DIM or not np.all(np.isfinite(center)):
            return None
        with np.errstate(all="ignore"):
            loglik_hess = layer.full_loglik_hessian(center)
            loglik_hess = symmetrised(loglik_hess)
            precision = bulk_precision(loglik_hess, layer.prior_hessian(center), moments)
        if precision is None:
            return None
        try:
            laplace = Preconditioner.from_precision(center, precision, self.kind)
        except (np.linalg.LinAlgError, ValueError):
            return None
        if anchor is not None:
            curvature = None
            if anchor.loglik_hessian is not None:
                curvature = Anchor(center, 0.0, np.zeros(layer.dim), center, loglik_hess)
            anchor = layer.anchor_at(center, curvature_from=curvature)
        return Geometry(laplace, laplace, anchor)

    def _warn_mode_outside_bulk(self, moments: RunningMoments, laplace: Preconditioner) -> None:
        distance = mode_distance(moments, laplace)
        worst = int(np.argmax(distance))
        warnings.warn(
            f"{self.sampler}: the MAP is {distance[worst]:.1f} sds from the tuning "
            f"draws' mean in {self.layer.coordinate_label(worst)} (unconstrained): the "
            "Laplace fit does not describe this posterior, and tuning re-fits it at the "
            "draws' mean (or, without a dense Hessian, relies on the draws alone). In "
            "hierarchical models this is the sign of a parameterisation that does not suit "
            "the data: a non-centred one (a = mu + tau * z) with data-rich groups, or a "
            "centred one with data-poor groups; the other one samples better.",
            ModeWarning,
            stacklevel=5,
        )


def _a_map_in_own_coordinates(layer: MinibatchModel, laplace: Preconditioner) -> bool:
    """Whether a fit far from the draws is worth a ``ModeWarning``: a MAP's Laplace fit in
    the model's own coordinates, where it is the sign of a parameterisation that does not
    suit the groups (and the user can change it).

    Not where the step samples in coordinates it chose per group (``layer.reparam``): a
    hierarchy's joint MAP can lie far from its bulk even there (the crossed ratings'
    residual ``sigma``, 10-12 sds, on in-band runs), the re-fit is the remedy and a
    ``BiasWarning`` judges the result, so the warning would only fire on good runs. Nor
    where the fit is the Gaussian at the bulk's reading
    (:mod:`~pymc_bigdata.step_methods.bulk_start`): its centre is an approximation of the
    bulk by construction (on a crossed logistic model 5 to 6 marginal sds off in a
    coefficient or a scale, where the fits' Gaussian reading of each group's binary rows is a
    Laplace approximation), not a MAP."""
    if layer.reparam is not None:
        return False
    return layer.bulk is None or not np.array_equal(laplace.center, layer.bulk.point)
