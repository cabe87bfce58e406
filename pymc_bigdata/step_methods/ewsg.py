"""EWSG step method (Li, Zhang & Tao, 2021): underdamped Langevin whose minibatch is chosen
by an index Metropolis chain (:mod:`pymc_bigdata.kernels.ewsg`)."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pymc_bigdata.kernels.ewsg import (
    INDEX_WEIGHTS,
    INTEGRATORS,
    EWSGState,
    ewsg_steps,
    momentum_update,
    stationary_covariance,
)
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.gradient_oracle import DrawRecord, GradientOracle
from pymc_bigdata.step_methods.progress import ProgressField
from pymc_bigdata.step_methods.settings import check_positive

__all__ = ["EWSG"]


class EWSG(SubsamplingStep):
    """Exponentially weighted stochastic gradients as a PyMC step method.

    Underdamped Langevin dynamics in the base's preconditioned coordinates ``z`` (unit mass,
    ``sigma = sqrt(2 gamma)``). At every step an index chain (Algorithm 1, Eq. 5) starts from a
    uniformly drawn minibatch and makes ``index_chain_steps`` proposals, each a fresh uniform
    minibatch whose gradient estimate (with the base's control variates, unless turned off)
    is accepted with the ratio of the weights of Eq. 4; the chosen estimate drives the step.
    See ``docs/ewsg.md`` for the minibatch derivation.

    Parameters
    ----------
    step_size
        ``h`` in ``z`` units. Default: ``0.7 / sqrt(lambda_max)`` (OBABO; ``0.1`` for Euler),
        lowered in tuning until the gradient noise feeds at most ``noise_bound`` of the
        stationary variance (:meth:`noise_share`, the uniform-subsampling noise: an upper
        bound for EWSG's). A given value is kept fixed.
    friction
        ``gamma`` in units of ``sqrt(curvature)`` at the MAP (default 1.0).
    batch_size
        Rows of each candidate minibatch ``b``. Each step reads ``(M + 1) b`` rows; the
        default, ``min(1000, N) // (M + 1)``, reads as many per step as SGHMC's default.
    index_chain_steps
        ``M``, index-chain proposals per step (default 1, the paper's).
    integrator
        ``"obabo"`` (default; exact stationary law on Gaussian posteriors, ``O(h^2)`` bias
        otherwise) or ``"euler"`` (the paper's Euler-Maruyama step, Eq. 3; ``O(h)`` bias).
    index_weights
        ``"linear"`` (default): Eq. 4 at the paper's guess ``r' = r`` without its term
        quadratic in the gradient estimate, a tilt against the momentum that adds friction
        in proportion to the noise (derivation in docs/ewsg.md); ``"paper"``: Eq. 4 at
        ``r' = r`` as written, whose quadratic term biases the mean where the minibatch
        noise is skewed and over-corrects the variance (``PAPER_SETTINGS`` uses it).

    Notes
    -----
    ``EWSG(**EWSG.PAPER_SETTINGS, step_size=h, friction=gamma)`` is the paper's plain version:
    Euler-Maruyama, the paper's index weights, no control variates, no preconditioner (``z =
    theta - theta_MAP``), independent uniform minibatches (Algorithm 1's index proposals; not
    reshuffled), no census rows, the model's own coordinates, fixed ``h`` and ``gamma``. See
    :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` for the other parameters.
    """

    name = "ewsg"
    #: the index chain's acceptance (1: flat weights)
    progress_field = ProgressField("index_accept", "Index accept", "0.2f")
    default_step_size: ClassVar[float] = 0.7
    default_step_size_euler: ClassVar[float] = 0.1
    default_friction: ClassVar[float] = 1.0
    #: dynamics time per recorded draw (as SGHMC's, in units of 1/sqrt(curvature))
    default_travel_time: ClassVar[float] = 2.8
    #: the measuring call is one of the index chain's candidates, which must all be
    #: minibatches of one size: it reads the draw's own minibatch
    measure_rows: ClassVar[int] = 0
    default_index_chain_steps: ClassVar[int] = 1
    #: the paper's plain version (Sec. 4.2, Algorithm 1); give step_size and friction too
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        **SubsamplingStep.EXTENSIONS_OFF,  # reshuffle False: Algorithm 1's independent indices
        "integrator": "euler",
        "index_weights": "paper",
    }

    off_target_consequence = (
        "Its draws are likely too dispersed (the index chain removes only part of the "
        "noise's excess, less with one proposal and large noise) or, with the paper's index "
        "weights at large index_chain_steps or with reshuffled minibatches, too narrow."
    )

    stats_dtypes_shapes = {
        **SubsamplingStep.stats_dtypes_shapes,
        "friction": (np.float64, []),
        "index_accept": (np.float64, []),
        "index_proposals": (np.int64, []),
        "kinetic_energy": (np.float64, []),
    }

    def __init__(
        self,
        vars=None,
        *,
        step_size: float | None = None,
        friction: float | None = None,
        batch_size: int | None = None,
        index_chain_steps: int = 1,
        integrator: str = "obabo",
        index_weights: str = "linear",
        **kwargs,
    ):
        if integrator not in INTEGRATORS:
            raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}.")
        if index_weights not in INDEX_WEIGHTS:
            raise ValueError(
                f"index_weights must be one of {INDEX_WEIGHTS}, got {index_weights!r}."
            )
        if (
            isinstance(index_chain_steps, bool)
            or not isinstance(index_chain_steps, int | np.integer)
            or index_chain_steps < 1
        ):
            raise ValueError(
                f"index_chain_steps (M) must be an integer >= 1, got {index_chain_steps!r}."
            )
        self.friction = self.default_friction if friction is None else friction
        check_positive("friction", self.friction)
        if step_size is not None:
            check_positive("step_size", step_size)
        self.integrator = integrator
        self.index_weights = index_weights
        self.index_chain_steps = int(index_chain_steps)
        super().__init__(vars, step_size=step_size, batch_size=batch_size, **kwargs)

    def default_batch_size(self, n_rows: int) -> int:
        """``min(1000, N) // (M + 1)`` rows per candidate: as many rows per step as SGHMC."""
        return max(1, min(1000, n_rows) // (self.index_chain_steps + 1))

    # ------------------------------------------------------------------ defaults
    def default_step(self) -> float:
        base = (
            self.default_step_size if self.integrator == "obabo" else self.default_step_size_euler
        )
        # OBABO needs h < 2 in z units (like BAOAB); Euler-Maruyama needs h < gamma
        return min(base / math.sqrt(self.precond.curvature_range[1]), 2.0 * base)

    def default_inner(self) -> int:
        slowest = math.sqrt(self.precond.curvature_range[0])
        return max(1, math.ceil(self.default_travel_time / (self.step_size * slowest) - 1e-9))

    def noise_share(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        """``kick^2 V / noise_var``: the momentum variance a uniform minibatch's gradient noise
        ``V`` adds per step against the injected one (both enter ``r'`` the same way, so this
        is also their ratio in the stationary position variance). EWSG's selected gradients
        feed less; this bound is what the step size is chosen by."""
        update = momentum_update(step_size, self.friction, self.integrator)
        if self.integrator == "obabo" and step_size >= 2.0:
            return np.full(np.shape(noise_var), np.inf)
        return update.kick**2 * np.asarray(noise_var) / update.noise_var

    # ------------------------------------------------------------------ one draw
    def _reset_kernel_state(self) -> None:
        self._state: EWSGState | None = None
        self._index_accept = math.nan
        self._index_proposals = 0

    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        state = self._state
        if state is None:
            state = EWSGState(z0, self.rng.standard_normal(z0.shape[0]))
        new_state, info = ewsg_steps(
            state,
            oracle,
            self.step_size,
            self.friction,
            self.inner_steps,
            self.index_chain_steps,
            self.rng,
            self.integrator,
            self.index_weights,
            last_candidate=oracle.last,
        )
        self._state = new_state if info.finite else None
        self._index_proposals = info.index_proposals
        self._index_accept = info.index_accepted / max(info.index_proposals, 1)
        return new_state.position, info.finite, oracle.record()

    def _kinetic_energy(self) -> float:
        if self._state is None:
            return math.nan
        r = self._state.momentum
        return 0.5 * float(r @ r)

    def _kinetic_temperature(self) -> float:
        """``2 K / d`` over its value at equilibrium on a unit Gaussian (1 for OBABO)."""
        expected = 1.0
        if self.integrator == "euler":
            expected = float(stationary_covariance(self.step_size, self.friction, "euler")[1, 1])
        return 2.0 * self._kinetic_energy() / self.layer.dim / expected

    def _extra_stats(self) -> dict[str, Any]:
        return {
            "friction": self.friction,
            "index_accept": self._index_accept,
            "index_proposals": self._index_proposals,
            "kinetic_energy": self._kinetic_energy(),
        }
