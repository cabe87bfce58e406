"""Dual averaging of a step size towards a target mean acceptance (Hoffman & Gelman 2014,
Algorithm 5 and Sec. 3.2.1): the step-size policy of the samplers with an accept test
(HMC-ECS's leapfrog step, Austerity's proposal scale). Pure functions on a NamedTuple state.
"""

from __future__ import annotations

import math
from typing import NamedTuple

__all__ = ["DualAveraging", "dual_averaging_init", "dual_averaging_update"]


class DualAveraging(NamedTuple):
    """Hoffman & Gelman (2014), Alg. 5's state: ``log eps``, its weighted average, the
    running mean statistic, the iteration count and the shrinkage point ``mu``."""

    log_step: float
    log_step_avg: float
    statistic: float
    count: int
    mu: float


#: Hoffman & Gelman's (2014) constants
DA_GAMMA, DA_T0, DA_KAPPA = 0.05, 10.0, 0.75


def dual_averaging_init(step_size: float) -> DualAveraging:
    """Start at ``step_size``, shrinking towards ``10 step_size`` (their recommendation)."""
    log_step = math.log(step_size)
    return DualAveraging(log_step, log_step, 0.0, 0, math.log(10.0 * step_size))


def dual_averaging_update(state: DualAveraging, accept_prob: float, target: float) -> DualAveraging:
    """One update towards mean acceptance ``target`` (a divergence counts as 0)."""
    count = state.count + 1
    eta = 1.0 / (count + DA_T0)
    statistic = (1.0 - eta) * state.statistic + eta * (target - accept_prob)
    log_step = state.mu - math.sqrt(count) / DA_GAMMA * statistic
    weight = count**-DA_KAPPA
    log_step_avg = weight * log_step + (1.0 - weight) * state.log_step_avg
    return DualAveraging(log_step, log_step_avg, statistic, count, state.mu)
