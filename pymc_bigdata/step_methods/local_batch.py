"""Per-draw batch sizes from the gradient noise measured where the chain is (``local_batch``).

Tuning chooses the step size from the gradient noise averaged over the tuning draws. That
average can hide a part of the posterior where the noise is far larger: on the non-centred
three-level model (``benchmarks/local_batch.py``) the second-order control variates' noise
share, measured draw by draw (the ``local_noise_share`` stat), is 51 times larger where the
countries' scale is in its left tail (``log tc < -2``) than in the bulk, so the gradient
noise heats the chain there and the tail comes out short. With ``local_batch=True`` every
draw after tuning measures its noise on its last transition (two half minibatches, as tuning
does), and the next draw reads enough rows to bring the worst coordinate's share of that
measurement back within ``noise_bound`` (at least the tuned batch size, at most every row).
The batch size is a function of the chain's past, so the draws stay reproducible for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["LocalBatch", "check_local_batch", "local_batch_size"]


def check_local_batch(local_batch: object, sampler: str, reads_oracle: bool) -> bool:
    """``local_batch``: True or False (numpy's booleans too), True only for a sampler whose
    kernel calls the gradient oracle (``reads_oracle``; ``sampler`` names it)."""
    if not isinstance(local_batch, bool | np.bool_):
        raise ValueError(f"local_batch must be True or False, got {local_batch!r}.")
    if local_batch and not reads_oracle:
        raise ValueError(
            f"local_batch sizes the minibatches of a gradient oracle; {sampler} evaluates its "
            "own estimates. Use SGHMC, SGLD or EWSG, or raise batch_size."
        )
    return bool(local_batch)


def local_batch_size(
    worst_share: float, noise_bound: float, base_batch: int, pool_size: int, replace: bool
) -> int:
    """The smallest batch size, from ``base_batch`` up to ``pool_size``, at which a noise
    whose worst share is ``worst_share`` at ``base_batch`` rows feeds at most
    ``noise_bound``: the estimate's variance falls as ``1/n`` (with replacement) or
    ``1/n - 1/N`` (without), and the share is taken as proportional to it (SGHMC's share
    with a B-hat, ``max(share - 1, 0)`` of the raw one, falls faster: the size is then more
    than enough)."""
    if not worst_share > noise_bound:  # NaN too: no reading, no change
        return base_batch
    ratio = noise_bound / worst_share
    if replace:
        return min(pool_size, math.ceil(base_batch / ratio))
    target = (1.0 / base_batch - 1.0 / pool_size) * ratio
    return min(pool_size, math.ceil(1.0 / (target + 1.0 / pool_size) - 1e-9))


class LocalBatch:
    """The batch size of a chain's next draw from the noise its last draw measured.

    Parameters
    ----------
    minibatches
        The step's :class:`~.minibatches.Minibatches`, resized after each draw (its
        ``batch_factor``, ``pool_size`` and ``replace`` are read).
    shares
        ``shares(noise_var)``: each coordinate's share of the stationary variance fed by a
        gradient noise of variance ``noise_var`` at the step's step size now.
    noise_bound
        The step's bound on the share.
    """

    def __init__(
        self, minibatches: Any, shares: Callable[[np.ndarray], np.ndarray], noise_bound: float
    ):
        self.minibatches, self.shares, self.noise_bound = minibatches, shares, noise_bound
        self.restart()

    @classmethod
    def of(cls, step: Any) -> LocalBatch:
        """The collaborator of a step: its minibatches, its noise model at its step size
        now (``step.noise_share(step.step_size, noise_var)``) and its ``noise_bound``."""
        return cls(
            step.minibatches,
            lambda noise_var: step.noise_share(step.step_size, noise_var),
            step.noise_bound,
        )

    def restart(self) -> None:
        """A new chain: the tuned batch size is read at its first draw after tuning."""
        self.base_batch: int | None = None

    def next_batch(self, batch_size: int, unit_noise: np.ndarray | None) -> int:
        """The next draw's batch size, given this draw's (``batch_size`` rows, the first
        draw after tuning fixes the base) and its measured per-unit noise ``N^2 s^2`` per
        coordinate (None: no reading, the base batch)."""
        if self.base_batch is None:
            self.base_batch = batch_size
        base = self.base_batch
        if unit_noise is None or not np.all(np.isfinite(unit_noise)):
            return base
        rows = self.minibatches
        worst = float(np.max(self.shares(unit_noise * rows.batch_factor(base))))
        return local_batch_size(worst, self.noise_bound, base, rows.pool_size, rows.replace)

    def after_draw(self, unit_noise: np.ndarray | None) -> None:
        """Resize the minibatches for the next draw (:meth:`next_batch` of the draw's
        measurement, or None)."""
        batch = self.next_batch(self.minibatches.size, unit_noise)
        if batch != self.minibatches.size:
            self.minibatches.resize(batch)
