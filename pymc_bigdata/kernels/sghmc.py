"""Stochastic gradient Hamiltonian Monte Carlo (Chen, Fox & Guestrin, 2014).

Both integrators work in coordinates where the mass matrix is the identity (the adapter's
preconditioner ``L`` plays the role of ``M^{-1/2}``).  ``g(z)`` is the stochastic estimate of
the gradient of the log posterior and ``V`` an estimate of its noise covariance (``B = eps V / 2``
in the paper's notation).

``sghmc_steps`` is the paper's Algorithm 2 in its SGD-with-momentum form (Eq. 15), with
``v = eps M^{-1} r``::

    z <- z + v
    v <- v + eta g(z) - alpha v + N(0, 2 (alpha - beta_hat) eta),

where ``eta = eps^2`` (learning rate), ``alpha = eps C`` (friction) and
``beta_hat = eta V_hat / 2`` (the B-hat correction, Sec. 3.3).

``baoab_steps`` simulates the same SDE (Eq. 13, friction ``C`` = ``gamma``) with the
B-A-O-A-B splitting (Leimkuhler & Matthews, 2013), one gradient per step: half kick,
half drift, an exact Ornstein-Uhlenbeck update of the momentum, half drift, half kick.
Its O-step injects ``N(0, (1 - c^2) I - kappa eps^2 V_hat)`` with ``c = exp(-gamma eps)``, the
discrete version of ``2 (C - B_hat) eps``: the gradient noise (which enters the momentum as
``eps N(0, V)`` where the two half kicks around a position meet) supplies the rest.
``kappa`` (:func:`baoab_noise_weight`, between ``c^2`` and 1) makes the position variance
exact for a unit-curvature Gaussian, the posterior shape the preconditioner aims at.  For a Gaussian
target BAOAB's stationary distribution of ``z`` is exact for every ``eps < 2``; otherwise its
bias is O(eps^2).

Where the posterior is more curved than the preconditioner's fit (the neck of a funnel, a
scale's long tail), a step chosen in the bulk is too long there: BAOAB's O(eps^2) bias grows
with the curvature, and beyond ``4 / eps^2`` along a direction the mode is unstable. Both
integrators report the path's curvature (``SGHMCInfo.path_curvature``, the Rayleigh quotient
``sum -dg.dz / sum |dz|^2`` of successive positions and gradients): at equilibrium every mode
moves about ``eps`` per step, so it is near the mean curvature (1 where the preconditioner
fits), and an unstable mode soon dominates it; per coordinate (``path_curvature_max``, the
largest), one stiff direction among many shows undiluted. :func:`split_innovations` halves
BAOAB's steps along the same Brownian path, so that a step method can re-run such a draw at
a finer step without changing where its noise leads.

Eq. 15 is biased even for a Gaussian: its stationary position variance
(:func:`eq15_position_variance`) is ``1 + eps^2/4 + O(eps^3)`` at friction 1 (1.232 at
eps = 0.7, 1.016 at the default 0.25 of that integrator).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import NamedTuple

import numpy as np
import scipy.linalg

from pymc_bigdata.kernels.path_curvature import path_curvature

__all__ = [
    "SGHMCInfo",
    "SGHMCState",
    "baoab_noise",
    "baoab_noise_share",
    "baoab_noise_weight",
    "baoab_steps",
    "eq15_position_variance",
    "eq15_stationary_covariance",
    "sghmc_steps",
    "split_innovations",
]


class SGHMCState(NamedTuple):
    """Position, momentum (velocity in the Eq. 15 form) and the gradient at the position."""

    position: np.ndarray
    momentum: np.ndarray
    grad: np.ndarray


class SGHMCInfo(NamedTuple):
    """What happened in a run of SGHMC steps."""

    n_steps: int
    finite: bool
    noise_clipped: bool
    #: ``sum -dg.dz / sum |dz|^2`` over the steps (NaN where the chain did not move)
    path_curvature: float = math.nan
    #: the largest per-coordinate quotient of the same sums
    path_curvature_max: float = math.nan


def _noise_scale(thermal_var: float, grad_noise_var: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """Per-coordinate sd of the injected noise: sqrt(thermal - gradient noise), clipped at 0."""
    if grad_noise_var is None:
        return np.sqrt(thermal_var), False
    remaining = thermal_var - grad_noise_var
    clipped = bool((remaining < 0).any())
    return np.sqrt(np.maximum(remaining, 0.0)), clipped


def _injected(
    innovations: np.ndarray, thermal_var: float, grad_noise: np.ndarray | None
) -> tuple[np.ndarray, bool]:
    """Standard-normal ``innovations`` (rows: steps) scaled to the injected noise, whose
    covariance is ``thermal_var I`` less the gradient noise's part ``grad_noise`` (None: none;
    a vector: its diagonal, per coordinate; a matrix: all of it, Sec. 3.3's matrix B-hat),
    clipped at 0 (for a matrix, its negative eigenvalues), and whether it was clipped. A
    diagonal matrix gives the vector's noise."""
    if grad_noise is None or grad_noise.ndim == 1:
        noise_sd, clipped = _noise_scale(thermal_var, grad_noise)
        return innovations * noise_sd, clipped
    remaining = thermal_var * np.eye(len(grad_noise)) - grad_noise
    try:
        factor, clipped = np.linalg.cholesky(remaining), False
    except np.linalg.LinAlgError:  # not positive definite: the gradient noise exceeds it
        values, vectors = np.linalg.eigh(remaining)
        factor, clipped = vectors * np.sqrt(np.maximum(values, 0.0)), bool((values < 0).any())
    return innovations @ factor.T, clipped


@lru_cache(maxsize=4096)
def baoab_noise_weight(step_size: float, friction: float) -> float:
    """Weight ``kappa`` of the gradient-noise variance in BAOAB's B-hat correction.

    For the unit Gaussian, one BAOAB step is linear in (z, v); the stationary position variance
    is ``a s + b V`` for injected variance ``s`` and gradient-noise variance ``V`` (two discrete
    Lyapunov equations).  Holding it at 1 = ``a (1 - c^2)`` gives ``kappa = b / (a eps^2)``.
    """
    h, c = step_size, math.exp(-friction * step_size)
    kick = np.array([[1.0, 0.0], [-h, 1.0]])
    drift = np.array([[1.0, h / 2], [0.0, 1.0]])
    damp = np.diag([1.0, c])
    step = drift @ damp @ drift @ kick
    from_gradient = drift @ damp @ drift @ np.array([0.0, h])
    from_thermal = drift @ np.array([0.0, 1.0])
    a = scipy.linalg.solve_discrete_lyapunov(step, np.outer(from_thermal, from_thermal))[0, 0]
    b = scipy.linalg.solve_discrete_lyapunov(step, np.outer(from_gradient, from_gradient))[0, 0]
    return float(b / (a * h * h))


def baoab_noise_share(step_size: float, friction: float, grad_noise_var: np.ndarray) -> np.ndarray:
    """Share of BAOAB's stationary position variance (unit-curvature Gaussian) fed by
    gradient noise of variance ``V`` when ``B_hat = 0``: ``kappa eps^2 V / (1 - c^2)``."""
    if step_size >= 2.0:  # no stationary distribution: all noise
        return np.full(np.shape(grad_noise_var), np.inf)
    rounded = float(f"{step_size:.10g}")  # cache-friendly, relative precision 1e-10
    weight = baoab_noise_weight(rounded, friction) if rounded > 1e-6 else 1.0  # kappa -> 1
    thermal = -math.expm1(-2.0 * friction * step_size)  # 1 - c^2
    return weight * step_size**2 * np.asarray(grad_noise_var) / thermal


@lru_cache(maxsize=256)
def eq15_stationary_covariance(step_size: float, friction: float) -> np.ndarray:
    """Stationary covariance of ``(z, v)`` under Eq. 15 on a unit Gaussian, exact gradients.

    One step is linear in ``(z, v)``: ``z' = z + v``, ``v' = v - eta z' - alpha v + xi``;
    the discrete Lyapunov equation gives it exactly.
    """
    eta, alpha = step_size**2, step_size * friction
    step = np.array([[1.0, 1.0], [-eta, 1.0 - eta - alpha]])
    injected = np.array([[0.0, 0.0], [0.0, 2.0 * alpha * eta]])
    return scipy.linalg.solve_discrete_lyapunov(step, injected)


def eq15_position_variance(step_size: float, friction: float) -> float:
    """Stationary position variance of Eq. 15 on a unit Gaussian (1 would be unbiased)."""
    return float(eq15_stationary_covariance(step_size, friction)[0, 0])


def baoab_steps(
    state: SGHMCState,
    grad_log_density: Callable[[np.ndarray], np.ndarray],
    step_size: float,
    friction: float,
    n_steps: int,
    rng: np.random.Generator,
    grad_noise_var: np.ndarray | None = None,
    last_grad: Callable[[np.ndarray], np.ndarray] | None = None,
    innovations: np.ndarray | None = None,
    track_curvature: bool = True,
) -> tuple[SGHMCState, SGHMCInfo]:
    """Run ``n_steps`` BAOAB steps of SGHMC dynamics (Eq. 13 with M = I).

    Parameters
    ----------
    state
        Position, momentum and the gradient estimate at the position.
    grad_log_density
        Stochastic gradient of the log posterior.
    step_size
        ``eps`` (time per step).
    friction
        ``C`` (= gamma), the friction coefficient.
    n_steps
        Number of steps.
    rng
        Source of the injected noise.
    grad_noise_var
        Diagonal of ``V_hat`` (variance of the gradient estimate), or all of it (a ``(d, d)``
        matrix), or None for ``B_hat = 0``.
    last_grad
        The gradient callback for the last step (default ``grad_log_density``): where the
        step method measures its estimator's noise.
    innovations
        The O-steps' standard-normal draws, shape ``(n_steps, d)`` (default: drawn from
        ``rng``), e.g. :func:`split_innovations` of a coarser run's.
    track_curvature
        Whether to measure the path's curvature (the info's ``path_curvature`` and
        ``path_curvature_max``; NaN when off, which saves a few vector operations per step).
    """
    z, v, g = state
    decay, noise, clipped = baoab_noise(
        step_size, friction, n_steps, z.shape[0], rng, grad_noise_var, innovations
    )
    half = 0.5 * step_size
    path = path_curvature(track_curvature, z, g)
    for i in range(n_steps):
        v = v + half * g
        z = z + half * v
        v = decay * v + noise[i]
        z = z + half * v
        g = _grad_for(i, n_steps, grad_log_density, last_grad)(z)
        path.add(z, g)
        v = v + half * g
    finite = bool(np.isfinite(z).all() and np.isfinite(v).all())
    return SGHMCState(z, v, g), SGHMCInfo(n_steps, finite, clipped, path.value(), path.largest())


def baoab_noise(
    step_size: float,
    friction: float,
    n_steps: int,
    dim: int,
    rng: np.random.Generator,
    grad_noise_var: np.ndarray | None,
    innovations: np.ndarray | None,
) -> tuple[float, np.ndarray, bool]:
    """BAOAB's O-step: the momentum's decay ``c = exp(-C eps)``, the noise it injects at each
    step, shape ``(n_steps, d)`` (``innovations`` scaled, drawn from ``rng`` if None), and
    whether the B-hat correction was clipped (the arguments are :func:`baoab_steps`'s)."""
    decay = np.exp(-friction * step_size)
    if innovations is None:
        innovations = rng.standard_normal((n_steps, dim))
    noise, clipped = _injected(
        innovations,
        1.0 - decay**2,
        None
        if grad_noise_var is None
        else baoab_noise_weight(step_size, friction) * step_size**2 * grad_noise_var,
    )
    return decay, noise, clipped


def split_innovations(
    innovations: np.ndarray, step_size: float, friction: float, rng: np.random.Generator
) -> np.ndarray:
    """The O-step draws of BAOAB at half the step along the same Brownian path.

    Two O-steps of ``eps / 2`` (decay ``h = exp(-C eps / 2)``) inject
    ``sqrt(1 - h^2) (h xi_1 + xi_2)``, one of ``eps`` injects ``sqrt(1 - h^4) xi``; they agree
    when ``h xi_1 + xi_2 = sqrt(1 + h^2) xi``. Given the coarse ``xi``, the pair is
    ``xi_1 = (h xi + u) / s``, ``xi_2 = (xi - h u) / s`` with ``s = sqrt(1 + h^2)`` and a fresh
    standard normal ``u``: independent standard normals again, whose sum the coarse step saw.

    Parameters
    ----------
    innovations
        The coarse run's standard-normal draws, shape ``(n_steps, d)``.
    step_size, friction
        The coarse run's ``eps`` and ``C``.
    rng
        Source of ``u``.

    Returns
    -------
    ndarray, shape ``(2 n_steps, d)``
    """
    h = math.exp(-0.5 * friction * step_size)
    s = math.sqrt(1.0 + h * h)
    fresh = rng.standard_normal(innovations.shape)
    pairs = np.stack([(h * innovations + fresh) / s, (innovations - h * fresh) / s], axis=1)
    return pairs.reshape(2 * innovations.shape[0], innovations.shape[1])


def sghmc_steps(
    state: SGHMCState,
    grad_log_density: Callable[[np.ndarray], np.ndarray],
    step_size: float,
    friction: float,
    n_steps: int,
    rng: np.random.Generator,
    grad_noise_var: np.ndarray | None = None,
    last_grad: Callable[[np.ndarray], np.ndarray] | None = None,
    track_curvature: bool = True,
) -> tuple[SGHMCState, SGHMCInfo]:
    """Run ``n_steps`` of Algorithm 2 in the Eq. 15 form (the paper's own integrator).

    The momentum slot holds ``v = eps r``; ``eta = eps^2``, ``alpha = eps * friction`` and
    ``beta_hat = eta * V_hat / 2``.  The gradient slot is left as given (this integrator
    evaluates the gradient at the new position each step and does not reuse it).  The
    arguments are :func:`baoab_steps`'s.
    """
    z, v, g = state
    eta = step_size**2
    alpha = step_size * friction
    noise, clipped = _injected(
        rng.standard_normal((n_steps, z.shape[0])),
        2.0 * alpha * eta,
        None if grad_noise_var is None else eta**2 * grad_noise_var,
    )
    path = path_curvature(track_curvature)  # the slot's gradient may be stale here
    for i in range(n_steps):
        z = z + v
        g = _grad_for(i, n_steps, grad_log_density, last_grad)(z)
        path.add(z, g)
        v = v + eta * g - alpha * v + noise[i]
    finite = bool(np.isfinite(z).all() and np.isfinite(v).all())
    return SGHMCState(z, v, g), SGHMCInfo(n_steps, finite, clipped, path.value(), path.largest())


def _grad_for(
    step: int,
    n_steps: int,
    grad_log_density: Callable[[np.ndarray], np.ndarray],
    last_grad: Callable[[np.ndarray], np.ndarray] | None,
) -> Callable[[np.ndarray], np.ndarray]:
    """The gradient callback of step ``step``: ``last_grad`` (if given) on the last one."""
    return last_grad if last_grad is not None and step == n_steps - 1 else grad_log_density
