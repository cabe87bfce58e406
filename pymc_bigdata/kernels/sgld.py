"""Stochastic gradient Langevin dynamics (Welling & Teh, 2011).

Update (their Eq. 4, with a fixed step size and a fixed preconditioner ``P = L L^T`` folded
into the coordinates ``z``, so that ``P = I`` here)::

    z_{t+1} = z_t + (eps / 2) * g(z_t) + N(0, eps I)

where ``g`` is the minibatch (or control-variate) estimate of the gradient of the log
posterior.  With an exact gradient this is the Euler-Maruyama discretisation of the Langevin
diffusion; its bias is O(eps): for a Gaussian target of unit curvature the stationary
variance is ``1 / (1 - eps / 4)``.  Gradient noise adds variance ``eps^2 / 4 * V`` per step,
which is O(eps^2) and negligible next to the injected ``eps``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

__all__ = ["SGLDInfo", "sgld_steps"]


class SGLDInfo(NamedTuple):
    """What happened in a run of SGLD steps."""

    n_steps: int
    finite: bool


def sgld_steps(
    position: np.ndarray,
    grad_log_density: Callable[[np.ndarray], np.ndarray],
    step_size: float,
    n_steps: int,
    rng: np.random.Generator,
    last_grad: Callable[[np.ndarray], np.ndarray] | None = None,
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

    Returns
    -------
    position, SGLDInfo
        The final position; ``finite`` is False when a non-finite value appeared.
    """
    noise = rng.standard_normal((n_steps, position.shape[0])) * np.sqrt(step_size)
    half = 0.5 * step_size
    z = position
    for i in range(n_steps):
        grad = last_grad if last_grad is not None and i == n_steps - 1 else grad_log_density
        z = z + half * grad(z) + noise[i]
    finite = bool(np.isfinite(z).all())
    return z, SGLDInfo(n_steps=n_steps, finite=finite)
