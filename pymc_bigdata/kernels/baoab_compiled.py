"""BAOAB steps of SGHMC with the transition loop in compiled code (one call per draw).

The same steps as :func:`~pymc_bigdata.kernels.sghmc.baoab_steps`, the readable reference:
half kick, half drift, the O-step ``v <- c v + noise``, half drift, a fresh gradient
estimate, half kick (Eq. 13 of Chen, Fox & Guestrin 2014, split as Leimkuhler & Matthews
2013), with the path's curvature sums. Here the plain steps run in one Numba-compiled loop
that calls the oracle's compiled estimate (:mod:`pymc_bigdata.step_methods.compiled_gradient`)
instead of returning to Python for each transition. A draw's last step, when its estimate
measures the noise (two half minibatches, in Python), ends here in numpy. For the same
random numbers and minibatches the draws equal the reference's (tested to 1e-12).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, Protocol

import numpy as np
from numba import njit
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.kernels.path_curvature import PathCurvature
from pymc_bigdata.kernels.sghmc import SGHMCInfo, SGHMCState, baoab_noise

__all__ = ["CompiledGradients", "compiled_baoab_steps"]


class CompiledGradients(Protocol):
    """What the compiled loop asks of a draw's gradient oracle
    (:class:`~pymc_bigdata.step_methods.compiled_gradient.CompiledOracle`)."""

    def plan(self, n_calls: int) -> tuple[Any, tuple]:
        """The jitted estimate ``(z, k, context) -> g`` and its context for the next
        ``n_calls`` plain estimates."""

    def last_is_plain(self) -> bool:
        """Whether the draw's last estimate is plain (else it measures, in Python)."""

    def finished(self, z: np.ndarray, g: np.ndarray) -> None:
        """Record the last compiled estimate."""


@lru_cache(maxsize=64)
def _plain_steps_for(gradient: Any) -> Any:
    """The compiled loop of plain BAOAB steps around a jitted ``gradient(z, k, context)``
    (compiled in, so that a call's arguments are arrays only)."""

    @njit
    def plain_steps(z, v, g, noise, half, decay, n_steps, context, bend, travel):
        """``n_steps`` BAOAB steps; the curvature sums accumulate ``-dz dg`` and ``dz^2``
        per coordinate in place."""
        for i in range(n_steps):
            v = v + half * g
            z_before = z  # where the previous estimate was taken
            z = z + half * v
            v = decay * v + noise[i]
            z = z + half * v
            g_new = gradient(z, i, context)
            dz = z - z_before
            bend -= dz * (g_new - g)
            travel += dz * dz
            g = g_new
            v = v + half * g
        return z, v, g

    return plain_steps


def compiled_baoab_steps(
    state: SGHMCState,
    grad_log_density: CompiledGradients,
    step_size: float,
    friction: float,
    n_steps: int,
    rng: np.random.Generator,
    grad_noise_var: np.ndarray | None = None,
    last_grad: Callable[[np.ndarray], np.ndarray] | None = None,
    innovations: np.ndarray | None = None,
    track_curvature: bool = True,
) -> tuple[SGHMCState, SGHMCInfo]:
    """:func:`~pymc_bigdata.kernels.sghmc.baoab_steps` with the loop compiled.

    The arguments are the reference's; ``grad_log_density`` is a :class:`CompiledGradients`
    and ``last_grad`` (the measuring estimate) is called, from Python, only where the draw's
    last estimate measures. The path's curvature is always measured (``track_curvature`` is
    accepted for the reference's signature).
    """
    z, v, g = state
    dim = z.shape[0]
    decay, noise, clipped = baoab_noise(
        step_size, friction, n_steps, dim, rng, grad_noise_var, innovations
    )
    half = 0.5 * step_size
    in_python = last_grad is not None and not grad_log_density.last_is_plain()
    n_compiled = n_steps - int(in_python)
    bend, travel = np.zeros(dim), np.zeros(dim)
    z_last = z
    if n_compiled:
        gradient, context = grad_log_density.plan(n_compiled)
        try:
            z, v, g = _plain_steps_for(gradient)(
                z, v, g, noise, half, decay, n_compiled, context, bend, travel
            )
        except ParameterValueError:  # a parameter left its support: diverging, as in Python
            z, v, g = (np.full(dim, np.nan) for _ in range(3))
        z_last = z
        if not in_python:
            grad_log_density.finished(z, g)
    path = PathCurvature.from_sums(bend, travel, z_last, g)
    if in_python:
        v = v + half * g
        z = z + half * v
        v = decay * v + noise[n_compiled]
        z = z + half * v
        g = last_grad(z)
        path.add(z, g)
        v = v + half * g
    finite = bool(np.isfinite(z).all() and np.isfinite(v).all())
    return SGHMCState(z, v, g), SGHMCInfo(n_steps, finite, clipped, path.value(), path.largest())
