"""HMC-ECS's own per-draw sampler statistics (beside the base's common ones).

:data:`HMCECS_STATS` declares them to PyMC; :func:`draw_stats` gives one draw's values from
the kernel's last iteration, its estimate and the estimator's settings.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from pymc_bigdata.kernels.hmcecs import Evaluation, HMCECSInfo
from pymc_bigdata.step_methods.hmcecs_estimates import EstimatorSettings

__all__ = ["HMCECS_STATS", "draw_stats"]

#: the statistics' dtypes and shapes (PyMC's ``stats_dtypes_shapes``)
HMCECS_STATS: dict[str, tuple[Any, list | None]] = {
    "accept_prob": (np.float64, []),
    "accepted": (bool, []),
    "subsample_accept": (np.float64, []),
    "loglik_var": (np.float64, []),
    "sign": (np.int64, []),
    "n_steps": (np.int64, []),
    "energy_error": (np.float64, []),
    "subsample_size": (np.int64, []),
    "products": (np.int64, []),
    "lower_bound": (np.float64, []),
    "taylor_inputs": (bool, []),
    "trajectory_truncated": (bool, []),
    "estimator_zero": (bool, []),
    "variance_wall": (bool, []),
}


def draw_stats(
    info: HMCECSInfo | None,
    evaluation: Evaluation | None,
    settings: EstimatorSettings,
    n_steps: int,
    wanted_steps: int,
) -> dict[str, Any]:
    """One draw's statistics (see :class:`~pymc_bigdata.HMCECS` and ``docs/hmcecs.md``).

    Parameters
    ----------
    info, evaluation
        The kernel's last iteration and the estimate at the draw (None before the first).
    settings
        The estimator's settings now (after any tuning at this draw).
    n_steps, wanted_steps
        The leapfrog steps used per trajectory, and those its length asks for (more where
        ``MAX_LEAPFROG`` truncated the trajectories).
    """
    signed = settings.estimator == "signed"
    return {
        "accept_prob": info.accept_prob if info else math.nan,
        "accepted": bool(info.accepted) if info else False,
        "subsample_accept": info.subsample_accept if info else math.nan,
        "loglik_var": evaluation.loglik_var if evaluation else math.nan,
        "sign": evaluation.sign if evaluation else 1,
        "n_steps": n_steps,
        "energy_error": info.energy_error if info else math.nan,
        "subsample_size": settings.minibatch if signed else settings.subsample_size,
        "products": settings.products if signed else 0,
        "lower_bound": settings.lower_bound if signed else math.nan,
        "cv_order": settings.taylor_order,
        "taylor_inputs": settings.taylor_space == "likelihood_inputs",
        "trajectory_truncated": n_steps < wanted_steps,
        "estimator_zero": bool(info.at_estimator_zero) if info else False,
        "variance_wall": bool(info.at_variance_wall) if info else False,
    }
