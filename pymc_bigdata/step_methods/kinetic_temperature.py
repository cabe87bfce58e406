"""The kinetic temperature BAOAB holds at equilibrium: where the curvature is not 1.

BAOAB samples positions exactly on a Gaussian target, but not momenta: at the end of a step
(after the last half kick) a direction of curvature ``kappa`` (in the sampler's units) holds
the momentum variance ``1 - eps^2 kappa / 4`` (the harmonic oscillator's, exact; for
another target to order ``eps^2``, with ``kappa`` the curvature's mean there). Over ``d``
directions the mean kinetic temperature ``2K/d`` is ``1 - eps^2 tr(H) / (4 d)``.

The step method used to expect ``1 - eps^2 / 4``, right where the preconditioner fits the
posterior (curvature 1 in every direction). On a quartic double well (``p(theta) ∝
exp(2 theta^2 - theta^4)``, ``notebooks/sghmc_paper.ipynb``) SGHMC's defaults ran at step
0.35 with a mean curvature of about 5 in their units, so the momenta ran at 0.85 of 1 and
the kinetic-temperature check warned (0.815 ± 0.034) while the draws' quantiles matched the
exact ones. The mean curvature along a draw's path is what
:class:`~pymc_bigdata.kernels.path_curvature.PathCurvature` measures
(``SGHMCInfo.path_curvature``: ``sum -dg.dz / sum |dz|^2``, each direction weighted by its
motion, which at equilibrium is about equal in every direction): on that double well with
exact gradients it read 5.0 where the mean of ``U''`` was 4.97, and the momentum variance
0.983 and 0.949 at steps 0.1 and 0.2, against ``1 - eps^2 kappa / 4`` = 0.988 and 0.951
(one-off, numpy).

:class:`BAOABKineticTemperature` averages the path curvature of a chain's kept draws and
expects ``1 - eps^2 kappa / 4`` from it. Tuning draws are not counted, so tuning (whose
stability watch reads the kinetic temperature) sees the unit-curvature value as before.
"""

from __future__ import annotations

import math

__all__ = ["BAOABKineticTemperature"]


class BAOABKineticTemperature:
    """The end-of-step momentum variance of BAOAB at a step size, from the chain's mean path
    curvature after tuning (1 until a kept draw has measured it)."""

    #: the expected variance is held at least this: beyond ``eps^2 kappa = 3`` the expansion
    #: is far from exact, and such a chain's step is near instability (4) anyway
    FLOOR: float = 0.25

    def __init__(self) -> None:
        self.restart()

    def restart(self) -> None:
        """A new chain: forget the curvatures seen."""
        self._sum = 0.0
        self._count = 0

    def observe(self, path_curvature: float) -> None:
        """A kept draw's mean path curvature (NaN where the kernel did not measure it)."""
        if math.isfinite(path_curvature):
            self._sum += path_curvature
            self._count += 1

    def curvature(self) -> float:
        """The mean path curvature of the kept draws so far (1 before any)."""
        return self._sum / self._count if self._count else 1.0

    def expected(self, step_size: float) -> float:
        """``max(1 - eps^2 kappa / 4, FLOOR)`` at the step ``eps`` a draw ended with."""
        return max(1.0 - step_size**2 * self.curvature() / 4.0, self.FLOOR)
