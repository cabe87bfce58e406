"""When a draw is re-run at a finer step: where its path is far stiffer than the chain's.

A step size tuned on the bulk is too long where the posterior is much more curved (the neck
of a funnel, a scale's long tail): BAOAB's O(eps^2) bias grows with the curvature, and beyond
``4 / eps^2`` along a direction a mode is unstable. On ``sparse_regions``
(``tests/hard_models.py``) SGHMC at the bulk's step drew ``log tau_b`` below -4 twenty times
too rarely (0.01 % of its draws, exact 0.20 %; ``benchmarks/results/sparse_regions_tail.md``):
the largest curvature grows along that tail, one stiff direction among 39 that the mean
curvature dilutes.

:class:`StepRefinement` compares each draw's largest per-coordinate path curvature
(:class:`~pymc_bigdata.kernels.path_curvature.PathCurvature`) with the chain's typical one,
the median over its last ``WINDOW`` tuning draws, and asks for half the step (twice the
steps) while it is more than ``RATIO`` times that (and ``eps^2`` times it above
``MIN_STIFFNESS``), or near instability outright, so that the local step follows
``eps sqrt(RATIO typical / curvature)``. The step method re-runs the draw
from its start along the same Brownian path
(:func:`~pymc_bigdata.kernels.sghmc.split_innovations`): every run covers the same travel
time, each approximates the same exact dynamics, and a finer run replaces a coarse one only
where the coarse one was least accurate. Without the same Brownian path, a re-run would
discard exactly the paths that entered the stiff region and draw new ones that mostly do not.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = ["Refined", "StepRefinement", "check_max_refinements"]


class StepRefinement:
    """Whether a draw's path was too stiff for its step, against the chain's typical path.

    Parameters
    ----------
    max_refinements
        Re-runs at most (each halves the step); 0: never re-run.
    order
        How a step's accuracy scales with the curvature ``kappa`` along its path: through
        ``eps^order kappa`` (the path's *stiffness*). 2 for BAOAB (a unit-curvature
        oscillator's phase moves ``eps sqrt(kappa)`` per step; unstable at
        ``eps^2 kappa = 4``), 1 for SGLD's Euler step (variance bias
        ``1 / (1 - eps kappa / 4)``; unstable at ``eps kappa = 4``).
    """

    #: the path's stiffness (``eps^order`` times its curvature) above which it is near
    #: instability: half of either integrator's limit, 4
    UNSTABLE: float = 2.0
    #: how many times the chain's typical curvature a path may reach at the base step (at
    #: ``eps / 2^k``, ``4^k`` times as much) before the draw is re-run finer: well above the
    #: bulk's spread about its median, so that few bulk draws are re-run
    #: (``benchmarks/results/hard_targets_refined_a.md``, ``_b.md``)
    RATIO: float = 2.0
    #: the stiffness below which a path is never re-run for its ratio alone: BAOAB is
    #: accurate there whatever the ratio (Euler's variance bias is 6.7 %, against 5.3 % at
    #: SGLD's default step in the bulk), and the curvature's estimate from
    #: noisy gradients grows noisier as the step shrinks (at a fixed step of 0.05 the
    #: ratio alone re-ran draws for their gradient noise)
    MIN_STIFFNESS: float = 0.25
    #: tuning draws whose path curvature sets the typical one (the last ones: the windows
    #: re-fit the preconditioner, and with it the coordinates' curvature)
    WINDOW: int = 100
    #: until this many tuning draws, the typical curvature is 1 (where the preconditioner
    #: fits, the mean curvature in its coordinates)
    MIN_SEEN: int = 20

    def __init__(self, max_refinements: int, order: int = 2):
        if order not in (1, 2):
            raise ValueError(f"order must be 1 or 2, got {order!r}.")
        self.max_refinements = max_refinements
        self.order = order
        self.restart()

    def restart(self) -> None:
        """A new chain: forget the curvatures seen."""
        self._seen: deque[float] = deque(maxlen=self.WINDOW)
        self._typical: float | None = None  # the median of _seen, until it changes

    @staticmethod
    def curvature(info: Any) -> float:
        """The path curvature judged, from a kernel's info: the largest per-coordinate one
        (``path_curvature_max``), which one stiff direction among many does not dilute."""
        return info.path_curvature_max

    def typical(self) -> float:
        """The chain's typical path curvature (z units): the median of the last tuning draws
        at the base step, 1 before ``MIN_SEEN`` of them."""
        if len(self._seen) < self.MIN_SEEN:
            return 1.0
        if self._typical is None:
            self._typical = float(np.median(self._seen))
        return self._typical

    def observe(self, path_curvature: float) -> None:
        """A tuning draw's path curvature at the base step."""
        if math.isfinite(path_curvature) and path_curvature > 0.0:
            self._seen.append(path_curvature)
            self._typical = None

    def too_stiff(self, path_curvature: float, step: float, base_step: float) -> bool:
        """Whether a path of this curvature run at ``step`` (the chain's step ``base_step``)
        should be re-run at half the step."""
        if not math.isfinite(path_curvature):
            return False
        stiffness = step**self.order * path_curvature
        if stiffness > self.UNSTABLE:
            return True
        if stiffness <= self.MIN_STIFFNESS:
            return False
        return path_curvature * (step / base_step) ** self.order > self.RATIO * self.typical()

    def run(
        self,
        run_at: Callable[[float, int, np.ndarray], tuple[Any, Any]],
        split: Callable[[np.ndarray, float], np.ndarray],
        innovations: np.ndarray,
        base_step: float,
        n_steps: int,
        *,
        observe: bool,
        again: Callable[[], None],
    ) -> tuple[Any, Any, Refined]:
        """A draw's transitions, re-run from their start at half the step (twice the steps,
        the same Brownian path) while too stiff, at most ``max_refinements`` times.

        Parameters
        ----------
        run_at
            ``(step, n_steps, innovations) -> (result, info)``: the kernel from the draw's
            start; ``info`` has ``finite`` and the path's curvature (:meth:`curvature`).
        split
            ``(innovations, step) -> innovations`` of twice the steps at ``step / 2`` along
            the same Brownian path.
        innovations
            The base run's standard-normal draws, shape ``(n_steps, d)``.
        base_step, n_steps
            The chain's step and steps per draw.
        observe
            Whether the base run's curvature joins the typical one (tuning draws).
        again
            Called before each re-run (e.g. :meth:`GradientOracle.again`).

        Returns
        -------
        result, info, Refined
            Those of the last run, and how many halvings it took.
        """
        step, refinements = base_step, 0
        while True:
            result, info = run_at(step, n_steps, innovations)
            curvature = self.curvature(info)
            if observe and refinements == 0:
                self.observe(curvature)
            too_stiff = self.too_stiff(curvature, step, base_step)
            if (info.finite and not too_stiff) or refinements == self.max_refinements:
                return result, info, Refined(refinements, step)
            innovations = split(innovations, step)
            step, n_steps, refinements = 0.5 * step, 2 * n_steps, refinements + 1
            again()


class Refined(NamedTuple):
    """How a draw's transitions ended: the halvings of its step and the step it ended at."""

    refinements: int
    step: float


def check_max_refinements(max_refinements: object, default: int) -> int:
    """``max_refinements``: an int >= 0, or None for ``default``."""
    if max_refinements is None:
        return default
    if isinstance(max_refinements, bool) or not isinstance(max_refinements, int | np.integer):
        raise ValueError(f"max_refinements must be an int >= 0, got {max_refinements!r}.")
    if max_refinements < 0:
        raise ValueError(f"max_refinements must be >= 0, got {max_refinements}.")
    return int(max_refinements)
