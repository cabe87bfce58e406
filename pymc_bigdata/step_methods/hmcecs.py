"""HMC-ECS step method (Dang et al. 2019): perturbed and signed energy conserving subsampling.

The algorithm is in :mod:`pymc_bigdata.kernels.hmcecs`; the per-row Taylor residuals in
:mod:`pymc_bigdata.model.difference_terms`.  This adapter supplies the kernel's two callbacks
(the estimated log posterior at ``(z, u)`` and the subsample proposal), and tunes, on the
base's schedule: the mass matrix (the base's preconditioner: the Laplace fit, then the tuning
windows' draws), the anchor ``theta*`` (re-centred on the draws, Sec. 6.3), the step size (dual
averaging to a mean acceptance of 0.8 at a fixed trajectory length, Sec. 6.3), the subsample
size ``m`` (perturbed; mean ``sigma_hat^2`` at the draws near ``loglik_var_target``, Sec. 3.1)
and ``lambda`` and ``a`` (signed; :func:`~pymc_bigdata.kernels.hmcecs.block_poisson_settings`).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np

from pymc_bigdata.kernels.hmcecs import (
    Evaluation,
    HMCECSInfo,
    HMCECSState,
    Subsample,
    hmcecs_step,
)
from pymc_bigdata.step_methods.alarms import HMCECSAlarm
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.gradient_oracle import DrawRecord, GradientOracle
from pymc_bigdata.step_methods.hmcecs_estimates import (
    EstimatorSettings,
    ExactCache,
    SubsampleEstimates,
    anchor_at,
    residual_spreads,
    take_pool_rows,
)
from pymc_bigdata.step_methods.hmcecs_settings import (
    TAYLOR_SPACES,
    check_layer_settings,
    check_settings,
)
from pymc_bigdata.step_methods.hmcecs_tuning import (
    SubsampleTuning,
    candidate_spaces,
)
from pymc_bigdata.step_methods.step_size import DualAveragingStepSize

__all__ = ["HMCECS"]

#: the smallest automatic subsample size (perturbed): below it sigma_hat^2 is itself noisy
MIN_SUBSAMPLE = 100

#: most leapfrog steps per iteration (a trajectory shorter than asked for beyond it)
MAX_LEAPFROG = 200


#: a window re-fits the anchor only from at least this many draws
MIN_REFIT_DRAWS = 20


class HMCECS(SubsamplingStep):
    """Hamiltonian Monte Carlo with energy conserving subsampling as a PyMC step method.

    Each draw is one HMC-within-Gibbs iteration (Alg. 1): a block pseudo-marginal update of the
    subsample, then leapfrog HMC whose dynamics and accept test both use that subsample's
    estimated Hamiltonian. See ``docs/hmcecs.md``.

    Parameters
    ----------
    estimator
        ``"perturbed"`` (Sec. 4, default): the bias-corrected difference estimator (4.5); the
        draws target a perturbed posterior, ``O(1 / (N m^2))`` from the true one.
        ``"signed"`` (Sec. 5): the block-Poisson estimator (5.1), unbiased but possibly
        negative; the draws target ``|L_hat|`` and the per-draw stat ``sign`` corrects
        expectations exactly (:func:`pymc_bigdata.sign_weights`).
    subsample_size
        ``m``, rows per estimate (perturbed; ``G <= m <= N``).  Default: chosen in tuning so
        that the mean ``sigma_hat^2`` (4.3) over the draws is ``loglik_var_target``, at least
        ``max(100, G)`` and at most ``N``; a given value is kept fixed.  Where ``m`` reaches
        the rows subsampled (``N`` less the census stratum), the estimate is the exact
        full-data sum (:attr:`exact`: ``sigma_hat^2 = 0``, full-data passes), not ``m`` rows
        drawn with replacement.
    blocks
        ``G``, the blocks of the perturbed subsample; one is redrawn per iteration
        (``rho ~ 1 - 1/G``).  Default ``min(100, m)``.
    taylor_order
        Order of the Taylor control variates (4.4): 0, 1 or 2.  Default: 2 where the layer has
        the full-data Hessian ``B`` (``d <= 2000``), else 1 (the stat ``cv_order`` records it).
    minibatch
        ``m`` of the signed estimator: rows per minibatch estimate (default 30, the paper's).
    products
        ``lambda`` of the signed estimator (default: tuned, see ``docs/hmcecs.md``).
    lower_bound
        ``a`` of the signed estimator (default: tuned with ``lambda``).
    refreshed_products
        ``kappa``, products redrawn per iteration (signed; default 1, ``rho ~ 1 - kappa/lambda``).
    trajectory_length
        ``eps L`` in the preconditioned coordinates (default 1.2, the paper's).
    target_accept
        Mean HMC acceptance that dual averaging aims at (default 0.8).
    loglik_var_target
        Mean ``sigma_hat^2`` that the automatic ``m`` (perturbed) or ``lambda`` (signed, as
        ``Var log |L_hat|``) aims at (default 1, Pitt et al. 2012).
    sign_tolerance
        Signed: largest ``1 - E[sign]`` the automatic ``lambda`` allows (default 0.02).
    step_size
        Leapfrog step in the preconditioned coordinates; default: dual averaging in tuning.
    taylor_space
        Where the Taylor control variates are expanded: ``"parameters"`` (``theta``, the
        paper's), ``"likelihood_inputs"`` (``phi(theta)``, the parameter-only tensors the
        per-row log-likelihood reads, e.g. the group effects ``a = mu + tau * z`` of a
        non-centred model; :mod:`pymc_bigdata.model.likelihood_inputs`) or ``"auto"`` (default):
        for the signed estimator, in tuning, the one whose residuals vary less at the recent
        draws; for the perturbed one, the parameters (``AUTO_SPACE_ESTIMATORS``).  The stat
        ``taylor_inputs`` records the choice.  Both give unbiased estimators; they differ only
        where ``phi`` is a nonlinear function of ``theta``.
    census
        Include the base's census stratum (rows that would dominate the estimator's variance,
        e.g. the rows of a rare feature; at most ``min(1000, N) // 2`` rows) in every estimate
        exactly, and subsample the other rows (default True).
    **kwargs
        The base's (:class:`~pymc_bigdata.step_methods.base.SubsamplingStep`): ``model``,
        ``preconditioner``, ``adapt``, ``layer``, ``rng``...
    """

    name = "hmcecs"
    accept_step = True
    watches_stability = False
    max_inner_steps = MAX_LEAPFROG
    default_step_size: ClassVar[float] = 0.25
    default_blocks: ClassVar[int] = 100
    default_minibatch: ClassVar[int] = 30

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list | None]]] = {
        **SubsamplingStep.stats_dtypes_shapes,
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
    }

    #: the Taylor expansion's spaces (``taylor_space``)
    taylor_spaces: ClassVar[tuple[str, ...]] = TAYLOR_SPACES

    def __init__(
        self,
        vars=None,
        *,
        estimator: str = "perturbed",
        subsample_size: int | None = None,
        blocks: int | None = None,
        taylor_order: int | None = None,
        minibatch: int | None = None,
        products: int | None = None,
        lower_bound: float | None = None,
        refreshed_products: int = 1,
        trajectory_length: float = 1.2,
        target_accept: float = 0.8,
        loglik_var_target: float = 1.0,
        sign_tolerance: float = 0.02,
        step_size: float | None = None,
        census: bool = True,
        taylor_space: str = "auto",
        **kwargs,
    ):
        counts = check_settings(
            estimator=estimator,
            taylor_space=taylor_space,
            taylor_order=taylor_order,
            subsample_size=subsample_size,
            blocks=blocks,
            minibatch=minibatch,
            products=products,
            lower_bound=lower_bound,
            refreshed_products=refreshed_products,
            trajectory_length=trajectory_length,
            target_accept=target_accept,
            loglik_var_target=loglik_var_target,
            sign_tolerance=sign_tolerance,
            base_keys=kwargs,
        )
        self.estimator, self._given_space, self._given_order = estimator, taylor_space, taylor_order
        self._given_counts = counts
        self._given_size, self._given_blocks = counts.subsample_size, counts.blocks
        self._given_minibatch, self._given_products = counts.minibatch, counts.products
        self._given_lower_bound = None if lower_bound is None else float(lower_bound)
        self.refreshed_products = counts.refreshed_products
        self.trajectory_length = float(trajectory_length)
        self.target_accept = float(target_accept)
        self.loglik_var_target = float(loglik_var_target)
        self.sign_tolerance = float(sign_tolerance)
        cv = {None: True, 0: "first", 1: "first", 2: "second"}[taylor_order]
        kwargs.setdefault("control_variates", cv)
        if kwargs["control_variates"] in (False, "none"):
            raise ValueError("HMCECS needs control variates (taylor_order 0, 1 or 2).")
        super().__init__(
            vars,
            batch_size=None,  # the base's minibatches are not used; m is checked below
            step_size=step_size,
            census=census,
            replace=True,
            **kwargs,
        )

    # ------------------------------------------------------------------ set-up
    def _check_layer_settings(self) -> None:
        """The settings that need N or d, before the full-data MAP search."""
        check_layer_settings(
            self._given_counts,
            self._given_order,
            self._given_space,
            self.layer.n_rows,
            self.layer.dim,
            self.layer.likelihood_inputs,
        )
        blocks = self._given_counts.blocks or 0
        self.min_subsample = min(self.layer.n_rows, max(MIN_SUBSAMPLE, blocks))

    def _prepare(self) -> None:
        """The Taylor order (2 where the anchor has the full-data Hessian) and the pool of
        subsampled rows (all but the census stratum, which every estimate includes)."""
        given = self._given_order
        self.taylor_order = given if given is not None else (2 if self._has_curvature() else 1)
        self.cv_order = self.taylor_order
        self._pool_rows = (
            np.setdiff1d(np.arange(self.layer.n_rows), self.census) if len(self.census) else None
        )

    def _has_curvature(self) -> bool:
        return self.anchor is not None and self.anchor.loglik_hessian is not None

    def _reset_chain_state(self) -> None:
        super()._reset_chain_state()
        n_rows = self.layer.n_rows
        self.subsample_size = self._given_size or min(1000, n_rows)
        self.minibatch = self._given_minibatch or min(self.default_minibatch, n_rows)
        self.products = self._given_products or 1
        self.lower_bound = self._given_lower_bound if self._given_lower_bound is not None else -1.0
        self._subsample: Subsample | None = None
        self._evaluation: Evaluation | None = None
        self._info: HMCECSInfo | None = None
        self._anchor_seen = self.anchor
        self._window_sum, self._window_count = np.zeros(self.layer.dim), 0
        self._tuning = SubsampleTuning(
            signed=self.estimator == "signed",
            loglik_var_target=self.loglik_var_target,
            sign_tolerance=self.sign_tolerance,
            min_subsample=self.min_subsample,
        )
        self.inner_steps = self._n_steps()
        self.taylor_space = "parameters" if self._given_space == "auto" else self._given_space

    def _reset_kernel_state(self) -> None:
        """Keep the subsample (redrawing it outside the MH update would bias ``u``'s law);
        re-evaluate at the next draw (the coordinates or the anchor may have changed)."""
        self._evaluation = None
        self._exact_evaluation: ExactCache = None

    @property
    def blocks(self) -> int:
        return self._given_blocks or min(self.default_blocks, self.subsample_size)

    def _wanted_steps(self) -> int:
        """Leapfrog steps for ``trajectory_length`` at the current step size."""
        return max(1, math.ceil(self.trajectory_length / self.step_size - 1e-9))

    def default_inner(self) -> int:
        """Leapfrog steps: :meth:`_wanted_steps` (the base caps them at ``max_inner_steps``)."""
        return self._wanted_steps()

    def _n_steps(self) -> int:
        """:meth:`_wanted_steps`, at most ``MAX_LEAPFROG`` (the stat ``trajectory_truncated``
        and an end-of-chain warning say when that shortened the trajectories)."""
        return min(MAX_LEAPFROG, self._wanted_steps())

    # ------------------------------------------------------------------ the estimates
    @property
    def exact(self) -> bool:
        """Whether the perturbed estimator's ``m`` reaches the pool of subsampled rows: the
        log-likelihood is then the exact full-data sum (``sigma_hat^2 = 0``, ``u`` fixed),
        not ``m`` rows drawn with replacement, which would still be noisy."""
        return self.estimator == "perturbed" and self.subsample_size >= self._pool_size()

    def _estimates(self) -> SubsampleEstimates:
        """This draw's estimates (:mod:`.hmcecs_estimates`) under the current settings."""
        settings = EstimatorSettings(
            self.estimator,
            self.taylor_order,
            self.taylor_space,
            self.subsample_size,
            self.blocks,
            self.minibatch,
            self.products,
            self.refreshed_products,
            self.lower_bound,
        )
        return SubsampleEstimates(
            self.layer,
            self.minibatches,
            self._pool_rows,
            self.precond,
            self.anchor,
            settings,
            self._exact_evaluation,
        )

    # ------------------------------------------------------------------ one draw
    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        """One Algorithm 1 iteration on its own estimates (:mod:`.hmcecs_estimates`), not the
        oracle."""
        if self.tune and not self._tuning.piloted:
            self._pilot(z0)
        estimates = self._estimates()
        if self._subsample is None:
            self._subsample = estimates.fresh(self.rng)
            self._evaluation = None
        if self._evaluation is None:
            self._evaluation = estimates.evaluate(z0, self._subsample)
        state = HMCECSState(z0, self._subsample, self._evaluation)
        new_state, info = hmcecs_step(
            state, estimates.evaluate, estimates.propose, self.step_size, self.inner_steps, self.rng
        )
        self._exact_evaluation = estimates.exact_cache
        self._info = info
        self._subsample, self._evaluation = new_state.subsample, new_state.evaluation
        if self.tune and self.adapt:
            self._tune_step(info)
            self._tuning.note_position(self.precond.theta(new_state.position))
            self._measure(new_state.evaluation)
        evaluation = new_state.evaluation
        record = DrawRecord(
            estimates.rows_read, new_state.position, evaluation.grad, evaluation.logp
        )
        return new_state.position, not info.diverging, record

    def _tune_step(self, info: HMCECSInfo) -> None:
        if self._fixed_step:
            return
        accept = 0.0 if info.diverging else info.accept_prob
        self.step_size = self._step_policy.update(accept)
        self.inner_steps = self._n_steps()

    # ------------------------------------------------------------------ tuning m, lambda, a
    def _measure(self, evaluation: Evaluation) -> None:
        """Collect what the automatic ``m`` (or ``lambda``, ``a``) is chosen from, and re-choose
        it on the schedule (until the terminal buffer, so that the step size settles with it)."""
        if not self.exact:  # exact: nothing to learn
            self._tuning.measure(evaluation, self.subsample_size, self.products)
        terminal_start = self._adaptation.windows.terminal_start
        last = terminal_start if terminal_start else self._chain_tune
        if self._tuning.due(self._draw_index + 1, last):
            self._choose_space(self._tuning.recent_thetas)
            self._retune_subsample()

    def _pilot(self, z0: np.ndarray) -> None:
        """At a chain's first tuning draw: the Taylor space (``"auto"``) and one estimate of
        the residuals' spread at the start (``min(1000, N)`` rows), so that the first
        iterations already use a sensible size."""
        self._tuning.piloted = True
        fixed = (self.estimator == "perturbed" and self._given_size is not None) or (
            self.estimator == "signed" and self._given_products is not None
        )
        if fixed and len(self._spaces()) == 1:
            return  # nothing to choose: no measurement, no random numbers used
        self._choose_space([self.precond.theta(z0)], force=True)
        if not fixed:
            self._retune_subsample()
        self._tuning.forget()

    def _spaces(self) -> list[str]:
        """The Taylor spaces to choose between (:func:`~.hmcecs_tuning.candidate_spaces`)."""
        inputs = self.layer.likelihood_inputs
        return candidate_spaces(self._given_space, self.estimator, self.taylor_order, inputs)

    def _choose_space(self, thetas: list[np.ndarray], force: bool = False) -> None:
        """Measure the residuals' spread at ``thetas`` on one fresh set of ``min(1000, N)``
        rows in each candidate space, keep the space whose ``SIZE_QUANTILE`` of the spread is
        smaller (ties: the parameters) and seed the measurements for ``m`` (or ``lambda``,
        ``a``) with its numbers.  Without a choice to make, only ``force`` (the pilot)
        measures."""
        spaces = self._spaces()
        if not thetas or (len(spaces) == 1 and not force):
            return
        n_rows = self._pool_size()
        positions = self.rng.integers(n_rows, size=min(1000, n_rows))
        rows = take_pool_rows(self.layer, self._pool_rows, positions)
        ddof = 0 if self.estimator == "perturbed" else 1  # as (4.3), and the signed rule's
        terms = self.layer.difference_terms
        spreads = residual_spreads(
            terms, rows, self.anchor, self.taylor_order, spaces, thetas, n_rows, ddof
        )
        if not spreads:
            return
        best = self._tuning.best_space(spreads)
        if best != self.taylor_space:  # the measurements so far belong to the other expansion
            self.taylor_space = best
            self._evaluation = None
            self._tuning.forget()
        self._tuning.seed(spreads[best], self._pool_size(), self.minibatch)

    def _retune_subsample(self) -> None:
        """Apply the tuning's ``m`` (perturbed) or ``lambda``, ``a`` (signed), unless given;
        a change redraws the subsample."""
        pool = self._pool_size()
        if self.estimator == "perturbed":
            size = None if self._given_size is not None else self._tuning.subsample_size(pool)
            if size is not None and size != self.subsample_size:
                self.subsample_size = size
                self._subsample = self._evaluation = None
            return
        if self._given_products is not None:
            return
        settings = self._tuning.signed_settings(pool, self.minibatch)
        if settings is not None and settings != (self.products, self.lower_bound):
            self.products, self.lower_bound = settings
            self._subsample = self._evaluation = None

    # ------------------------------------------------------------------ base hooks
    def _adapt(self, theta: np.ndarray, virial: float) -> bool:
        """The base's windows (a new preconditioner restarts dual averaging there); then, at
        a window's end where the control variates are poor (``_poor_control_variates``), the
        anchor and its curvature move to the window's mean. A moved anchor restarts the
        measurements for ``m`` (the residuals changed)."""
        if self._adaptation.windows.collecting(self._draw_index):
            self._window_sum += theta
            self._window_count += 1
        ended = super()._adapt(theta, virial)
        if ended:
            poor = self._tuning.poor_control_variates()
            if poor and self._window_count >= MIN_REFIT_DRAWS:
                self._refit_anchor(self._window_sum / self._window_count)
            self._window_sum, self._window_count = np.zeros(self.layer.dim), 0
            self._tuning.window_ended()
        if self.anchor is not self._anchor_seen:
            self._anchor_seen = self.anchor
            self._tuning.forget()
        return ended

    def _refit_anchor(self, center: np.ndarray) -> None:
        """Move the anchor to ``center`` with the full-data curvature there (second order,
        ``d <= 2000``; one gradient and one Hessian pass over the data)."""
        anchor = anchor_at(self.layer, center, self.taylor_order)
        if anchor is not None:
            self.anchor, self._evaluation = anchor, None

    def _make_step_policy(self) -> DualAveragingStepSize:
        """Dual averaging (Sec. 6.3) at a fixed trajectory length: it sets the step at each
        tuning draw (``_tune_step``), and its averaged value when tuning stops."""
        return DualAveragingStepSize(
            target=self.target_accept, step_size=self.step_size, fixed_step=self._fixed_step
        )

    def _extra_stats(self) -> dict[str, Any]:
        info, evaluation = self._info, self._evaluation
        signed = self.estimator == "signed"
        return {
            "accept_prob": info.accept_prob if info else math.nan,
            "accepted": bool(info.accepted) if info else False,
            "subsample_accept": info.subsample_accept if info else math.nan,
            "loglik_var": evaluation.loglik_var if evaluation else math.nan,
            "sign": evaluation.sign if evaluation else 1,
            "n_steps": self.inner_steps,
            "energy_error": info.energy_error if info else math.nan,
            "subsample_size": self.minibatch if signed else self.subsample_size,
            "products": self.products if signed else 0,
            "lower_bound": self.lower_bound if signed else math.nan,
            "cv_order": self.taylor_order,
            "taylor_inputs": self.taylor_space == "likelihood_inputs",
            "trajectory_truncated": self.inner_steps < self._wanted_steps(),
        }

    def _make_alarms(self) -> list[HMCECSAlarm]:
        """Negative signs, a large sigma_hat^2, truncated trajectories, a sticky subsample."""
        return [
            HMCECSAlarm(
                signed=self.estimator == "signed",
                loglik_var_target=self.loglik_var_target,
                trajectory_length=self.trajectory_length,
                max_leapfrog=MAX_LEAPFROG,
            )
        ]
