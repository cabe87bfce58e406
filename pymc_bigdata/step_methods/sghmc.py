"""SGHMC step method (Chen, Fox & Guestrin, 2014), preconditioned by the Laplace fit."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pymc_bigdata.kernels.sghmc import SGHMCState, baoab_steps, sghmc_steps
from pymc_bigdata.step_methods.base import SubsamplingStep

__all__ = ["SGHMC"]

_INTEGRATORS = {"baoab": baoab_steps, "sghmc": sghmc_steps}


class SGHMC(SubsamplingStep):
    """Stochastic gradient HMC with friction as a PyMC step method.

    Simulates Eq. 13 of the paper, ``dz = v dt``, ``dv = g(z) dt - C v dt + N(0, 2(C - B_hat) dt)``
    in coordinates ``theta = theta* + L z`` (``L L^T`` = Laplace covariance at the MAP, so the
    mass matrix is ``M = (L L^T)^{-1}``, the curvature at the MAP).

    Parameters
    ----------
    friction
        ``C`` (default 1.0, in units of sqrt(curvature) at the MAP; critical damping is 2).
    integrator
        ``"baoab"`` (default; exact for Gaussian posteriors, O(eps^2) bias otherwise) or
        ``"sghmc"`` (the paper's Alg. 2 / Eq. 15: ``eta = eps^2``, ``alpha = eps C``; O(eps) bias).
    noise_estimate
        ``"zero"`` (B_hat = 0, default); ``"running"``: B_hat from a running estimate of the
        gradient-noise variance, measured each draw by splitting its first minibatch in two
        halves; ``"fisher"``: the same from per-row gradients (the empirical Fisher of Ahn et
        al. 2012, as the paper suggests). B_hat is subtracted from the injected noise.
    resample_momentum
        Draw a fresh momentum at the start of every recorded draw.
    learning_rate, alpha
        The paper's Eq. 15 parameters; if given they set ``step_size = sqrt(learning_rate)`` and
        ``friction = alpha / step_size``.

    Defaults: ``eps = 0.7 / sqrt(lambda_max)`` and
    ``inner_steps = ceil(2.8 / (eps sqrt(lambda_min)))`` where ``lambda`` are the eigenvalues
    of the curvature in ``z`` (both 1 with the default dense preconditioner). See
    :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` for the other parameters.
    """

    name = "sghmc"
    default_step_size: ClassVar[float] = 0.7
    default_friction: ClassVar[float] = 1.0
    #: time covered by one recorded draw, in units of 1/sqrt(curvature): for friction 1 the
    #: position autocorrelation of a unit-curvature Gaussian at this lag is about -0.09, so
    #: consecutive draws are nearly independent (slightly antithetic)
    default_travel_time: ClassVar[float] = 2.8

    stats_dtypes_shapes = {
        **SubsamplingStep.stats_dtypes_shapes,
        "friction": (np.float64, []),
        "kinetic_energy": (np.float64, []),
        "noise_clipped": (bool, []),
    }

    def __init__(
        self,
        vars=None,
        *,
        friction: float | None = None,
        integrator: str = "baoab",
        noise_estimate: str = "zero",
        resample_momentum: bool = False,
        learning_rate: float | None = None,
        alpha: float | None = None,
        step_size: float | None = None,
        **kwargs,
    ):
        if integrator not in _INTEGRATORS:
            raise ValueError(f"integrator must be 'baoab' or 'sghmc', got {integrator!r}.")
        if noise_estimate not in ("zero", "running", "fisher"):
            raise ValueError(
                f"noise_estimate must be 'zero', 'running' or 'fisher', got {noise_estimate!r}."
            )
        if learning_rate is not None:
            _check_positive("learning_rate", learning_rate)
            if step_size is not None:
                raise ValueError("Give either step_size or learning_rate, not both.")
            step_size = math.sqrt(learning_rate)
        if alpha is not None:
            _check_positive("alpha", alpha)
            if friction is not None:
                raise ValueError("Give either friction or alpha, not both.")
            if step_size is None:
                raise ValueError("alpha (= step_size * friction) needs learning_rate or step_size.")
            friction = alpha / step_size
        self.friction = self.default_friction if friction is None else friction
        _check_positive("friction", self.friction)
        self.integrator = integrator
        self.noise_estimate = noise_estimate
        self.noise_measurement = "fisher" if noise_estimate == "fisher" else "split"
        self.resample_momentum = bool(resample_momentum)
        self._kernel = _INTEGRATORS[integrator]
        super().__init__(vars, step_size=step_size, **kwargs)

    def _check_reshuffle(self, reshuffle: bool | None) -> bool:
        if self.noise_estimate == "zero":
            return super()._check_reshuffle(reshuffle)
        if reshuffle:
            raise ValueError(
                f"noise_estimate={self.noise_estimate!r} subtracts the variance of independent "
                "minibatch gradients; reshuffled minibatches (disjoint within a pass) have "
                "correlated noise. Use reshuffle=False (the default with a noise estimate)."
            )
        return False

    def default_step(self) -> float:
        return self.default_step_size / math.sqrt(self.precond.curvature_range[1])

    def default_inner(self) -> int:
        slowest = math.sqrt(self.precond.curvature_range[0])
        return max(1, math.ceil(self.default_travel_time / (self.step_size * slowest) - 1e-9))

    def _reset_kernel_state(self) -> None:
        self._state: SGHMCState | None = None
        self._noise_clipped = False

    def _momentum_scale(self) -> float:
        # Eq. 15 stores v = eps * r; BAOAB stores r itself (M = I in z).
        return self.step_size if self.integrator == "sghmc" else 1.0

    def _transitions(self, z0: np.ndarray) -> tuple[np.ndarray, bool]:
        state = self._state
        if state is None or self.resample_momentum:
            momentum = self.rng.standard_normal(z0.shape[0]) * self._momentum_scale()
            grad = state.grad if state is not None else self.grad_log_density(z0)
            state = SGHMCState(z0, momentum, grad)
        noise_var = None if self.noise_estimate == "zero" else self._noise_var
        new_state, info = self._kernel(
            state,
            self.grad_log_density,
            self.step_size,
            self.friction,
            self.inner_steps,
            self.rng,
            noise_var,
        )
        self._state = new_state if info.finite else None
        self._noise_clipped = info.noise_clipped
        return new_state.position, info.finite

    def _extra_stats(self) -> dict[str, Any]:
        if self._state is None:
            kinetic = np.nan
        else:
            r = self._state.momentum / self._momentum_scale()
            kinetic = 0.5 * float(r @ r)
        return {
            "friction": self.friction,
            "kinetic_energy": kinetic,
            "noise_clipped": self._noise_clipped,
        }


def _check_positive(name: str, value: Any) -> None:
    if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}.")
