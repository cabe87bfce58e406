"""The path of the Stochastic Bouncy Particle Sampler (Pakman et al. 2017) in one call.

The process moves in straight lines between bounces and refreshments (Eq. 1), so the time
integrals of an affine ``embed(x)`` and of its square along each piece are exact (Eq. 19's
continuous-time estimates: the trapezoid for ``embed(x)`` and Simpson's rule for its square).
:class:`PathIntegrals` accumulates them for :func:`pymc_bigdata.kernels.sbps.sbps_advance`
and, when asked, records the :class:`Skeleton`: the lines between changes of direction, for
quadrature of other functions along the path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["PathIntegrals", "Skeleton"]


class Skeleton(NamedTuple):
    """The straight lines travelled in one call: line ``i`` runs from ``starts[i]`` to
    ``ends[i]`` (in ``embed``'s coordinates) in ``durations[i]`` units of travel time, at
    constant speed; consecutive lines join (``ends[i] == starts[i + 1]``)."""

    starts: np.ndarray
    ends: np.ndarray
    durations: np.ndarray


class PathIntegrals:
    """Time integrals of ``embed(x)`` and its square along the straight pieces travelled,
    and (when ``record``) the skeleton: the lines between changes of direction."""

    def __init__(self, embed: Callable[[np.ndarray], np.ndarray], start: np.ndarray, record: bool):
        self.embed = embed
        self.here = embed(start)
        self.integral = np.zeros_like(self.here)
        self.integral_sq = np.zeros_like(self.here)
        self.record = record
        self.lines: list[tuple[np.ndarray, np.ndarray, float]] = []
        self.line_start, self.line_time = self.here, 0.0

    def move_to(self, position: np.ndarray, duration: float) -> None:
        """Add the straight piece from here to ``position``, travelled in ``duration``."""
        a, b = self.here, self.embed(position)
        self.integral += 0.5 * duration * (a + b)
        self.integral_sq += duration * (a * a + a * b + b * b) / 3.0
        self.here = b
        self.line_time += duration

    def turn(self) -> None:
        """The direction changes here: close the current line."""
        if self.record and self.line_time > 0.0:
            self.lines.append((self.line_start, self.here, self.line_time))
        self.line_start, self.line_time = self.here, 0.0

    def skeleton(self) -> Skeleton | None:
        """The lines travelled, the current one closed (None unless ``record``)."""
        if not self.record:
            return None
        self.turn()
        dim = len(self.here)
        if not self.lines:
            empty = np.empty((0, dim))
            return Skeleton(empty, empty.copy(), np.empty(0))
        starts, ends, durations = zip(*self.lines)
        return Skeleton(np.array(starts), np.array(ends), np.array(durations))
