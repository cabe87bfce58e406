"""When the MAP search's Newton stops: at the log density's resolution, or one step early
where quadratic convergence predicts where that step lands (:func:`predicted_decrement`),
the step then taken without a pass to check it (``pymc_bigdata/model/laplace.py``)."""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import scipy.linalg

__all__ = [
    "FINAL_STEP_DECREMENT",
    "FINAL_STEP_FROM",
    "GradientChange",
    "MAP_NEWTON_TOLERANCE",
    "predicted_decrement",
    "predicted_after_fixed_step",
    "predicted_from_gradient_change",
    "settled_decrement",
]

#: the Newton decrement at which the searches stop (or the log density's resolution)
MAP_NEWTON_TOLERANCE = 1e-12

#: the exact search takes its last Newton step without a pass to check it where the step is
#: predicted to land within this decrement of the mode (:func:`predicted_decrement`): about
#: 1e-4 posterior sds, where the anchor's control variates and the Laplace fit need ~0.1
FINAL_STEP_DECREMENT = 1e-8

#: ... and only from within this decrement (2 posterior sds in all), after a step that
#: shrank the decrement quadratically: 10^8 rows, d = 10, from the subsample's optimum at
#: 2.05e4 to 1.11, then 1.0e-8 after the next step (3.3e-9 predicted)
FINAL_STEP_FROM = 4.0


def settled_decrement(log_density: float) -> float:
    """The Newton decrement below which the exact search stops: ``MAP_NEWTON_TOLERANCE``,
    or 4 rounding units of the log density where that is larger (the decrement is twice
    the rise a step promises; a float64 sum of 10^8 rows' terms resolves ~1e-8 of a nat,
    and a smaller rise is rounding noise that no pass can confirm)."""
    return max(MAP_NEWTON_TOLERANCE, 4.0 * np.finfo(np.float64).eps * abs(log_density))


def predicted_decrement(previous: float, decrement: float) -> float:
    """The Newton decrement expected after a Newton step from a point at ``decrement``,
    reached by a Newton step from one at ``previous``.

    Newton converges quadratically near a mode: the distance to it squares at each step, up
    to a constant of the log density's third derivatives, so the decrement (the squared
    distance in posterior sds) goes as ``d_next = c d^2``. The constant is estimated from the
    step just taken, ``c = decrement / previous^2``. From a first pass (``previous`` infinite)
    there is nothing to extrapolate from: infinite. E.g. 10^6 rows, d = 30: decrements 388,
    0.033, then 1.6e-9 where this predicts 2.4e-10.
    """
    if not math.isfinite(previous) or previous <= 0.0:
        return math.inf
    return decrement**3 / previous**2


class GradientChange(NamedTuple):
    """What a Newton step's two ends tell of the log posterior's third derivatives: the
    gradient ``previous_grad`` where the step ``previous_step`` started, and, where it
    ended, the gradient ``grad`` and a precision ``precision`` (``P``, with its Cholesky
    ``factor``)."""

    previous_grad: np.ndarray
    previous_step: np.ndarray
    grad: np.ndarray
    precision: np.ndarray
    factor: tuple[np.ndarray, bool]

    def sizes(self) -> tuple[float, float, float]:
        """``r^T P^-1 r``, ``s^T P s`` and ``grad^T P^-1 grad``, ``r = grad - previous_grad
        + P s`` (``s = previous_step``); ``r^T P^-1 r`` infinite where ``s`` has no
        positive size (no forecast)."""
        residual = self.grad - self.previous_grad + self.precision @ self.previous_step
        step_size = float(self.previous_step @ self.precision @ self.previous_step)
        decrement = float(self.grad @ scipy.linalg.cho_solve(self.factor, self.grad))
        if not step_size > 0.0:
            return math.inf, 1.0, decrement
        residual_size = float(residual @ scipy.linalg.cho_solve(self.factor, residual))
        return residual_size, step_size, decrement


def predicted_from_gradient_change(change: GradientChange) -> float:
    """The Newton decrement expected after an exact Newton step (with ``change.precision``,
    read where the gradient is ``change.grad``) from the end of a step taken with another,
    inexact, precision.

    The inexact step's decrement says little of the third derivatives ``T`` that set
    Newton's convergence (:func:`predicted_decrement` would read the inexact precision's
    error as ``T``); the gradient's change along the step does: ``r = grad - previous_grad +
    P s = -T[s, s] / 2`` to leading order (``s = previous_step``), and the exact step ``u =
    P^-1 grad`` leaves the gradient ``-T[u, u] / 2``. With ``T`` of the same size along
    both, that is ``r`` scaled by ``(|u| / |s|)^2`` in ``P``'s norm: ``d_next = (r^T P^-1 r)
    (d / s^T P s)^2``, ``d = grad^T u`` the decrement now.
    """
    residual_size, step_size, decrement = change.sizes()
    return residual_size * (decrement / step_size) ** 2


def predicted_after_fixed_step(change: GradientChange) -> float:
    """The Newton decrement expected after a step with ``change.precision`` (``P``, read at
    an earlier point; the step ``s`` that ended here was taken with it too): the step ``u =
    P^-1 grad`` misses by the precision's change along ``s``, ``T[s, u]``, twice ``r = grad
    - previous_grad + P s = -T[s, s] / 2`` scaled by ``|u| / |s|``: ``d_next = 4 (r^T P^-1
    r) d / s^T P s``."""
    residual_size, step_size, decrement = change.sizes()
    return 4.0 * residual_size * decrement / step_size
