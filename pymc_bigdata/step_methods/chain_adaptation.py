"""One chain's adaptation: what tuning sets on a step, and when.

A step holds one :class:`ChainAdaptation` per chain and hands it each tuning draw:

* the stability watch (:mod:`.stability`) sees every draw: a changed factor on the default
  step re-chooses the step size, a hot block restarts the kernel;
* the tuning windows (:mod:`.tuning`) collect the kept draws; at a window's end their
  :class:`~.tuning.WindowOutcome` is applied here: the Laplace fit, the preconditioner and
  the anchor, and what they void (the noise measurements, the watch, the step size, the
  step-size policy's coordinates, the kernel's state);
* the step-size policy (:mod:`.step_size`) chooses on the schedule
  (:func:`~.tuning.step_size_due`) and when tuning stops.

What it changes on the step is what tuning sets, through the step's public attributes:
``laplace``, ``precond``, ``anchor``, ``cv_order``, ``step_size``, ``inner_steps`` and the
batch size (``minibatches``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.minibatches import Minibatches
from pymc_bigdata.step_methods.noise import NoiseAccumulator
from pymc_bigdata.step_methods.preconditioner import Preconditioner
from pymc_bigdata.step_methods.stability import StabilityWatch
from pymc_bigdata.step_methods.step_size import StepContext
from pymc_bigdata.step_methods.tuning import (
    Geometry,
    WindowAdaptation,
    WindowOutcome,
    step_size_due,
)

__all__ = ["ChainAdaptation", "Tunable"]


class Tunable(Protocol):
    """What the adaptation reads and sets on a step."""

    layer: MinibatchModel
    preconditioner_kind: str
    low_rank: int
    map_problem: str | None
    laplace: Preconditioner
    precond: Preconditioner
    anchor: Anchor | None
    cv_order: int
    step_size: float
    inner_steps: int
    max_inner_steps: int
    minibatches: Minibatches
    #: whether the policy may choose between first and second order
    order_choice: bool
    #: whether the windows' outcome (preconditioner, anchor, re-fit) is applied
    adapt_geometry: bool

    def default_step(self) -> float: ...

    def default_inner(self) -> int: ...


class ChainAdaptation:
    """One chain's tuning of ``step`` (see the module docstring).

    Parameters
    ----------
    step
        The step it tunes (its layer, preconditioner kind and fit set up the windows).
    tune
        Tuning draws of the chain (0: no windows).
    policy
        The step-size policy the sampler declares (``choose``, ``new_coordinates``).
    noise
        The step's measured gradient noise (restarted by a re-fit).
    stability
        The stability watch, or None where the sampler has none.
    restart_kernel
        Restarts the kernel's own state (momentum...).
    fixed
        Whether a given step size (then no stability watch) and a given number of
        transitions per draw are kept.
    """

    def __init__(
        self,
        step: Tunable,
        *,
        tune: int,
        policy,
        noise: NoiseAccumulator,
        stability: StabilityWatch | None,
        restart_kernel: Callable[[], None],
        fixed: tuple[bool, bool],
    ):
        self.step, self.policy, self.noise = step, policy, noise
        self.stability, self.restart_kernel = stability, restart_kernel
        self.fixed_step, self.fixed_inner = fixed
        self.windows = WindowAdaptation(
            step.layer,
            step.preconditioner_kind,
            type(step).__name__,
            tune,
            trust_laplace=step.map_problem is None,
            dense=step.precond.kind == "dense",
            # each configuration of held variables keeps its own Laplace fit: the tuning
            # windows' draws (from several configurations) re-fit nothing
            refits=not step.layer.held_vars,
            low_rank=step.low_rank,
        )

    @property
    def stability_factor(self) -> float:
        """The watch's factor on the default step size (1 without a watch)."""
        return 1.0 if self.stability is None else self.stability.factor

    def watch(self, diverging: bool, kinetic_temperature: float, virial: float) -> None:
        """Feed a tuning draw to the stability watch (the kinetic temperature where the
        kernel carries momentum, else the virial)."""
        if self.fixed_step or self.stability is None:
            return
        temperature = kinetic_temperature if math.isfinite(kinetic_temperature) else virial
        verdict = self.stability.observe(diverging, temperature)
        if verdict.hot:
            self.restart_kernel()
        if verdict.factor_changed:
            self.choose_step_size(final=False)

    def collect(self, index: int, theta: np.ndarray, virial: float) -> bool:
        """A kept tuning draw: the windows collect it and, at a window's end, their outcome
        is applied; the step size is re-chosen on its schedule. True at a window's end."""
        step, windows = self.step, self.windows
        ended = windows.collect(index, theta, virial)
        if ended and step.adapt_geometry:
            geometry = Geometry(step.laplace, step.precond, step.anchor)
            travel = step.step_size * step.inner_steps
            outcome = windows.end_window(geometry, self.stability, travel)
            if outcome is not None:
                self.apply_window(outcome)
        if step_size_due(index, windows.terminal_start):
            self.choose_step_size(final=False)
        return ended

    def apply_window(self, outcome: WindowOutcome) -> None:
        """Take a window's fit, preconditioner and anchor; start afresh what they void."""
        step = self.step
        old_precond = step.precond
        step.laplace, step.precond, step.anchor = outcome.geometry
        if outcome.refit:
            self.noise.restart()
            if self.stability is not None:
                self.stability.restart()
            self.choose_step_size(final=False)
        elif outcome.recentred:
            self.noise.recentred()
        if step.precond is not old_precond:
            self.policy.new_coordinates(step.step_size)
        if outcome.restart_kernel:
            self.restart_kernel()

    def choose_step_size(self, final: bool) -> None:
        """Apply the policy's choice; the inner steps follow the step size."""
        step = self.step
        choice = self.policy.choose(self._context(), final)
        if choice.cv_order is not None:
            step.cv_order = choice.cv_order
        if choice.batch_size is not None and choice.batch_size != step.minibatches.size:
            step.minibatches.resize(choice.batch_size)
        if choice.step_size is not None:
            step.step_size = choice.step_size
        if choice.inner and not self.fixed_inner:
            step.inner_steps = min(step.default_inner(), step.max_inner_steps)

    def _context(self) -> StepContext:
        step, noise = self.step, self.noise
        return StepContext(
            default_step=step.default_step() * self.stability_factor,
            cv_order=step.cv_order,
            batch_size=step.minibatches.size,
            noise_variance=lambda order, n: (
                noise.variance(order) * step.minibatches.batch_factor(n)
            ),
            unit_noise_variance=noise.variance,
            order_choice=step.order_choice,
        )
