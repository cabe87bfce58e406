"""SGHMC step method (Chen, Fox & Guestrin, 2014), preconditioned by the Laplace fit."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from pymc_bigdata.kernels.baoab_compiled import compiled_baoab_steps
from pymc_bigdata.kernels.sghmc import (
    SGHMCState,
    baoab_noise_share,
    baoab_steps,
    eq15_stationary_covariance,
    sghmc_steps,
    split_innovations,
)
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.compiled_gradient import CompiledGradient, CompiledOracle
from pymc_bigdata.step_methods.gradient_oracle import (
    DrawRecord,
    GradientOracle,
    MinibatchEstimator,
)
from pymc_bigdata.step_methods.kinetic_temperature import BAOABKineticTemperature
from pymc_bigdata.step_methods.progress import ProgressField
from pymc_bigdata.step_methods.settings import check_positive
from pymc_bigdata.step_methods.step_refinement import StepRefinement, check_max_refinements

__all__ = ["SGHMC"]

_INTEGRATORS = {"baoab": baoab_steps, "sghmc": sghmc_steps}

#: up to this many coordinates a noise estimate (``noise_estimate="running"`` or
#: ``"fisher"``) subtracts the gradient noise's whole covariance matrix (a ``d x d``
#: factorisation per draw), beyond it its diagonal. On a Gaussian of correlation 0.9 in the
#: model's coordinates the diagonal left the sds 16 % short (benchmarks/results/bhat_matrix.md)
B_HAT_MATRIX_MAX_DIM = 100


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
        al. 2012, as the paper suggests). B_hat is subtracted from the injected noise: the
        whole ``d x d`` matrix (the paper's B_hat is a matrix, Sec. 3.3) where the estimates
        are first order and ``d <= B_HAT_MATRIX_MAX_DIM``, else its diagonal.
    resample_momentum
        Draw a fresh momentum at the start of every recorded draw.
    learning_rate, alpha
        The paper's Eq. 15 parameters; if given they set ``step_size = sqrt(learning_rate)`` and
        ``friction = alpha / step_size``.
    max_refinements
        BAOAB only (an extension; 0 turns it off, as ``PAPER_SETTINGS`` does; default 6): how
        many times a draw whose path was too stiff for its step is re-run from its start at
        half the step, twice the steps (the same travel time) and the same Brownian path
        (:func:`~pymc_bigdata.kernels.sghmc.split_innovations`). Too stiff: a non-finite
        value, or a path curvature more than twice the chain's typical one
        (:class:`~pymc_bigdata.step_methods.step_refinement.StepRefinement`). The stat
        ``step_refinements`` counts the halvings of each draw.
    compiled_loop
        BAOAB only (default False): run each draw's plain transitions in one Numba-compiled
        loop (:mod:`~pymc_bigdata.kernels.baoab_compiled`), with the same draws as the
        Python loop. It needs the model compiled by PyTensor's Numba backend (the default
        mode); draws with second-order control variates run the Python loop. It costs about
        2-3 s of compilation per step and process and saves nothing with 1,000-row
        minibatches, whose gradient's arithmetic is most of a transition (docs/sghmc.md).

    Notes
    -----
    Defaults: ``eps = 0.7 / sqrt(lambda_max)`` (BAOAB; 0.25 for Eq. 15, whose variance bias
    is ``1 + eps^2/4`` even for a Gaussian), lowered in tuning until the gradient noise feeds
    at most ``noise_bound`` of the stationary variance (:meth:`noise_share`), and
    ``inner_steps = ceil(2.8 / (eps sqrt(lambda_min)))`` where ``lambda`` are the eigenvalues
    of the Laplace curvature in ``z`` (both 1 with the default dense preconditioner). See
    :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` for the other parameters.
    """

    name = "sghmc"
    #: the gradient noise's share of the stationary variance
    progress_field = ProgressField("noise_share", "Noise share", "0.3f")
    default_step_size: ClassVar[float] = 0.7
    #: Eq. 15's default, whose stationary sd is 0.8 % too wide on a unit Gaussian (0.7 gave 11 %)
    default_step_size_eq15: ClassVar[float] = 0.25
    default_friction: ClassVar[float] = 1.0
    #: time covered by one recorded draw, in units of 1/sqrt(curvature); for friction 1 the
    #: position autocorrelation of a unit-curvature Gaussian at this lag is about -0.09, so
    #: consecutive draws are nearly independent (slightly antithetic)
    default_travel_time: ClassVar[float] = 2.8
    #: re-runs of a too-stiff draw at a halved step (at most ``eps / 64``)
    default_max_refinements: ClassVar[int] = 6

    #: the paper's Algorithm 2 (Chen, Fox & Guestrin 2014) with none of our extensions: the
    #: Eq. 15 update (give its ``learning_rate`` and ``alpha``, or ``step_size`` and
    #: ``friction``), B_hat = 0 ("the simplest choice", Sec. 3.3), M = I, minibatches drawn
    #: uniformly at random and independently (Eq. 5), plain minibatch gradients, no census
    #: rows, the model's own coordinates, no tuning. The chain still starts at a draw of the
    #: MAP's Laplace fit (the paper leaves the start open).
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        **SubsamplingStep.EXTENSIONS_OFF,
        "integrator": "sghmc",
        "noise_estimate": "zero",
        "max_refinements": 0,
    }

    stats_dtypes_shapes = {
        **SubsamplingStep.stats_dtypes_shapes,
        "friction": (np.float64, []),
        "kinetic_energy": (np.float64, []),
        "noise_clipped": (bool, []),
        "step_refinements": (np.int64, []),
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
        max_refinements: int | None = None,
        compiled_loop: bool = False,
        **kwargs,
    ):
        if integrator not in _INTEGRATORS:
            raise ValueError(f"integrator must be 'baoab' or 'sghmc', got {integrator!r}.")
        if noise_estimate not in ("zero", "running", "fisher"):
            raise ValueError(
                f"noise_estimate must be 'zero', 'running' or 'fisher', got {noise_estimate!r}."
            )
        if learning_rate is not None:
            check_positive("learning_rate", learning_rate)
            if step_size is not None:
                raise ValueError("Give either step_size or learning_rate, not both.")
            step_size = math.sqrt(learning_rate)
        if alpha is not None:
            check_positive("alpha", alpha)
            if friction is not None:
                raise ValueError("Give either friction or alpha, not both.")
            if step_size is None:
                raise ValueError("alpha (= step_size * friction) needs learning_rate or step_size.")
            friction = alpha / step_size
        self.friction = self.default_friction if friction is None else friction
        check_positive("friction", self.friction)
        self.integrator = integrator
        self.noise_estimate = noise_estimate
        self.noise_measurement = "fisher" if noise_estimate == "fisher" else "split"
        if noise_estimate != "zero":
            self.measure_every = 1  # B-hat follows a running estimate
        self.resample_momentum = bool(resample_momentum)
        default_refinements = self.default_max_refinements if integrator == "baoab" else 0
        self.max_refinements = check_max_refinements(max_refinements, default_refinements)
        if self.max_refinements and integrator != "baoab":
            raise ValueError("max_refinements re-runs BAOAB's steps; integrator='sghmc' has none.")
        self.refinement = StepRefinement(self.max_refinements)
        self.kinetic_expectation = BAOABKineticTemperature()
        self._kernel = _INTEGRATORS[integrator]
        if not isinstance(compiled_loop, bool | np.bool_):
            raise ValueError(f"compiled_loop must be True or False, got {compiled_loop!r}.")
        if compiled_loop and integrator != "baoab":
            raise ValueError("compiled_loop compiles BAOAB's loop; integrator='sghmc' has none.")
        self.compiled_loop = self.maps_in_compiled_code = bool(compiled_loop)
        super().__init__(vars, step_size=step_size, **kwargs)
        # the matrix B-hat: measured where it is subtracted and small enough to factor
        self.noise_covariance = noise_estimate != "zero" and self.layer.dim <= (
            B_HAT_MATRIX_MAX_DIM
        )

    def _prepare(self) -> None:
        super()._prepare()
        self._compiled = CompiledGradient(self.layer) if self.compiled_loop else None

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
        base = self.default_step_size if self.integrator == "baoab" else self.default_step_size_eq15
        # never beyond 2x the unit-curvature step (BAOAB is unstable at eps >= 2 in z units)
        return min(base / math.sqrt(self.precond.curvature_range[1]), 2.0 * base)

    def noise_share(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        """BAOAB: ``kappa eps^2 V / (1 - exp(-2 C eps))``; Eq. 15: ``eps V / (2 C)`` (gradient
        noise ``eta^2 V`` per step against the injected ``2 alpha eta``).  With a B-hat
        correction the subtracted part does not count, only its clipped excess (the share
        beyond 1, where the gradient noise exceeds the noise to inject), taken along the
        stiffest direction of the noise's matrix where B-hat is the matrix
        (:meth:`_noise_amplification`)."""
        if self.noise_estimate == "zero":
            return self._gradient_noise_share(step_size, noise_var)
        amplified = noise_var * self._noise_amplification()
        return np.maximum(self._gradient_noise_share(step_size, amplified) - 1.0, 0.0)

    def _gradient_noise_share(self, step_size: float, noise_var: np.ndarray) -> np.ndarray:
        if self.integrator == "baoab":
            return baoab_noise_share(step_size, self.friction, noise_var)
        return step_size * noise_var / (2.0 * self.friction)

    def _noise_amplification(self) -> float:
        """How far the noise's largest eigenvalue exceeds its largest variance (1 without a
        measured matrix): a correlated noise feeds its stiffest direction more than any
        coordinate, and that direction is where B-hat is clipped first."""
        covariance = self._measured_covariance()
        if covariance is None:
            return 1.0
        largest_variance = float(np.max(np.diag(covariance)))
        if not largest_variance > 0.0:
            return 1.0
        return max(float(np.linalg.eigvalsh(covariance)[-1]) / largest_variance, 1.0)

    def default_inner(self) -> int:
        slowest = math.sqrt(self.precond.curvature_range[0])
        return max(1, math.ceil(self.default_travel_time / (self.step_size * slowest) - 1e-9))

    def _reset_kernel_state(self) -> None:
        self._state: SGHMCState | None = None
        self._noise_clipped = False
        self._refinements = 0
        self._run_step: float | None = None  # the step of the draw's last run

    def _momentum_scale(self) -> float:
        # Eq. 15 stores v = eps * r; BAOAB stores r itself (M = I in z).
        return self.step_size if self.integrator == "sghmc" else 1.0

    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        state = self._state
        if state is None or self.resample_momentum:
            momentum = self.rng.standard_normal(z0.shape[0]) * self._momentum_scale()
            grad = state.grad if state is not None else oracle(z0)
            state = SGHMCState(z0, momentum, grad)
        noise_var = self._b_hat()
        if self._draw_index == 0:
            self.kinetic_expectation.restart()
        if self.max_refinements:
            new_state, info = self._refined_steps(state, oracle, noise_var)
            if not self.tune and info.finite:  # the path curvature, measured where refined
                self.kinetic_expectation.observe(info.path_curvature)
        else:
            kernel, gradients = self._kernel_for(oracle)
            new_state, info = kernel(
                state,
                gradients,
                self.step_size,
                self.friction,
                self.inner_steps,
                self.rng,
                noise_var,
                last_grad=oracle.last,
                track_curvature=False,
            )
        self._state = new_state if info.finite else None
        self._noise_clipped = info.noise_clipped
        return new_state.position, info.finite, oracle.record()

    def _b_hat(self) -> np.ndarray | None:
        """``V_hat`` of Sec. 3.3's ``B_hat = eps V_hat / 2`` (None for ``noise_estimate="zero"``
        or before a measurement): the current batch's noise covariance matrix where it is
        measured (first-order estimates, ``d`` up to ``B_HAT_MATRIX_MAX_DIM``), else its
        diagonal."""
        if self.noise_estimate == "zero":
            return None
        covariance = self._measured_covariance()
        if covariance is not None:
            return covariance * self.minibatches.batch_factor(self.batch_size)
        noise_var = self._noise_variance(self.cv_order)
        return noise_var if noise_var.size else None

    def _measured_covariance(self) -> np.ndarray | None:
        """The per-unit noise matrix measured for B-hat (first-order estimates only), or
        None."""
        return self._noise.covariance() if self.noise_covariance and self.cv_order <= 1 else None

    def _estimator(self) -> MinibatchEstimator:
        """The base's estimates, measuring the noise's whole matrix where B-hat subtracts it
        (``noise_covariance``)."""
        estimator = super()._estimator()
        return replace(estimator, noise_covariance=True) if self.noise_covariance else estimator

    def _kernel_for(self, oracle: GradientOracle) -> tuple[Any, Any]:
        """The integrator and what it calls for gradients: the compiled loop with the
        oracle's compiled estimates where this draw's estimator is covered, else the
        configured integrator with the oracle itself."""
        if self._compiled is not None and self._compiled.covers(oracle.estimator):
            return compiled_baoab_steps, CompiledOracle(oracle, self._compiled)
        return self._kernel, oracle

    def _refined_steps(
        self, state: SGHMCState, oracle: GradientOracle, noise_var: np.ndarray | None
    ) -> tuple[SGHMCState, Any]:
        """BAOAB from ``state``, re-run from it at half the step (twice the steps, the same
        Brownian path) while its path is too stiff, at most ``max_refinements`` times."""
        if self._draw_index == 0:
            self.refinement.restart()

        kernel, gradients = self._kernel_for(oracle)

        def run_at(step: float, n_steps: int, innovations: np.ndarray) -> tuple[SGHMCState, Any]:
            return kernel(
                state, gradients, step, self.friction, n_steps, self.rng, noise_var,
                last_grad=oracle.last, innovations=innovations,
            )  # fmt: skip

        innovations = self.rng.standard_normal((self.inner_steps, state.position.shape[0]))
        new_state, info, refined = self.refinement.run(
            run_at,
            lambda coarse, step: split_innovations(coarse, step, self.friction, self.rng),
            innovations,
            self.step_size,
            self.inner_steps,
            observe=self.tune,
            again=oracle.again,
        )
        self._refinements, self._run_step = refined
        return new_state, info

    def _kinetic_energy(self) -> float:
        if self._state is None:
            return np.nan
        r = self._state.momentum / self._momentum_scale()
        return 0.5 * float(r @ r)

    def _kinetic_temperature(self) -> float:
        """``2 K / d`` over its equilibrium value: for BAOAB (exact positions, biased momenta)
        the end-of-step momentum variance ``1 - eps^2 kappa / 4`` at the step the draw ended
        with (a refined draw's finer one), ``kappa`` the kept draws' mean path curvature (1 in
        tuning, or where draws are not refined: :mod:`.kinetic_temperature`); for Eq. 15 its
        value on a unit Gaussian."""
        if self.integrator == "baoab":
            step = self.step_size if self._run_step is None else self._run_step
            expected = self.kinetic_expectation.expected(step)
        else:
            expected = eq15_momentum_variance(self.step_size, self.friction)
        return 2.0 * self._kinetic_energy() / self.layer.dim / expected

    def _extra_stats(self) -> dict[str, Any]:
        kinetic = self._kinetic_energy()
        return {
            "friction": self.friction,
            "kinetic_energy": kinetic,
            "noise_clipped": self._noise_clipped,
            "step_refinements": self._refinements,
        }


def eq15_momentum_variance(step_size: float, friction: float) -> float:
    """Stationary variance of Eq. 15's momentum ``r = v / eps`` on a unit Gaussian."""
    return eq15_stationary_covariance(step_size, friction)[1, 1] / step_size**2
