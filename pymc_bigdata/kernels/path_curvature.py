"""The curvature a kernel's path met: ``sum -dg.dz / sum |dz|^2`` over its successive
positions and gradient estimates.

For a quadratic ``-log p`` with Hessian ``H`` each term is the Rayleigh quotient of ``H``
along the move. Where every mode moves about as far per step (HMC's and Langevin dynamics'
equilibrium), the quotient is near the mean curvature ``tr(H) / d`` (1 where the
preconditioner fits); where one mode grows step by step (an unstable step), that mode's
curvature soon dominates it. Gradient noise adds a term of mean zero.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["PathCurvature", "UntrackedPath", "path_curvature"]


class PathCurvature:
    """Running sums of ``-dg . dz`` and ``|dz|^2`` over successive gradient evaluations, in
    all and per coordinate."""

    def __init__(self, z: np.ndarray | None = None, g: np.ndarray | None = None):
        self.z, self.g = z, g
        self.bend: np.ndarray | float = 0.0
        self.travel: np.ndarray | float = 0.0

    @classmethod
    def from_sums(
        cls, bend: np.ndarray, travel: np.ndarray, z: np.ndarray, g: np.ndarray
    ) -> PathCurvature:
        """The path whose per-coordinate sums (accumulated elsewhere, e.g. in compiled code)
        are ``bend`` and ``travel``, last evaluated at ``z`` with gradient ``g``."""
        path = cls(z, g)
        path.bend, path.travel = bend, travel
        return path

    def add(self, z: np.ndarray, g: np.ndarray) -> None:
        """The next evaluation: gradient ``g`` at ``z``."""
        if self.z is None:  # the first evaluation: nothing to difference yet
            self.z, self.g = z, g
            return
        dz = z - self.z
        self.bend = self.bend - dz * (g - self.g)
        self.travel = self.travel + dz * dz
        self.z, self.g = z, g

    def value(self) -> float:
        """``sum -dg.dz / sum |dz|^2`` (NaN where the path did not move or was not finite)."""
        travel, bend = float(np.sum(self.travel)), float(np.sum(self.bend))
        if not (travel > 0.0 and math.isfinite(bend)):
            return math.nan
        return bend / travel

    def largest(self) -> float:
        """The largest per-coordinate quotient ``sum -dg_j dz_j / sum dz_j^2``: a curvature
        the mean dilutes (one stiff direction among many) shows in its coordinates."""
        travel = np.asarray(self.travel)
        if not (np.all(travel > 0.0) and np.all(np.isfinite(self.bend))):
            return math.nan
        return float(np.max(np.asarray(self.bend) / travel))


class UntrackedPath:
    """A path whose curvature nobody reads (no re-runs at a finer step): :meth:`add` does
    nothing, so that the integrators' hot loop pays nothing for it; the values are NaN."""

    def add(self, z: np.ndarray, g: np.ndarray) -> None:
        """Nothing to record."""

    def value(self) -> float:
        """NaN: not tracked."""
        return math.nan

    def largest(self) -> float:
        """NaN: not tracked."""
        return math.nan


def path_curvature(
    track: bool, z: np.ndarray | None = None, g: np.ndarray | None = None
) -> PathCurvature | UntrackedPath:
    """A :class:`PathCurvature` from ``(z, g)`` where ``track``, else an :class:`UntrackedPath`."""
    return PathCurvature(z, g) if track else UntrackedPath()
