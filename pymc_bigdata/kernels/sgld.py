"""Stochastic gradient Langevin dynamics (Welling & Teh, 2011).

Update (their Eq. 4, with a fixed step size and a fixed preconditioner ``P = L L^T`` folded
into the coordinates ``z``, so that ``P = I`` here)::

    z_{t+1} = z_t + (eps / 2) * g(z_t) + N(0, eps I)

where ``g`` is the minibatch (or control-variate) estimate of the gradient of the log
posterior.  With an exact gradient this is the Euler-Maruyama discretisation of the Langevin
diffusion; its bias is O(eps): for a Gaussian target of unit curvature the stationary
variance is ``1 / (1 - eps / 4)``.  Gradient noise adds variance ``eps^2 / 4 * V`` per step,
which is O(eps^2) and negligible next to the injected ``eps``.

Where the posterior is much more curved than in the bulk (a scale's long tail, a funnel's
neck) Euler's bias ``eps kappa / 4`` grows with the curvature ``kappa``, and beyond
``eps kappa = 4`` a direction is unstable. The kernel reports the curvature its path met
(:class:`~pymc_bigdata.kernels.path_curvature.PathCurvature`), and
:func:`split_increments` halves its steps along the same Brownian path, so that a step
method can re-run such a draw finer without changing where its noise leads.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from pymc_bigdata.kernels.path_curvature import path_curvature

__all__ = ["SGLDInfo", "sgld_steps", "split_increments"]


class SGLDInfo(NamedTuple):
    """What happened in a run of SGLD steps."""

    n_steps: int
    finite: bool
    #: ``sum -dg.dz / sum |dz|^2`` over successive gradient evaluations (NaN: not tracked, or
    #: fewer than two steps)
    path_curvature: float = math.nan
    #: the largest per-coordinate quotient of the same sums
    path_curvature_max: float = math.nan


def sgld_steps(
    position: np.ndarray,
    grad_log_density: Callable[[np.ndarray], np.ndarray],
    step_size: float,
    n_steps: int,
    rng: np.random.Generator,
    last_grad: Callable[[np.ndarray], np.ndarray] | None = None,
    innovations: np.ndarray | None = None,
    track_curvature: bool = True,
) -> tuple[np.ndarray, SGLDInfo]:
    """Run ``n_steps`` SGLD updates from ``position``.

    Parameters
    ----------
    position
        Start, in preconditioned coordinates.
    grad_log_density
        Returns a stochastic estimate of the gradient of the log posterior at a position.
    step_size
        ``eps`` in the update above.
    n_steps
        Number of updates.
    rng
        Source of the injected noise.
    last_grad
        The gradient callback for the last update (default ``grad_log_density``): where
        the step method measures its estimator's noise.
    innovations
        The standard-normal draws behind the injected noise, shape ``(n_steps, d)``
        (default: drawn from ``rng``), e.g. :func:`split_increments` of a coarser run's.
    track_curvature
        Whether to measure the path's curvature between the gradient evaluations (the
        info's ``path_curvature`` and ``path_curvature_max``; NaN when off).

    Returns
    -------
    position, SGLDInfo
        The final position; ``finite`` is False when a non-finite value appeared.
    """
    if innovations is None:
        innovations = rng.standard_normal((n_steps, position.shape[0]))
    noise = innovations * np.sqrt(step_size)
    half = 0.5 * step_size
    path = path_curvature(track_curvature)
    z = position
    for i in range(n_steps):
        grad = last_grad if last_grad is not None and i == n_steps - 1 else grad_log_density
        g = grad(z)
        path.add(z, g)
        z = z + half * g + noise[i]
    finite = bool(np.isfinite(z).all())
    return z, SGLDInfo(n_steps, finite, path.value(), path.largest())


def split_increments(innovations: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The standard-normal draws of twice the steps at half the step, along the same
    Brownian path.

    One step of ``eps`` injects ``sqrt(eps) xi``; two of ``eps / 2`` inject
    ``sqrt(eps / 2) (xi_1 + xi_2)``, the same when ``xi_1 + xi_2 = sqrt(2) xi``. Given the
    coarse ``xi``, ``xi_1 = (xi + u) / sqrt(2)`` and ``xi_2 = (xi - u) / sqrt(2)`` with a
    fresh standard normal ``u`` are independent standard normals again (the Brownian bridge
    at the midpoint; :func:`~pymc_bigdata.kernels.sghmc.split_innovations` at zero friction).

    Parameters
    ----------
    innovations
        The coarse run's standard-normal draws, shape ``(n_steps, d)``.
    rng
        Source of ``u``.

    Returns
    -------
    ndarray, shape ``(2 n_steps, d)``
    """
    fresh = rng.standard_normal(innovations.shape)
    pairs = np.stack([innovations + fresh, innovations - fresh], axis=1) / math.sqrt(2.0)
    return pairs.reshape(2 * innovations.shape[0], innovations.shape[1])
