"""SBPS and pSBPS step methods (Pakman et al., 2017) on the shared subsampling base."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import xarray as xr
from pymc.logprob.utils import ParameterValueError

import pymc_bigdata.kernels.sbps as sbps_kernel
from pymc_bigdata.kernels.sbps import (
    Observation,
    SBPSSettings,
    SBPSState,
    sbps_advance,
    sbps_init,
)
from pymc_bigdata.step_methods.alarms import SBPSAlarm
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.gradient_oracle import DrawRecord, GradientOracle
from pymc_bigdata.step_methods.progress import ProgressField
from pymc_bigdata.step_methods.sbps_paths import PathFunctions, continuous_estimates
from pymc_bigdata.step_methods.sbps_tuning import DEFAULT_K, TravelTimeAndBand
from pymc_bigdata.step_methods.settings import check_independent_rows, check_positive

__all__ = ["SBPS", "pSBPS"]

#: default travel time per recorded draw: this many times ``sqrt(d / lambda_min)`` (the time a
#: unit-speed particle needs to cross the slowest direction of a Gaussian; with exact
#: gradients on unit Gaussians of d = 2..200 and the default refreshment, 2 gives a min bulk
#: ESS of 0.70-1.15 per draw for x and 0.26-0.46 for x^2: ``results/sbps_defaults.md``)
TRAVEL_FACTOR = 2.0

#: default refreshment rate: this many per ``sqrt(d / lambda_min)`` of travel.  Measured by
#: ``benchmarks/sbps_defaults.py`` (``results/sbps_defaults.md``): with exact gradients on unit
#: Gaussians 1 gives the better ESS of x^2 (0.41-0.60 per draw against 0.26-0.46 at 0.5);
#: minibatch noise randomises the velocity too, and on the N = 1e6, d = 30 logistic
#: benchmark factors 1 / 0.5 / 0.25 / 0 gave min bulk ESS 1,518 / 1,982 / 3,597 / 5,505 for
#: the coefficients, 1,023 / 685 / 332 / 46 for their squares, and worst sd ratios 0.926 /
#: 0.961 / 0.879 / 0.865: 0.5
REFRESH_FACTOR = 0.5

#: the slope prior the paper's settings start from, ``N(0, 1e5)``: the paper gives no start;
#: this is the authors' code's (github.com/dargilboa/SBPS-public, ``samplers.SBPS``)
PAPER_SLOPE_PRIOR = (0.0, 1e5)

#: the slope prior's updates (``slope_prior``): ours, then the paper's
SLOPE_PRIORS = ("em", "paper")

#: when pSBPS's metric learns (``metric_update``): at the bounces (ours), or from every
#: observation's minibatch (the authors' code)
METRIC_UPDATES = ("bounce", "minibatch")


class SBPS(SubsamplingStep):
    """Stochastic bouncy particle sampler as a PyMC step method.

    The particle moves in straight lines in the base's coordinates ``theta = c + L z`` (``L``
    the Laplace fit, then the tuning draws' covariance: the fixed-``A`` form of Eqs. 14-16) and
    bounces by thinning a Poisson process whose proposal rate is the upper band of a local
    regression of the observed directional derivatives (Eqs. 9-13; see
    :mod:`pymc_bigdata.kernels.sbps`).  Each proposal reads one minibatch in one forward pass
    (per-row directional derivatives, with the base's control variates); an accepted bounce
    also takes that minibatch's gradient.  Each recorded draw is the position after a fixed
    travel time (``travel_time``), continuing the same trajectory; per-draw stats hold the
    path's time averages over that travel, for the continuous-time estimates of Eq. 19
    (:meth:`continuous_estimates`).

    Parameters
    ----------
    k
        Band multiple of Eq. 13: larger is less biased (fewer bound violations) and reads
        more minibatches.  Default: 3 (the paper's), raised in tuning while more than 0.5 % of
        the proposals violate the band; a given value is kept.
    refresh_rate
        Velocity refreshments per unit travel (default ``0.5 / sqrt(d / lambda_min)``); 0
        turns them off, as in the paper.
    travel_time
        Travel between recorded draws (default ``2 sqrt(d / lambda_min)``, recomputed when
        tuning changes the preconditioner); a given value is kept.
    preconditioner
        The base's (``"auto"``, ``"dense"``, ``"diag"``, ``"identity"``), or ``"adaptive"``:
        pSBPS, the paper's diagonal metric of Eqs. 17-18 on the model's coordinates.
    metric_beta, metric_eps
        pSBPS's ``beta`` and ``eps`` (0.99 and 1e-4, the paper's).
    adapt_metric_after_tuning
        pSBPS: keep adapting the metric after tuning, as the paper does (default False: it
        is frozen with everything else at the end of tuning).
    misfit
        Widen the band by the regression's misfit (ours; False: the paper's Eq. 12).
    noise_memory
        Use at least the running mean of the observed noise variances in the band (ours;
        False: the last minibatch's, as in Eq. 12).
    prior_rate
        Step size of the slope prior's marginal-likelihood update after each bounce.
    slope_prior
        ``"em"`` (ours, default): the slope prior starts from the preconditioner's
        curvature range and its update is the EM form of the marginal likelihood's gradient,
        with the prior's sd at least 0.1 ``|mu|``; ``"paper"``: it starts at ``N(0, 1e5)``
        (the authors' code; the paper gives no start) and takes the paper's plain gradient
        step (Sec. 4), no floor (:func:`~pymc_bigdata.kernels.sbps_regression.prior_step`).
    check_after
        Ours: with no proposal within this many knot scales, observe ``G`` anyway (default
        4); None: no checks, as in the paper.
    metric_update
        pSBPS: ``"bounce"`` (default) learns the metric from the bounces' gradients only;
        ``"minibatch"`` from every observation's minibatch, as the authors' code does (a
        full minibatch gradient per proposal).
    batch_size
        Rows per proposal (default ``min(1000, N)``; at least 2 for Eq. 10's noise variance).
    control_variates
        ``True`` (default): the base's first-order control variates around its anchor;
        ``False``: the paper's plain minibatch estimate (Eq. 7).
    path_functions
        Test functions to average along the continuous trajectory (Eq. 19), by name: each
        maps an array of unconstrained parameter vectors, shape ``(m, d)`` in the order of
        :meth:`~pymc_bigdata.MinibatchModel.value_var_slices`, to an array of shape
        ``(m, ...)``.  Each draw then gets a stat ``path_<name>``: the time average of the
        function along the straight lines travelled since the previous draw, by
        ``quadrature_nodes``-point Gauss-Legendre quadrature on each line.
    quadrature_nodes
        Nodes per straight line for ``path_functions`` (default 16: exact for polynomials
        of degree 31 along a line; raise it for functions that oscillate within a line).

    Notes
    -----
    See :class:`~pymc_bigdata.step_methods.base.SubsamplingStep` for the shared parameters.
    Stats per draw: ``proposals``, ``bounces``, ``refreshes``, ``checks`` (observations made
    because no proposal came for long), ``violations`` (``[G]_+ > lambda``),
    ``expected_violations`` (the regression's prediction), ``missed_bounces`` (the bounces
    the violations cut off, in expectation: compare with ``bounces``), ``travel_time``,
    ``path_mean`` and ``path_sq_mean`` (time averages of the unconstrained parameters and of
    their squares over the draw's travel), besides the base's.
    """

    name = "sbps"
    #: the draw's bound violations
    progress_field = ProgressField("violations", "Violations", "d")
    #: Pakman et al. (2017) as Sec. 7.1 runs it, with none of our extensions: plain
    #: minibatch estimates (Eq. 7) of n = 100 independently drawn rows, the model's own
    #: coordinates, k = 3 (Eq. 13, not tuned), no refreshment, Eq. 12's band (no misfit
    #: widening, the last minibatch's noise), no checks, the paper's slope-prior update from
    #: ``N(0, 1e5)``, no census rows, no tuning. ``SBPS(**SBPS.PAPER_SETTINGS)``
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        **SubsamplingStep.EXTENSIONS_OFF,
        "batch_size": 100,
        "k": 3.0,
        "refresh_rate": 0.0,
        "misfit": False,
        "noise_memory": False,
        "check_after": None,
        "slope_prior": "paper",
    }
    watches_stability = False
    reads_oracle = False
    off_target_remedy = "Raise batch_size or k, use more tuning draws, or check the model"
    divergence_remedy = "raise batch_size or k"

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list | None]]] = {
        **SubsamplingStep.stats_dtypes_shapes,
        "proposals": (np.int64, []),
        "bounces": (np.int64, []),
        "refreshes": (np.int64, []),
        "checks": (np.int64, []),
        "violations": (np.int64, []),
        "expected_violations": (np.float64, []),
        "missed_bounces": (np.float64, []),
        "travel_time": (np.float64, []),
        "proposals_exhausted": (bool, []),
        "k": (np.float64, []),
    }

    def __init__(
        self,
        vars=None,
        *,
        k: float | None = None,
        refresh_rate: float | None = None,
        travel_time: float | None = None,
        preconditioner: str = "auto",
        metric_beta: float = 0.99,
        metric_eps: float = 1e-4,
        adapt_metric_after_tuning: bool = False,
        misfit: bool = True,
        noise_memory: bool = True,
        prior_rate: float = 0.05,
        slope_prior: str = "em",
        check_after: float | None = sbps_kernel.CHECK_AFTER,
        metric_update: str = "bounce",
        batch_size: int | None = None,
        control_variates: bool = True,
        path_functions: Mapping[str, Callable[[np.ndarray], np.ndarray]] | None = None,
        quadrature_nodes: int = 16,
        **kwargs,
    ):
        if k is not None:
            check_positive("k", k)
        if refresh_rate is not None:
            check_positive("refresh_rate", refresh_rate, allow_zero=True)
        if travel_time is not None:
            check_positive("travel_time", travel_time)
        if not (isinstance(metric_beta, int | float) and 0.0 <= metric_beta < 1.0):
            raise ValueError(f"metric_beta must be a number in [0, 1), got {metric_beta!r}.")
        check_positive("metric_eps", metric_eps)
        check_positive("prior_rate", prior_rate)
        if check_after is not None:
            check_positive("check_after", check_after)
        for name, value, allowed in (
            ("slope_prior", slope_prior, SLOPE_PRIORS),
            ("metric_update", metric_update, METRIC_UPDATES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
        if isinstance(batch_size, int) and not isinstance(batch_size, bool) and batch_size < 2:
            raise ValueError(
                f"batch_size must be at least 2 for SBPS (the noise variance of Eq. 10 is a "
                f"sample variance over the minibatch's rows), got {batch_size}."
            )
        if control_variates not in (True, False):
            raise ValueError(
                f"control_variates must be True or False for SBPS, got {control_variates!r}."
            )
        self._paths = PathFunctions(path_functions, quadrature_nodes)
        self.path_functions = self._paths.functions
        for name in ("step_size", "inner_steps"):
            if name in kwargs:
                raise TypeError(
                    f"{type(self).__name__} has no {name}; use travel_time (travel per draw)."
                )
        self._fixed_k = k is not None
        self._given_k = float(k) if k is not None else DEFAULT_K
        self.adaptive_metric = preconditioner == "adaptive"
        self.metric_adaptation = (float(metric_beta), float(metric_eps))
        self.adapt_metric_after_tuning = bool(adapt_metric_after_tuning)
        self.misfit = bool(misfit)
        self.noise_memory = bool(noise_memory)
        self.prior_rate = float(prior_rate)
        self.slope_prior = slope_prior
        self.check_after = None if check_after is None else float(check_after)
        self.metric_update = metric_update
        self._fixed_refresh = refresh_rate
        self._metric: tuple[np.ndarray, np.ndarray] | None = None  # pSBPS: none carried yet
        super().__init__(
            vars,
            batch_size=batch_size,
            step_size=travel_time,
            inner_steps=1,
            preconditioner="identity" if self.adaptive_metric else preconditioner,
            control_variates="first" if control_variates else "none",
            **kwargs,
        )

    def _check_layer_settings(self) -> None:
        """The path functions' shapes, on the model's initial point (before the MAP), and
        independent minibatches (Theorem 1): no block gathers."""
        self._paths.check_shapes(self.layer.initial_theta)
        check_independent_rows(self.layer, "SBPS", "Theorem 1 of the paper")

    def _prepare(self) -> None:
        """The path statistics' dtypes, from the layer's dimension and the path functions'
        shapes (``_check_layer_settings``)."""
        self.stats_dtypes_shapes = {
            **self.stats_dtypes_shapes,
            **self._paths.stats_dtypes_shapes(self.layer.dim),
        }
        self.stats_dtypes = [{name: dtype for name, (dtype, _) in self.stats_dtypes_shapes.items()}]

    def _reset_chain_state(self) -> None:
        super()._reset_chain_state()
        self._metric = None

    # ------------------------------------------------------------------ defaults
    def _time_scale(self) -> float:
        """``sqrt(d / lambda_min)``: the travel needed to cross the slowest direction; with
        pSBPS's metric ``M``, ``sqrt(d) max_i s_i / M_i`` (``s``: the Laplace sds)."""
        dim = self.layer.dim
        metric = self._carried_metric() if self.adaptive_metric else None
        if metric is None:
            return math.sqrt(dim / max(self.precond.curvature_range[0], 1e-300))
        return math.sqrt(dim) * float(np.max(self.laplace.laplace_sd() / metric))

    def default_step(self) -> float:
        """The default travel time per draw (stored as the base's ``step_size``)."""
        return TRAVEL_FACTOR * self._time_scale()

    def default_inner(self) -> int:
        return 1

    @property
    def travel_time(self) -> float:
        return self.step_size

    @property
    def refresh_rate(self) -> float:
        if self._fixed_refresh is not None:
            return float(self._fixed_refresh)
        return REFRESH_FACTOR / self._time_scale()

    def _check_reshuffle(self, reshuffle: bool | None) -> bool:
        """Independent minibatches (Theorem 1 needs the noise at different points to be
        independent; disjoint minibatches within a pass are negatively correlated)."""
        if reshuffle:
            raise ValueError(
                "SBPS needs independent minibatches (Theorem 1 of the paper): reshuffled "
                "minibatches, disjoint within a pass over the data, have correlated noise and "
                "bias the draws (measured: sds 4-8 % too wide with N/n = 10). Leave reshuffle "
                "out (False)."
            )
        return False

    def _make_step_policy(self) -> TravelTimeAndBand:
        """The travel time follows the preconditioner's curvature (unless given), and ``k``
        the tuning draws' violation rate (unless given)."""
        return TravelTimeAndBand(
            fixed_step=self._fixed_step, k=self._given_k, fixed_k=self._fixed_k
        )

    @property
    def k(self) -> float:
        """The band multiple in use (tuned unless given)."""
        return self._step_policy.k

    # ------------------------------------------------------------------ kernel plumbing
    def _reset_kernel_state(self) -> None:
        self._state: SBPSState | None = None
        self._info = None

    def _settings(self) -> SBPSSettings:
        adapting = self.adaptive_metric and (self.tune or self.adapt_metric_after_tuning)
        return SBPSSettings(
            k=self.k,
            refresh_rate=self.refresh_rate,
            prior_rate=self.prior_rate,
            misfit=self.misfit,
            noise_memory=self.noise_memory,
            metric_adaptation=self.metric_adaptation if adapting else None,
            check_after=self.check_after,
            prior_update="gradient" if self.slope_prior == "paper" else "em",
            metric_every_observation=self.metric_update == "minibatch",
        )

    def _initial_slope_prior(self) -> tuple[float, float]:
        """``mu``: the geometric mean of the Laplace curvature range in z (1 for the dense
        Laplace preconditioner); ``sigma = mu``. The paper's: :data:`PAPER_SLOPE_PRIOR`."""
        if self.slope_prior == "paper":
            return PAPER_SLOPE_PRIOR
        low, high = self.precond.curvature_range
        mu = math.sqrt(max(low, 1e-300) * max(high, 1e-300))
        return mu, mu * mu

    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle | None
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        """SBPS reads its own directional estimates (``_observe``), not the oracle."""
        state = self._state
        if state is None:
            mu, sigma2 = self._initial_slope_prior()
            state = sbps_init(z0, self.rng, mu, sigma2, self._carried_metric())
            if self._metric is not None:
                state = state._replace(grad_sq=self._metric[1])
        knot_scale = 1.0 / math.sqrt(max(state.mu, 1e-300))
        new_state, info = sbps_advance(
            state,
            self._observe,
            self.step_size,
            self._settings(),
            self.rng,
            self.precond.theta,
            knot_scale,
            record_skeleton=bool(self.path_functions),
        )
        self._info = info
        self._state = new_state if info.finite else None
        if self.adaptive_metric:
            self._metric = (new_state.metric, new_state.grad_sq)
        return new_state.position, info.finite, DrawRecord(info.rows)

    def _carried_metric(self) -> np.ndarray | None:
        """pSBPS keeps its metric across kernel restarts within a chain."""
        return None if self._metric is None else self._metric[0]

    def _observe(self, z: np.ndarray, direction_z: np.ndarray) -> Observation:
        """``G_hat = direction . grad_z U`` on a fresh minibatch (Eqs. 7-8, with the census
        stratum and control variates), its noise variance (Eq. 10) and the same rows'
        gradient of ``U`` in z (computed in the same call: a bounce needs it)."""
        theta = self.precond.theta(z)
        u = self.precond.direction(direction_z)
        rows = self.minibatches.with_census(self.minibatches.draw())
        n_census, n = len(self.census), self.batch_size
        touched = n + n_census
        try:
            prior, per_row, grad_theta = self.layer.directional_parts_and_grad(
                theta, u, rows, self.anchor, self.minibatches.weights
            )
        except ParameterValueError:
            return Observation(math.nan, math.nan, touched, lambda: np.full(len(z), np.nan))
        sampled = per_row[n_census:]
        pool = self._pool_size()
        total = float(sampled.sum())
        slope = prior + float(per_row[:n_census].sum()) + pool / n * total
        if self.anchor is not None:
            slope += float(u @ self.anchor.loglik_grad)
        spread = (float(sampled @ sampled) - total * total / n) / (n - 1)  # sample variance
        noise_var = pool * pool * self.minibatches.batch_factor(n) * max(spread, 0.0)
        return Observation(-slope, noise_var, touched, lambda: -self.precond.grad_z(grad_theta))

    # ------------------------------------------------------------------ stats and checks
    def _extra_stats(self) -> dict[str, Any]:
        info = self._info
        dim = self.layer.dim
        if info is None:  # a diverged draw: nothing travelled
            counts = dict(proposals=0, bounces=0, refreshes=0, checks=0, violations=0)
            stats = {
                **counts,
                "expected_violations": 0.0,
                "missed_bounces": 0.0,
                "travel_time": 0.0,
                "proposals_exhausted": False,
                "k": self.k,
            }
            return {
                **stats,
                "path_mean": np.full(dim, np.nan),
                "path_sq_mean": np.full(dim, np.nan),
                **self._paths.missing(),
            }
        travel = info.travelled if info.exhausted else self.step_size
        return {
            "proposals": info.proposals,
            "bounces": info.bounces,
            "refreshes": info.refreshes,
            "checks": info.checks,
            "violations": info.violations,
            "expected_violations": info.expected_violations,
            "missed_bounces": info.missed_bounces,
            "travel_time": travel,
            "proposals_exhausted": info.exhausted,
            "k": self.k,
            "path_mean": info.integral / travel,
            "path_sq_mean": info.integral_sq / travel,
            **self._paths.means(info.skeleton, travel),
        }

    def _make_alarms(self) -> list[SBPSAlarm]:
        """Exhausted proposals and bound violations far above the regression's prediction."""
        return [SBPSAlarm(sbps_kernel.MAX_PROPOSALS)]

    def continuous_estimates(self, idata, var_names: list[str] | None = None) -> xr.Dataset:
        """Trajectory averages (Eq. 19) of the unconstrained parameters and of the
        ``path_functions``, over all chains (:func:`~.sbps_paths.continuous_estimates`)."""
        return continuous_estimates(idata, self.layer, list(self.path_functions), var_names)


class pSBPS(SBPS):  # noqa: N801 - the paper's name
    """Preconditioned SBPS (Sec. 5): ``SBPS(preconditioner="adaptive")``.

    The diagonal metric of Eqs. 17-18 (``beta = 0.99``, ``eps = 1e-4``) learnt from the
    gradients at the bounces, on the model's own (unconstrained) coordinates instead of the
    base's Laplace preconditioner. ``pSBPS(**pSBPS.PAPER_SETTINGS)`` is the paper's own
    pSBPS: SBPS's paper settings, with the metric learnt from every minibatch (the authors'
    code) and throughout the run.
    """

    name = "psbps"

    #: the paper's own pSBPS (Sec. 5 and 7.1): SBPS's paper settings, the metric learnt from
    #: every minibatch's gradient (the authors' code) and never frozen
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in SBPS.PAPER_SETTINGS.items() if k != "preconditioner"},
        "adapt_metric_after_tuning": True,
        "metric_update": "minibatch",
    }

    def __init__(self, vars=None, **kwargs):
        if kwargs.get("preconditioner", "adaptive") != "adaptive":
            raise ValueError("pSBPS uses preconditioner='adaptive'; use SBPS for the others.")
        kwargs["preconditioner"] = "adaptive"
        super().__init__(vars, **kwargs)
