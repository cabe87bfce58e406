"""HMC-ECS step method (Dang et al. 2019): perturbed and signed energy conserving subsampling.

The algorithm is in :mod:`pymc_bigdata.kernels.hmcecs`; the per-row Taylor residuals in
:mod:`pymc_bigdata.model.difference_terms`.  This adapter supplies the kernel's two callbacks
(the estimated log posterior at ``(z, u)`` and the subsample proposal), and tunes, on the
base's schedule: the mass matrix (the base's preconditioner: the Laplace fit, then the tuning
windows' draws), the anchor ``theta*`` (re-centred on the draws, Sec. 6.3), the step size (dual
averaging to a mean acceptance of 0.8 at a fixed trajectory length, Sec. 6.3), the subsample
size ``m`` (perturbed; mean ``sigma_hat^2`` at the draws near ``loglik_var_target``, Sec. 3.1)
and ``lambda`` and ``a`` (signed; :func:`~pymc_bigdata.kernels.hmcecs.block_poisson_settings`).

Its collaborators: the per-draw estimates (:mod:`.hmcecs_estimates`), the settings checks
(:mod:`.hmcecs_settings`), the choice of the Taylor space, ``m``, ``lambda``, ``a`` and of the
anchor to move to (:mod:`.hmcecs_subsample`, from the measurements of :mod:`.hmcecs_tuning`),
and the per-draw statistics (:mod:`.hmcecs_stats`).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, ClassVar

import numpy as np
from pymc.stats.convergence import SamplerWarning, WarningType

from pymc_bigdata.errors import FullDataWarning
from pymc_bigdata.kernels.hmcecs import (
    VARIANCE_WALL,
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
)
from pymc_bigdata.step_methods.hmcecs_settings import (
    TAYLOR_SPACES,
    check_layer_settings,
    check_settings,
)
from pymc_bigdata.step_methods.hmcecs_stats import HMCECS_STATS, draw_stats
from pymc_bigdata.step_methods.hmcecs_subsample import SubsampleSettings, SubsampleTuner
from pymc_bigdata.step_methods.hmcecs_tuning import SubsampleTuning
from pymc_bigdata.step_methods.progress import ProgressField
from pymc_bigdata.step_methods.step_size import DualAveragingStepSize

__all__ = ["HMCECS"]

#: most leapfrog steps per iteration (a trajectory shorter than asked for beyond it)
MAX_LEAPFROG = 200


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
        drawn with replacement; where tuning chose that, a
        :class:`~pymc_bigdata.FullDataWarning` says so at each chain's first kept draw.
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
        draws; for the perturbed one, the parameters, or the inputs where the step samples
        group effects re-centred (``AUTO_SPACE_ESTIMATORS``, ``RECENTRED_SPACE``).  The stat
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
    #: sigma_hat^2, the variance of the log-likelihood estimate
    progress_field = ProgressField("loglik_var", "Loglik var", "0.3g")
    off_target_remedy = (
        "Raise subsample_size (or lower loglik_var_target), use more tuning draws, or check "
        "the model"
    )
    divergence_remedy = "lower step_size"
    accept_step = True
    watches_stability = False
    reads_oracle = False
    maps_in_compiled_code = True
    max_inner_steps = MAX_LEAPFROG
    default_step_size: ClassVar[float] = 0.25
    default_blocks: ClassVar[int] = 100
    default_minibatch: ClassVar[int] = 30
    #: Dang et al. (2019) as their Sec. 6.3 tunes it, with none of our extensions: Taylor
    #: control variates in the parameters (4.4), the expansion point and the full mass
    #: matrix kept from the start (ours: the MAP and its full-data Laplace fit; theirs: a
    #: posterior mean from HMC on 1 % of the rows and the inverse Hessian), only the step
    #: size adapted (dual averaging to 0.8 at eps L = 1.2), no census rows, the model's own
    #: coordinates. G = 100 blocks, the signed estimator's m = 30, and ``m`` or ``lambda``
    #: tuned to ``sigma^2 ~ 1`` are the defaults already. Give ``estimator`` as usual.
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        "taylor_space": "parameters",
        "preconditioner": "dense",
        "census": False,
        "reparameterize": False,
        "adapt": "step_size",
    }

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list | None]]] = {
        **SubsamplingStep.stats_dtypes_shapes,
        **HMCECS_STATS,
    }

    taylor_spaces: ClassVar[tuple[str, ...]] = TAYLOR_SPACES  # ``taylor_space``'s choices

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
        self._given_lower_bound = None if lower_bound is None else float(lower_bound)
        self.refreshed_products = counts.refreshed_products
        self.trajectory_length = float(trajectory_length)
        self.target_accept = float(target_accept)
        self.loglik_var_target = float(loglik_var_target)
        self.sign_tolerance = float(sign_tolerance)
        cv = {None: True, 0: "first", 1: "first", 2: "second"}[taylor_order]
        kwargs.setdefault("control_variates", cv)
        if kwargs["control_variates"] in (False, "none"):
            raise ValueError(
                "HMCECS needs control variates: its estimator is the Taylor proxy plus a "
                "subsampled correction (paper Eq. 4). Leave control_variates out and choose "
                "taylor_order 0, 1 or 2."
            )
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
        check_layer_settings(self._given_counts, self._given_order, self._given_space, self.layer)

    def _prepare(self) -> None:
        """The Taylor order (2 where the anchor has the full-data Hessian), the pool of
        subsampled rows (all but the census stratum, which every estimate includes) and the
        subsample tuning (:mod:`.hmcecs_subsample`)."""
        given, n_rows = self._given_order, self.layer.n_rows
        self.taylor_order = given if given is not None else (2 if self._has_curvature() else 1)
        self.cv_order = self.taylor_order
        self._pool_rows = np.setdiff1d(np.arange(n_rows), self.census) if len(self.census) else None
        self.minibatch = self._given_counts.minibatch or min(self.default_minibatch, n_rows)
        self._tuner = SubsampleTuner(
            self.layer,
            pool_rows=self._pool_rows,
            pool=self._pool_size(),
            estimator=self.estimator,
            given=self._given_counts,
            given_space=self._given_space,
            given_lower_bound=self._given_lower_bound,
            taylor_order=self.taylor_order,
            minibatch=self.minibatch,
            loglik_var_target=self.loglik_var_target,
            sign_tolerance=self.sign_tolerance,
        )

    def _has_curvature(self) -> bool:
        return self.anchor is not None and self.anchor.loglik_hessian is not None

    def _reset_chain_state(self) -> None:
        super()._reset_chain_state()
        self._subsample: Subsample | None = None
        self._evaluation: Evaluation | None = None
        self._info: HMCECSInfo | None = None
        self._notice: SamplerWarning | None = None  # for this draw's "warning" stat
        self._tuner.restart(self.anchor)
        self.taylor_space, self.subsample_size, self.products, self.lower_bound = self._tuner.start
        self.inner_steps = self._n_steps()

    def _reset_kernel_state(self) -> None:
        """Keep the subsample (redrawing it outside the MH update would bias ``u``'s law);
        re-evaluate at the next draw (the coordinates or the anchor may have changed)."""
        self._evaluation = None
        self._exact_evaluation: ExactCache = None

    @property
    def blocks(self) -> int:
        return self._given_counts.blocks or min(self.default_blocks, self.subsample_size)

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

    def _estimator_settings(self) -> EstimatorSettings:
        """The estimator's settings now (:mod:`.hmcecs_estimates`)."""
        return EstimatorSettings(
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

    def _estimates(self) -> SubsampleEstimates:
        """This draw's estimates (:mod:`.hmcecs_estimates`) under the current settings."""
        settings, cache = self._estimator_settings(), self._exact_evaluation
        return SubsampleEstimates(
            self.layer,
            self.minibatches,
            self._pool_rows,
            self.precond,
            self.anchor,
            settings,
            cache,
        )

    # ------------------------------------------------------------------ one draw
    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle | None
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        """One Algorithm 1 iteration on its own estimates (:mod:`.hmcecs_estimates`), not the
        oracle."""
        if self.tune and not self._tuner.piloted:
            theta0 = self.precond.theta(z0)
            self._apply(self._tuner.pilot(theta0, self._settings(), self.anchor, self.rng))
        if not self.tune and self._draw_index == self._chain_tune:  # the first kept draw
            self._warn_if_full_data()
        estimates = self._estimates()
        if self._subsample is None:
            self._subsample = estimates.fresh(self.rng)
            self._evaluation = None
        if self._evaluation is None:
            self._evaluation = estimates.evaluate(z0, self._subsample)
        state = HMCECSState(z0, self._subsample, self._evaluation)
        wall = VARIANCE_WALL if self.estimator == "perturbed" else math.inf
        new_state, info = hmcecs_step(
            state,
            estimates.evaluate,
            estimates.propose,
            self.step_size,
            self.inner_steps,
            self.rng,
            variance_wall=wall,
        )
        self._exact_evaluation = estimates.exact_cache
        self._info = info
        self._subsample, self._evaluation = new_state.subsample, new_state.evaluation
        if self.tune and self.adapt:
            self._tune_step(info)
            self._retune(new_state.position, new_state.evaluation)
        evaluation = new_state.evaluation
        record = DrawRecord(
            estimates.rows_read, new_state.position, evaluation.grad, evaluation.logp
        )
        return new_state.position, not info.diverging, record

    def _warn_if_full_data(self) -> None:
        """A :class:`~pymc_bigdata.FullDataWarning` where tuning chose an ``m`` that reaches
        every subsampled row (not where the user gave it): the chain is full-data HMC."""
        if self.exact and self._given_counts.subsample_size is None:
            few_rows = self._pool_size() <= self._tuner.min_subsample
            message = full_data_message(
                self.layer.n_rows, self.subsample_size, few_rows, self.loglik_var_target
            )
            warnings.warn(message, FullDataWarning, stacklevel=2)
            self._notice = SamplerWarning(WarningType.BAD_PARAMS, message, "warn")

    def _tune_step(self, info: HMCECSInfo) -> None:
        if self._fixed_step:
            return
        accept = 0.0 if info.diverging else info.accept_prob
        self.step_size = self._step_policy.update(accept)
        self.inner_steps = self._n_steps()

    # ------------------------------------------------------------------ tuning m, lambda, a
    def _retune(self, z: np.ndarray, evaluation: Evaluation) -> None:
        """A tuning draw's measurements for the automatic ``m`` (or ``lambda``, ``a``) and
        the Taylor space, re-chosen on the schedule (:mod:`.hmcecs_subsample`)."""
        last = self._adaptation.windows.terminal_start or self._chain_tune
        theta, index = self.precond.theta(z), self._draw_index + 1
        current = self._settings()
        self._apply(
            self._tuner.after_draw(theta, evaluation, current, index, last, self.anchor, self.rng)
        )

    def _settings(self) -> SubsampleSettings:
        """The tuned settings now."""
        return SubsampleSettings(
            self.taylor_space, self.subsample_size, self.products, self.lower_bound
        )

    def _apply(self, chosen: SubsampleSettings) -> None:
        """Use the tuning's settings: a new space re-evaluates the estimate, a new ``m``,
        ``lambda`` or ``a`` redraws the subsample."""
        if chosen.taylor_space != self.taylor_space:
            self._evaluation = None
        if chosen[1:] != (self.subsample_size, self.products, self.lower_bound):
            self._subsample = self._evaluation = None
        self.taylor_space, self.subsample_size, self.products, self.lower_bound = chosen

    # ------------------------------------------------------------------ base hooks
    def _adapt(self, theta: np.ndarray, virial: float) -> bool:
        """The base's windows (a new preconditioner restarts dual averaging there); then, at
        a window's end where the control variates are poor, the anchor and its curvature move
        to the window's mean (:meth:`~.hmcecs_subsample.SubsampleTuner.window_ended`); signed,
        only where a later tuning draw re-chooses ``lambda`` and ``a`` for it. A moved anchor
        restarts the measurements for ``m`` (the residuals changed)."""
        if self._adaptation.windows.collecting(self._draw_index):
            self._tuner.window_draw(theta)
        ended = super()._adapt(theta, virial)
        # signed: lambda, a measured at the old anchor do not fit a new one (a = mu - lambda)
        may_move = self.estimator != "signed" or self._retune_ahead()
        anchor = self._tuner.window_ended(may_move=may_move) if ended else None
        if anchor is not None:
            self.anchor, self._evaluation = anchor, None
        self._tuner.watch_anchor(self.anchor)
        return ended

    def _retune_ahead(self) -> bool:
        """Whether tuning re-chooses ``m`` (or ``lambda``, ``a``) after this draw."""
        last = self._adaptation.windows.terminal_start or self._chain_tune
        return any(SubsampleTuning.due(j, last) for j in range(self._draw_index + 1, last + 1))

    def _make_step_policy(self) -> DualAveragingStepSize:
        """Dual averaging (Sec. 6.3) at a fixed trajectory length: it sets the step at each
        tuning draw (``_tune_step``), and its averaged value when tuning stops."""
        return DualAveragingStepSize(
            target=self.target_accept, step_size=self.step_size, fixed_step=self._fixed_step
        )

    def _extra_stats(self) -> dict[str, Any]:
        """This draw's own statistics (:func:`~.hmcecs_stats.draw_stats`)."""
        settings = self._estimator_settings()
        stats = draw_stats(
            self._info, self._evaluation, settings, self.inner_steps, self._wanted_steps()
        )
        if self._notice is not None:  # PyMC logs it, from every process (cores > 1)
            stats["warning"], self._notice = self._notice, None
        return stats

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


def full_data_message(n_rows: int, subsample_size: int, few_rows: bool, target: float) -> str:
    """What a :class:`~pymc_bigdata.FullDataWarning` says: HMC-ECS's tuning chose ``m`` =
    every row, because the data hold no more rows than its smallest subsample
    (``few_rows``) or because only every row holds ``sigma_hat^2`` at ``target``."""
    if few_rows:
        why = f"its {n_rows:,} rows are no more than its smallest subsample"
        advice = "At this size PyMC's NUTS (pm.sample() with no step) is the usual choice."
    else:
        why = (
            "to hold the log-likelihood estimator's variance at loglik_var_target "
            f"{target:g}, tuning needed every row outside the census"
        )
        advice = (
            "The control variates fit this posterior poorly; a sampler whose noise is not "
            "held so (SGHMC, SGLD) may read fewer rows, or give subsample_size for a "
            "subsample (a larger sigma_hat^2: a perturbed target)."
        )
    return (
        f"HMCECS: {why} (m = {subsample_size:,}): this chain is full-data HMC, exact but "
        f"reading all {n_rows:,} rows at every leapfrog step. {advice}"
    )
