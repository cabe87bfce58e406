"""Base class of the subsampling step methods: the PyMC plumbing every sampler shares.

A subclass fills :meth:`SubsamplingStep._transitions` (run the kernel for one recorded draw),
states its defaults and, on the default noise-limited step size, its noise model
``noise_share(step_size, noise_var)`` (or declares another policy); the base does the rest:

* ravels points, draws minibatches and maps between the model's coordinates ``theta`` and the
  kernels' preconditioned coordinates ``z`` (``theta = c + L z``);
* the gradient oracle: first- or second-order control variates around an anchor;
* tuning (:mod:`pymc_bigdata.adaptation`): each chain starts from a draw of the Laplace fit,
  re-estimates ``L`` from its own draws and re-centres the anchor in windows, measures the
  gradient noise and sets the step size from it; everything is frozen at ``stop_tuning``;
* the fallback when the MAP is not a usable mode;
* divergences (non-finite values, a log-density estimate that falls by more than
  ``LOGP_DROP_DIVERGENCE``) and the end-of-chain bias alarms (:mod:`.diagnostics`);
* the common statistics.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import numpy as np
import pymc as pm
from pymc.blocking import DictToArrayBijection, RaveledVars
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence

from pymc_bigdata.adaptation import (
    NOISE_SHARE_BOUND,
    NOISE_SHIFT_BOUND,
    residual_scale_shift_bound,
)
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.alarms import ChainAlarm
from pymc_bigdata.step_methods.chain_report import COMMON_STATS, common_stats
from pymc_bigdata.step_methods.chain_state import new_chain_state
from pymc_bigdata.step_methods.coordinates import check_reparameterize, sampling_layer
from pymc_bigdata.step_methods.gradient_oracle import (
    DrawRecord,
    GradientOracle,
    MinibatchEstimator,
)
from pymc_bigdata.step_methods.held import Configuration, HeldConfigurations
from pymc_bigdata.step_methods.local_batch import LocalBatch, check_local_batch
from pymc_bigdata.step_methods.low_rank import low_rank_corrected
from pymc_bigdata.step_methods.minibatches import MEASURE_ROWS, Minibatches
from pymc_bigdata.step_methods.noise import measured_variance
from pymc_bigdata.step_methods.preconditioner import Preconditioner
from pymc_bigdata.step_methods.progress import ProgressColumns
from pymc_bigdata.step_methods.settings import (
    EXTENSIONS_OFF,
    check_adapt,
    check_data_current,
    check_shared_settings,
    step_layer,
)
from pymc_bigdata.step_methods.start import anchor_and_census, chain_start, starting_fit
from pymc_bigdata.step_methods.step_size import NoiseLimitedStepSize, require_noise_model

__all__ = ["Preconditioner", "SubsamplingStep"]


#: after tuning, the gradient noise is measured on one transition every this many draws
MEASURE_EVERY = 10

#: most transitions per draw the automatic rule may choose (noise-limited step sizes)
MAX_INNER_STEPS = 100


class SubsamplingStep(ProgressColumns, ArrayStepShared):
    """Shared machinery of the minibatch step methods (see the module docstring).

    Parameters
    ----------
    vars
        Value variables to sample: all free variables (default), or the continuous ones, the
        discrete ones held by another step of a compound step (:mod:`.held`).
    model
        PyMC model (default: the one in context).
    batch_size
        Rows per minibatch ``n`` (``1 <= n <= N``); default ``min(1000, N)``.
    step_size, inner_steps
        Step size in the preconditioned coordinates and transitions per recorded draw, kept
        fixed; default: tuned (:mod:`.step_size`), the transitions from the step size.
    preconditioner
        ``"auto"`` (dense up to 200 parameters, diagonal beyond), ``"dense"``, ``"diag"`` or
        ``"identity"``; from the Laplace fit, then from the chain's draws in tuning.
    low_rank
        Correct a diagonal preconditioner along the ``low_rank`` flattest and as many
        stiffest directions of the posterior (:mod:`.low_rank`); ``"auto"`` (default): 2
        where the preconditioner is diagonal (beyond 200 parameters) and mapped in Python,
        without held variables; 0: none.
    control_variates
        ``True``/``"auto"`` (default: second order where tuning finds that it lowers the
        noise enough, else first), ``"first"``, ``"second"`` (the dense Hessian, d <= 2000)
        or ``False`` (plain minibatch sums); see :mod:`.gradient_oracle`.
    adapt
        Adapt the preconditioner, the anchor and the step size in tuning (default True);
        ``"step_size"``: the step size only (the Laplace fit's preconditioner and anchor are
        kept, as in the HMC-ECS paper); False: nothing.
    noise_bound
        Largest share of the stationary variance the gradient noise may feed (0.05), in the
        noisiest coordinate.
    noise_shift_bound
        Largest shift of the draws' log density, in its posterior sds, that the gradient
        noise (and the kernel's own variance inflation, SGLD's) may cause over all
        coordinates together; ``"auto"``: the sampler's ``default_noise_shift_bound`` (0.5);
        it binds above about 200 parameters (SGLD: 50, and at most ``0.1 sqrt(N / d)``; see
        :mod:`pymc_bigdata.adaptation`). None: the per-coordinate ``noise_bound`` alone.
    census
        Include the rows whose gradients move far more than the others' in every minibatch
        with weight 1 (:func:`~.start.census_rows`; stratified, unbiased).
    replace, reshuffle, window_gathers
        Draw rows with replacement (default: without); without, walk through random
        permutations (``reshuffle=True``, the default) or draw independent minibatches, as
        windows of a shuffled copy where the rows allow (``window_gathers=True``, default;
        :mod:`pymc_bigdata.row_windows`; ``False``: uniform rows, the papers' index law).
    local_batch
        Size each draw's minibatches after tuning from the noise measured where the last
        draw ended (:mod:`.local_batch`; default False; SGHMC, SGLD and EWSG).
    layer
        A :class:`~pymc_bigdata.MinibatchModel` to reuse (its compiled functions and MAP).
        Default: the one an earlier step (or ``score_check``, or the LOO tools) built on the
        model, ``vars`` and mode, where the model's variables and data are unchanged, else a
        new one (:mod:`~pymc_bigdata.model.layer_cache`; ``pmbd.clear_layer_cache()`` drops
        them).
    reparameterize
        ``"auto"``/``True`` (default: ``"centre"``), ``"centre"`` or ``"whiten"``: sample a
        hierarchical model's group effects in coordinates that follow what the rows say about
        each group (:mod:`.coordinates`); ``False``: the model's own coordinates.
    rng
        Seed or generator; ``pm.sample`` replaces it per chain through ``setup_chain``.
    """

    name: ClassVar[str] = "subsampling"
    default_blocked = True
    #: whether the kernel ends each transition with its own accept test (HMC-ECS, Austerity):
    #: then a divergence or a blow-up never undoes the kernel's move (see ``astep``)
    accept_step: ClassVar[bool] = False
    #: whether tuning halves the step size after divergences and hot blocks
    #: (:class:`~.stability.StabilityWatch`); False where an accept test or nothing to lower
    watches_stability: ClassVar[bool] = True
    #: whether ``_transitions`` calls the gradient oracle (False: the sampler evaluates its
    #: own estimates, HMC-ECS, SBPS and Austerity, and gets None instead of an oracle)
    reads_oracle: ClassVar[bool] = True
    #: whether compiled code maps the coordinates (dense or diagonal only: no ``low_rank``)
    maps_in_compiled_code: ClassVar[bool] = False
    #: most transitions per draw the automatic rule may choose
    max_inner_steps: ClassVar[int] = MAX_INNER_STEPS
    #: step size in z coordinates for unit curvature, and transitions per draw
    default_step_size: ClassVar[float] = 0.1
    default_inner_steps: ClassVar[int] = 10

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list | None]]] = dict(COMMON_STATS)

    def __init_subclass__(cls, **kwargs):
        """Refuse a sampler on the default (noise-limited) step size without a noise model
        (:func:`~.step_size.require_noise_model`)."""
        super().__init_subclass__(**kwargs)
        require_noise_model(cls, cls._make_step_policy is SubsamplingStep._make_step_policy)

    def __init__(
        self,
        vars=None,
        *,
        model=None,
        batch_size: int | None = None,
        step_size: float | None = None,
        inner_steps: int | None = None,
        preconditioner: str = "auto",
        control_variates: bool | str = True,
        adapt: bool | str = True,
        noise_bound: float = NOISE_SHARE_BOUND,
        noise_shift_bound: float | str | None = "auto",
        census: bool = True,
        replace: bool = False,
        reshuffle: bool | None = None,
        window_gathers: bool = True,
        layer: MinibatchModel | None = None,
        rng=None,
        blocked: bool = True,
        initial_point=None,
        compile_kwargs: dict | None = None,
        mode=None,
        reparameterize: bool | str = "auto",
        low_rank: int | str = "auto",
        local_batch: bool = False,
    ):
        local_batch = check_local_batch(local_batch, type(self).__name__, self.reads_oracle)
        self.layer = step_layer(model, vars, layer, mode, compile_kwargs)
        settings = check_shared_settings(
            self.layer,
            batch_size=batch_size,
            default_batch_size=self.default_batch_size(self.layer.n_rows),
            step_size=step_size,
            inner_steps=inner_steps,
            preconditioner=preconditioner,
            control_variates=control_variates,
            noise_bound=noise_bound,
            noise_shift_bound=_shift_bound(self, noise_shift_bound),
            low_rank=low_rank,
            compiled_maps=self.maps_in_compiled_code,
        )
        self.preconditioner_kind, self.cv_mode = settings.preconditioner_kind, settings.cv_mode
        self.noise_bound, self._fixed_batch = settings.noise_bound, settings.fixed_batch
        self.noise_shift_bound, self.low_rank = settings.noise_shift_bound, settings.low_rank
        adapt = check_adapt(adapt)
        self.adapt, self.replace = adapt is not False, bool(replace)
        #: whether the tuning windows re-estimate the preconditioner and move the anchor
        self.adapt_geometry = adapt is True
        self.reshuffle = self._check_reshuffle(reshuffle)
        self._fixed_step = settings.step_size is not None
        self._fixed_inner = settings.inner_steps is not None
        self._check_layer_settings()
        self.layer = sampling_layer(self.layer, check_reparameterize(reparameterize))
        config, census = anchor_and_census(
            self.layer, self._fit_configuration(None, centre=False), census, settings.batch_size
        )
        self._use(config)
        self.step_size = settings.step_size or self.default_step()
        self.inner_steps = settings.inner_steps or min(self.default_inner(), self.max_inner_steps)
        super().__init__(self.layer.value_vars, {}, blocked=blocked, rng=rng)
        self.tune, batch = True, settings.batch_size
        self.census = census  #: indices of the census stratum's rows (every estimate reads them)
        draws = {"replace": self.replace, "reshuffle": self.reshuffle, "windows": window_gathers}
        self.minibatches = Minibatches(self.layer, batch, census, self.rng, **draws)
        self.minibatches.measure_at_least(self.measure_rows)
        self._local_batch = LocalBatch.of(self) if local_batch else None
        if local_batch:
            self.measure_every = 1  # every draw measures where it ends
        self._prepare()  # the second phase: the sampler's own set-up, on the fit and the rows
        self._initial = (self.precond, self.anchor, self.cv_order, self.step_size, self.inner_steps)
        self._initial_laplace = self.laplace
        own = Configuration(self.laplace, self.anchor, self.cv_order, self.map_problem)
        self.held_configurations = HeldConfigurations(self.layer.held_key, own)
        self._chain_tune, self._chain_draws = 0, 0
        self._reset_chain_state()  # every hook it calls now finds its sampler set up

    # ------------------------------------------------------------------ set-up, in two phases
    def _check_layer_settings(self) -> None:
        """Check the sampler's settings that need the layer (N, d), before the MAP search."""

    def _prepare(self) -> None:
        """``__init__``'s second phase: set-up on the fit, census and rows (no chain yet)."""

    def _fit_configuration(self, start: np.ndarray | None, centre: bool) -> Configuration:
        """The MAP fit from ``start`` (:mod:`.start`; ``centre``: anchor at its centre)."""
        kind, name = self.preconditioner_kind, type(self).__name__
        return starting_fit(self.layer, start, kind, name, self.cv_mode, centre)

    def _use(self, config: Configuration) -> None:
        """Stand on a configuration's fit: the preconditioner is its Laplace fit."""
        self.laplace, self.anchor, self.cv_order, self.map_problem = config
        self.precond = low_rank_corrected(self.laplace, self.layer, self.low_rank)[0]
        self._second_order_available = config.has_curvature and self.cv_mode != "first"
        self.order_choice = config.has_curvature and self.cv_mode == "auto"

    # ------------------------------------------------------------------ held variables
    def step(self, point):
        """PyMC's step; first the held variables' values from ``point`` (:mod:`.held`)."""
        if self.layer.held_vars and self.held_configurations.hold(self.layer, point):
            fit = partial(self._fit_configuration, self._last_theta, True)  # a MAP search there
            self._use(self.held_configurations.switch(self.layer.held_key, fit))
            self._last_output = None  # astep restarts the kernel in the new coordinates
            self._divergence.restart()  # another target: its level is not comparable
            self._reset_kernel_state()
        return step_own_vars(self, point)

    @property
    def batch_size(self) -> int:
        """Rows per minibatch now (tuning may grow it from the default)."""
        return self.minibatches.size

    # ------------------------------------------------------------------ defaults and checks
    def default_batch_size(self, n_rows: int) -> int:
        """Rows per minibatch when ``batch_size`` is not given: ``min(1000, N)``."""
        return min(1000, n_rows)

    def default_step(self) -> float:
        """Default step size from the curvature in z (see the sampler's docs)."""
        return self.default_step_size / self.precond.curvature_range[1]

    def default_inner(self) -> int:
        """Default transitions per draw (see the sampler's docs)."""
        return self.default_inner_steps

    def _check_reshuffle(self, reshuffle: bool | None) -> bool:
        """Subclasses that assume independent minibatches override this."""
        return True if reshuffle is None else bool(reshuffle)

    @staticmethod
    def competence(var, has_grad):
        """Compatible with continuous variables: never chosen over NUTS unless preferred."""
        ok = has_grad and var.dtype not in pm.discrete_types
        return Competence.COMPATIBLE if ok else Competence.INCOMPATIBLE

    # ------------------------------------------------------------------ chain lifecycle
    def setup_chain(self, rng, tune: int, draws: int) -> None:
        """Per-chain generator and fresh chain state (sequential and parallel paths)."""
        super().setup_chain(rng, tune, draws)
        check_data_current(self.layer)
        self.minibatches.reset(self.rng)
        self._chain_tune, self._chain_draws = int(tune), int(draws)
        self._reset_chain_state()

    def reset_tuning(self) -> None:
        """Forget tuning state (PyMC calls this before each chain in the sequential path)."""
        self._reset_chain_state()

    def stop_tuning(self) -> None:
        if self.tune and self.adapt:
            self._adaptation.choose_step_size(final=True)
        self.tune = False

    def _reset_chain_state(self) -> None:
        """A new chain: the initial settings and fit, fresh collaborators (:mod:`.chain_state`)
        and no last draw; samplers with per-chain state of their own extend it."""
        self.tune, self._draw_index = True, 0
        self.minibatches.restore_default()
        self.precond, self.anchor, self.cv_order, self.step_size, self.inner_steps = self._initial
        self.laplace = self._initial_laplace
        if self.layer.held_vars:
            self.map_problem = self.held_configurations.restart().map_problem
        self._last_theta = self._last_output = self._last_z = None  # theta, model's, z
        tune, fixed = self._chain_tune if self.adapt else 0, (self._fixed_step, self._fixed_inner)
        chain = new_chain_state(self, tune=tune, draws=self._chain_draws, fixed=fixed)
        self._noise, self._divergence, self._report, self._step_policy, self._adaptation = chain
        if self._local_batch is not None:
            self._local_batch.restart()
        self._reset_kernel_state()

    def _reset_kernel_state(self) -> None:
        """Subclasses reset their per-chain kernel state (momentum...) here."""

    # ------------------------------------------------------------------ gradient oracle
    #: how the gradient noise is measured, "split" (two half minibatches) or "fisher"
    #: (per-row gradients, the empirical Fisher of Ahn et al. 2012; first order only)
    noise_measurement: str = "split"
    #: after tuning, measure the noise on one transition every this many draws
    measure_every: int = MEASURE_EVERY
    #: a measuring transition reads at least this many rows (whole minibatches; see minibatches)
    measure_rows: int = MEASURE_ROWS

    def _estimator(self) -> MinibatchEstimator:
        """Minibatch gradient estimates under the current settings (anchor, order, weights)."""
        return self.minibatches.estimator(
            self.precond,
            self.anchor,
            self.cv_order,
            second_order=self._second_order_available,
            noise_measurement=self.noise_measurement,
        )

    def _noise_variance(self, order: int) -> np.ndarray:
        """Variance of the current batch's gradient estimate per coordinate (z units):
        ``N^2 s^2 (1/n - 1/N)`` without replacement, ``N^2 s^2 / n`` with."""
        return self._noise.variance(order) * self.minibatches.batch_factor(self.batch_size)

    def _pool_size(self) -> int:
        """Rows subsampled (all but the census)."""
        return self.minibatches.pool_size

    # ------------------------------------------------------------------ PyMC step
    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        if self._draw_index == 0:
            self._reset_kernel_state()
            at_fit = self._chain_tune > 0 and self.map_problem is None  # else the initial point
            theta0 = self.layer.from_model(q0.data)
            z0 = chain_start(self.precond, self.laplace, theta0, self.rng, at_fit)
        elif self._last_output is not None and np.array_equal(q0.data, self._last_output):
            z0 = self._last_z
        else:  # moved by another step or by the user: restart the kernel there
            z0 = self.precond.z(self.layer.from_model(q0.data))
            self._reset_kernel_state()
        measure = self.tune or self._draw_index % self.measure_every == 0  # last call measures
        with np.errstate(all="ignore"):
            oracle = None
            if self.reads_oracle:
                oracle = GradientOracle(self._estimator(), self.minibatches, measure)
            z, finite, record = self._transitions(z0, oracle)
        temperature = self._kinetic_temperature()
        draw = self._divergence.judge(z0, z, finite, record, temperature, early=self.cv_order > 0)
        z, _, virial, diverging = draw
        rows_read = record.rows_read
        if diverging:
            rows_read += _on_divergence(self, z0, blew_up=finite)
        else:
            self._noise.keep(record.noise)
        theta = self.precond.theta(z)
        output = self.layer.to_model(theta)  # the model's coordinates
        noise_var = self._noise_variance(self.cv_order)
        measured = None if diverging else measured_variance(record.noise, self.cv_order)
        stats = common_stats(self, draw, rows_read, noise_var, self._step_policy, measured)
        stats.update(self._extra_stats())
        if self.tune:  # the policy watches tuning's draws, the chain's report the others
            self._step_policy.observe(stats)
        else:
            self._report.observe(stats, self._kinetic_temperature(), output, record.noise)
        self._draw_index += 1
        if self.tune and self.adapt:
            self._adaptation.watch(diverging, self._kinetic_temperature(), virial)
            if not diverging:
                self._adapt(theta, virial)
                z = self.precond.z(theta)  # the coordinates may have changed
        self._last_theta, self._last_z = theta, z
        self._last_output = output
        if self._local_batch is not None and not self.tune:
            self._local_batch.after_draw(measured)
        if not self.tune and self._draw_index == self._chain_tune + self._chain_draws:
            stats["warning"] = self._report.end_of_chain() or stats["warning"]  # draws=1
        return RaveledVars(output, q0.point_map_info), [stats]

    # ------------------------------------------------------------------ sampler's declarations
    #: what the end-of-chain alarm says an off-target chain's draws likely are
    off_target_consequence: ClassVar[str] = "Its draws are likely too dispersed."
    #: what the end-of-chain bias warning tells the user to change (its own settings)
    off_target_remedy: ClassVar[str] = (
        "Raise batch_size, lower step_size, use more tuning draws, or check the model"
    )
    #: what the divergence warning tells the user to change if divergences repeat
    divergence_remedy: ClassVar[str] = "lower step_size or raise batch_size"

    def _make_alarms(self) -> list[ChainAlarm]:
        """The sampler's own end-of-chain alarms (:mod:`.alarms`), besides the monitor."""
        return []

    #: every extension of the base switched off (:data:`.settings.EXTENSIONS_OFF`)
    EXTENSIONS_OFF: ClassVar[dict[str, Any]] = EXTENSIONS_OFF

    #: the log-density shift bound used when none is given (``noise_shift_bound="auto"``)
    default_noise_shift_bound: ClassVar[float] = NOISE_SHIFT_BOUND
    #: whether the variance inflation the bound allows is realised in full (SGLD), so that
    #: ``"auto"`` also keeps a residual scale within 0.1 sd (:func:`_shift_bound`)
    realises_inflation: ClassVar[bool] = False

    #: the kernel's own inflation of every coordinate's variance at a step size (None: none,
    #: e.g. BAOAB on a Gaussian); counted with the noise in the mean-share bound
    own_share: ClassVar[Callable[[float], float] | None] = None

    def _make_step_policy(self) -> NoiseLimitedStepSize:
        """The step-size policy this sampler declares (:mod:`.step_size`): by default
        noise-limited, with the sampler's ``noise_share`` as its noise model."""
        return _noise_limited_policy(self)

    def _kinetic_temperature(self) -> float:
        """``2 K / d`` of a momentum-carrying kernel (NaN for the others)."""
        return math.nan

    def _adapt(self, theta: np.ndarray, virial: float) -> bool:
        """A kept tuning draw for :mod:`.chain_adaptation`; whether a tuning window ended."""
        return self._adaptation.collect(self._draw_index, theta, virial)

    @abstractmethod
    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle | None
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        """Run ``inner_steps`` kernel transitions from ``z0`` (gradient kernels call
        ``oracle``, and ``oracle.last`` on their last transition); return (z, all finite,
        what the draw's evaluations did)."""

    def _extra_stats(self) -> dict[str, Any]:
        return {}


def _on_divergence(step: SubsamplingStep, z0: np.ndarray, blew_up: bool) -> int:
    """A diverging draw of ``step`` (after tuning, one warning per chain). With an accept
    step the kernel's state is the chain's (``accept_step``); else the kernel restarts at
    ``z0`` and measures there where the base is a single estimate (a lucky one made every
    later draw a drop: EWSG on crossed ratings locked so), the estimate replacing it, and the
    noise if tuning has not measured it yet. Returns the rows read here."""
    rows_read = 0
    if not step.accept_step:
        step._reset_kernel_state()
        unmeasured = step.tune and step.adapt and not step._noise.measured()
        if unmeasured or step._divergence.base_unsettled():
            oracle = GradientOracle(step._estimator(), step.minibatches, True)
            record = oracle.measure_at(z0)
            if unmeasured:
                step._noise.keep(record.noise)
            step._divergence.restart()  # the single estimate is replaced
            step._divergence.set_base(record.log_density)
            rows_read = record.rows_read
    if not step.tune:
        step._report.divergence(step._divergence.message(blew_up))
    return rows_read


def step_own_vars(step: ArrayStepShared, point: dict) -> tuple[dict, list]:
    """``step.astep`` on the step's own variables of ``point`` (a compound step's point holds
    every free variable), the others passed through unchanged."""
    own = {name: point[name] for name in step.var_names}
    new, stats = step.astep(DictToArrayBijection.map(own))
    return DictToArrayBijection.rmap(new, start_point=point), stats


def _shift_bound(step: SubsamplingStep, given: float | str | None) -> float | None:
    """``noise_shift_bound`` as given, or for ``"auto"`` the sampler's default, at most
    :func:`~pymc_bigdata.adaptation.residual_scale_shift_bound` where the sampler realises
    the inflation in full (``realises_inflation``: few rows per parameter)."""
    if not (isinstance(given, str) and given == "auto"):
        return given
    if not step.realises_inflation:
        return step.default_noise_shift_bound
    layer = step.layer
    return min(step.default_noise_shift_bound, residual_scale_shift_bound(layer.n_rows, layer.dim))


def _noise_limited_policy(step: SubsamplingStep) -> NoiseLimitedStepSize:
    """The noise-limited step-size policy of ``step``'s settings and noise model
    (:meth:`SubsamplingStep._make_step_policy`)."""
    return NoiseLimitedStepSize(
        noise_share=step.noise_share,
        noise_bound=step.noise_bound,
        noise_shift_bound=step.noise_shift_bound,
        own_share=step.own_share,
        fixed_step=step._fixed_step,
        fixed_batch=step._fixed_batch,
        default_batch=step.minibatches.default_size,
        pool_size=step._pool_size(),
        replace=step.replace,
    )
