"""First arrival of an inhomogeneous Poisson process with a piecewise-linear rate.

The rate is ``lambda(t) = [gamma(t)]_+`` where ``gamma`` interpolates the values ``rates[j]`` at
the increasing ``knots[j]`` linearly and continues the last piece's line beyond the last knot.
The first arrival after ``knots[0]`` is found by the inverse-CDF method: draw
``E ~ Exp(1)`` and solve ``Lambda(t) = E`` with ``Lambda(t) = int_{knots[0]}^t lambda``, piece
by piece in closed form (a quadratic on each piece where the rate is positive).
"""

from __future__ import annotations

import bisect
import math

import numpy as np

__all__ = ["first_arrival", "integrated_rate", "interpolate_rate"]


def interpolate_rate(knots, rates, t: float) -> float:
    """``[gamma(t)]_+``: the interpolated rate at ``t >= knots[0]`` (extrapolated beyond)."""
    knots, rates = _floats(knots), _floats(rates)
    j = min(max(bisect.bisect_right(knots, t) - 1, 0), len(knots) - 2)
    slope = (rates[j + 1] - rates[j]) / (knots[j + 1] - knots[j])
    return max(rates[j] + slope * (t - knots[j]), 0.0)


def _floats(values) -> list[float]:
    """Python floats (the loops here are scalar: numpy scalars would slow them down)."""
    return values.tolist() if isinstance(values, np.ndarray) else values


def _positive_part(r0: float, slope: float, length: float) -> tuple[float, float, float]:
    """Where ``[r0 + slope s]_+`` is positive on ``s in [0, length]``: (start, rate there,
    integral over the positive part)."""
    r1 = r0 + slope * length
    if r0 <= 0.0 and r1 <= 0.0:
        return length, 0.0, 0.0
    if r0 >= 0.0 and r1 >= 0.0:
        return 0.0, r0, 0.5 * (r0 + r1) * length
    crossing = -r0 / slope
    if r0 < 0.0:  # rising through zero
        return crossing, 0.0, 0.5 * r1 * (length - crossing)
    return 0.0, r0, 0.5 * r0 * crossing  # falling through zero


def _solve_within(r0: float, slope: float, mass: float) -> float:
    """``s >= 0`` with ``r0 s + slope s^2 / 2 = mass`` (``r0 >= 0``; stable form)."""
    root = math.sqrt(max(r0 * r0 + 2.0 * slope * mass, 0.0))
    return 2.0 * mass / (r0 + root) if r0 + root > 0.0 else math.inf


def integrated_rate(knots: np.ndarray, rates: np.ndarray, t: float) -> float:
    """``Lambda(t) = int_{knots[0]}^t [gamma]_+`` (exact; used by the tests of the sampler)."""
    knots, rates = _floats(knots), _floats(rates)
    total = 0.0
    for j in range(len(knots) - 1):
        left = knots[j]
        if t <= left:
            break
        right = knots[j + 1] if j < len(knots) - 2 else math.inf
        slope = (rates[j + 1] - rates[j]) / (knots[j + 1] - knots[j])
        total += _positive_part(rates[j], slope, min(t, right) - left)[2]
    return total


def first_arrival(knots: np.ndarray, rates: np.ndarray, exponential: float) -> float:
    """First arrival time after ``knots[0]`` for the unit-exponential draw ``exponential``
    (``math.inf`` when the total rate is finite and smaller than it).

    Pass ``rng.exponential()``; taking the draw rather than a generator keeps the map
    deterministic, so a test can check it against :func:`integrated_rate`.
    """
    knots, rates = _floats(knots), _floats(rates)
    remaining = float(exponential)
    last = len(knots) - 2
    for j in range(last + 1):
        slope = (rates[j + 1] - rates[j]) / (knots[j + 1] - knots[j])
        length = knots[j + 1] - knots[j] if j < last else math.inf
        if length == math.inf:  # the last piece continues as a line
            return knots[j] + _arrival_on_line(rates[j], slope, remaining)
        start, r0, mass = _positive_part(rates[j], slope, length)
        if mass >= remaining:
            return knots[j] + start + _solve_within(r0, slope, remaining)
        remaining -= mass
    return math.inf


def _arrival_on_line(r0: float, slope: float, mass: float) -> float:
    """Time ``s >= 0`` at which ``int_0^s [r0 + slope u]_+ du`` reaches ``mass`` (inf if never)."""
    if slope > 0.0:
        start = max(0.0, -r0 / slope)
        return start + _solve_within(max(r0, 0.0), slope, mass)
    if r0 <= 0.0:
        return math.inf
    if slope == 0.0:
        return mass / r0
    if 0.5 * r0 * r0 / -slope < mass:  # the falling rate's total mass
        return math.inf
    return _solve_within(r0, slope, mass)
