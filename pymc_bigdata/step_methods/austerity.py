"""Approximate Metropolis-Hastings by a sequential test on minibatches (Korattikara et al. 2014).

The test and the proposals are in :mod:`pymc_bigdata.kernels.austerity`; the per-row
differences (plain, or residuals against the Taylor control variates) in
:mod:`pymc_bigdata.model.difference_terms`. This adapter draws the rows of each decision lazily
from a fresh random permutation (:class:`~pymc_bigdata.rows.LazyPermutation`), or, where the
row source reads window gathers, as one window of its shuffled copy from a random start
(:class:`~pymc_bigdata.row_windows.WindowPermutation`: no indices drawn, no rows gathered;
``window_gathers=False`` and ``PAPER_SETTINGS`` keep the permutation), supplies the
terms of the log target ratio that need no rows, and tunes the proposal scale (dual
averaging to a target acceptance, restarted whenever the base's preconditioner changes) on
the base's schedule: the preconditioner and the anchor from the tuning windows' draws.

With control variates the test reads ``r_i = d_i(theta') - d_i(theta)``, the rows' residuals
against their Taylor terms around the anchor, and the Taylor terms' full-data sums enter the
known part exactly (``control_variate_sum``): the decision is the same as on the plain
differences (the two sums agree), but the residuals' spread shrinks with the Taylor error, so
far fewer rows decide (the idea of Bardenet et al.'s confidence sampler with proxies).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import numpy as np
from pymc.logprob.utils import ParameterValueError

from pymc_bigdata.kernels.austerity import (
    Proposal,
    langevin_proposal,
    mh_decision,
    random_walk_proposal,
)
from pymc_bigdata.limits import DENSE_HESSIAN_MAX_DIM
from pymc_bigdata.model.difference_terms import control_variate_sum
from pymc_bigdata.row_windows import WindowPermutation
from pymc_bigdata.rows import LazyPermutation, RowSource, window_rows_for_tests
from pymc_bigdata.step_methods.alarms import AusterityAlarm
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.decision_audit import (
    AUDIT_EVERY,
    DecisionAudit,
    check_audit_every,
)
from pymc_bigdata.step_methods.gradient_oracle import DrawRecord, GradientOracle
from pymc_bigdata.step_methods.progress import ProgressField
from pymc_bigdata.step_methods.step_size import DualAveragingStepSize

__all__ = ["AusterityMH"]

#: rows per minibatch of the sequential test (the paper's experiments use 500)
DEFAULT_TEST_BATCH = 500

#: target acceptance of the proposals' scale (Roberts & Rosenthal 2001): the random walk's
#: 0.234 (0.44 in one dimension, 0.3 in between), the Langevin proposals' 0.574
RW_TARGET = {1: 0.44, 2: 0.35, 3: 0.3, 4: 0.27}
RW_TARGET_HIGH_D = 0.234
LANGEVIN_TARGET = 0.574

#: decisions per recorded draw: about one integrated autocorrelation time of the proposal at
#: its optimal scale on a Gaussian (random walk ~ 3 d, Langevin ~ 1.5 d^(1/3))
RW_DECISIONS_PER_DIM = 3.0
LANGEVIN_DECISIONS = 1.5


PROPOSALS = ("rw", "langevin", "sgld")
TESTS = ("residuals", "plain")


class _Decision(NamedTuple):
    """What one decision did (for the statistics)."""

    accepted: bool
    rows: int
    batches: int
    delta: float
    clt_error: float
    exact: bool
    finite: bool
    audited: bool = False
    wrong: bool = False


#: where a decision's rows come from
Rows = LazyPermutation | WindowPermutation


def decision_rows(
    rows: RowSource, windows: bool, census: np.ndarray, batch_size: int, rng: np.random.Generator
) -> Rows:
    """Each decision's rows: a lazy uniform permutation of the pool (every row but the
    census), or where the step's minibatches are windows (``window_gathers``) one window of
    the row source's shuffled copy for the first ``N / WINDOW_MIN_BATCHES`` rows, then
    uniform rows (:class:`~pymc_bigdata.row_windows.WindowPermutation`)."""
    if not windows:
        return LazyPermutation(rows.n_rows - len(census), rng)
    shuffled = rows.shuffled_rows(census)
    return WindowPermutation(shuffled, rng, window_rows=window_rows_for_tests(shuffled, batch_size))


class _NonFinite(Exception):
    """A row difference that is not finite: the proposal is rejected."""


class AusterityMH(SubsamplingStep):
    """Approximate Metropolis-Hastings whose accept test reads as few rows as it needs.

    Each decision runs the sequential t-test of Algorithm 1 on the per-row log-likelihood
    differences between the proposal and the current point, drawn without replacement in
    minibatches of ``batch_size``, and stops when the test's p-value falls below
    ``epsilon`` or every row is used. ``epsilon=0`` is exact Metropolis-Hastings. See
    ``docs/austerity.md``.

    Parameters
    ----------
    epsilon
        The test's error level in ``[0, 1)`` (default 0.05): the bias knob. Larger decides
        from fewer rows and errs more often; 0 reads every row (exact MH).
    batch_size
        Rows per minibatch of the test, and of the ``"sgld"`` proposal's gradient
        (default ``min(500, N)``).
    proposal
        ``"rw"``: a Gaussian random walk in the preconditioned coordinates (Sec. 6.1).
        ``"langevin"``: a Langevin (MALA) proposal whose drift is the gradient of the log
        prior plus the control variates' full-data sum (the second-order Taylor model of the
        log-likelihood at the anchor): it reads no rows. ``"sgld"``: the paper's SGLD
        proposal (Sec. 6.2), drift from one minibatch's gradient estimate, the same minibatch
        at both ends. Default: ``"langevin"`` where the layer has the dense full-data Hessian
        (``d <= 2000``), else ``"sgld"``.
    step_size
        The proposal scale ``h`` in the preconditioned coordinates (``z' = z + h xi`` or
        ``z + (h^2/2) g + h xi``); default: dual averaging in tuning to ``target_accept``.
    inner_steps
        Decisions per recorded draw (default: about one autocorrelation time of the proposal
        on a Gaussian, ``3 d`` for the random walk and ``1.5 d^(1/3)`` for the Langevin ones,
        at most 100).
    target_accept
        Mean acceptance the scale is tuned to (default 0.234 for the random walk, higher in
        1-4 dimensions; 0.574 for the Langevin proposals).
    control_variates
        As the base's (default True: second order where the dense Hessian exists, else
        first): the test then reads the rows' residuals against their Taylor terms, whose
        full-data sum enters exactly. ``False``: the paper's plain differences.
    test
        ``"residuals"`` (the default with control variates) or ``"plain"`` (the paper's).
    audit_every
        One kept decision in this many is decided again at level ``1e-6`` from rows of its
        own (:mod:`~pymc_bigdata.step_methods.decision_audit`); the share that disagreed
        feeds an alarm and the stats ``audited`` and ``audit_wrong``. It does not change the
        draws. Default 50; ``None`` switches the audit off.
    **kwargs
        The base's (:class:`~pymc_bigdata.step_methods.base.SubsamplingStep`): ``model``,
        ``preconditioner``, ``adapt``, ``layer``, ``rng``, ``window_gathers`` (default
        True: :func:`decision_rows`)...
    """

    name = "austerity_mh"
    progress_field = ProgressField("test_error", "Test p-value", "0.2g")
    #: Korattikara, Chen & Welling (2014), Algorithm 1 with the random-walk proposal of Sec.
    #: 6.1 and none of our extensions: the plain per-row differences (no control variates, so
    #: no residual test and no census rows), no preconditioner, the model's own coordinates,
    #: no tuning (give ``step_size``, the walk's sd). Its minibatches are drawn without
    #: replacement within a test, as the paper's (there is no ``reshuffle`` to switch off).
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {
        **{k: v for k, v in SubsamplingStep.EXTENSIONS_OFF.items() if k != "reshuffle"},
        "test": "plain",
        "proposal": "rw",
    }
    divergence_remedy = "lower step_size (the proposal's scale)"
    accept_step = True
    watches_stability = False
    reads_oracle = False

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list | None]]] = {
        **SubsamplingStep.stats_dtypes_shapes,
        "accepted": (bool, []),
        "accept_rate": (np.float64, []),
        "n_steps": (np.int64, []),
        "test_rows": (np.float64, []),
        "decision_fraction": (np.float64, []),
        "minibatches": (np.float64, []),
        "test_error": (np.float64, []),
        "clt_error": (np.float64, []),
        "exact_fraction": (np.float64, []),
        "nonfinite": (np.int64, []),
        "audited": (np.int64, []),
        "audit_wrong": (np.int64, []),
    }

    off_target_consequence: ClassVar[str] = "Its decisions may be wrong more often than epsilon."

    def __init__(
        self,
        vars=None,
        *,
        epsilon: float = 0.05,
        batch_size: int | None = None,
        proposal: str | None = None,
        step_size: float | None = None,
        inner_steps: int | None = None,
        target_accept: float | None = None,
        control_variates: bool | str = True,
        test: str | None = None,
        audit_every: int | None = AUDIT_EVERY,
        **kwargs,
    ):
        if isinstance(epsilon, bool) or not (
            isinstance(epsilon, int | float) and 0.0 <= epsilon < 1.0
        ):
            raise ValueError(f"epsilon must be a number in [0, 1), got {epsilon!r}.")
        without_cv = control_variates in (False, "none")
        if proposal is not None and proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS}, got {proposal!r}.")
        if proposal == "langevin" and without_cv:
            raise ValueError(
                "proposal='langevin' drifts along the control variates' Taylor model, so it "
                "needs control variates; use proposal='sgld' or 'rw' with control_variates=False."
            )
        if test is not None and test not in TESTS:
            raise ValueError(f"test must be one of {TESTS}, got {test!r}.")
        if test == "residuals" and without_cv:
            raise ValueError(
                "test='residuals' reads the rows' residuals against the control variates; "
                "with control_variates=False use test='plain'."
            )
        self.test = test or ("plain" if without_cv else "residuals")
        if target_accept is not None and not (
            isinstance(target_accept, int | float) and 0 < target_accept < 1
        ):
            raise ValueError(f"target_accept must be in (0, 1), got {target_accept!r}.")
        for key in ("replace", "reshuffle", "noise_bound", "noise_shift_bound"):
            if key in kwargs:
                raise TypeError(
                    f"AusterityMH has no {key!r}: its test reads rows without replacement, "
                    "all of them equally likely, and no gradient noise enters its target."
                )
        check_audit_every(audit_every)
        self.audit_every = audit_every
        self.epsilon = float(epsilon)
        self._given_proposal = proposal
        self._given_target = target_accept
        super().__init__(
            vars,
            batch_size=batch_size,
            step_size=step_size,
            inner_steps=inner_steps,
            control_variates=control_variates,
            **kwargs,
        )

    # ------------------------------------------------------------------ set-up and defaults
    def _prepare(self) -> None:
        """The rows the test samples: all but the census stratum, whose differences enter
        every decision exactly (:func:`decision_rows`)."""
        n_census = len(self.census)
        self._pool = np.setdiff1d(np.arange(self.layer.n_rows), self.census) if n_census else None
        self._permutation = decision_rows(
            self.layer.rows, self.minibatches.windows, self.census, self.batch_size, self.rng
        )

    def _check_layer_settings(self) -> None:
        """The proposal's default, and its check against the layer (before the MAP search)."""
        has_curvature = self.layer.dim <= DENSE_HESSIAN_MAX_DIM and self.cv_mode in (
            "auto",
            "second",
        )
        if self._given_proposal == "langevin" and not has_curvature:
            raise ValueError(
                "proposal='langevin' drifts along the second-order Taylor model, which needs "
                f"the dense full-data Hessian (d <= {DENSE_HESSIAN_MAX_DIM}, here d = "
                f"{self.layer.dim}) and control_variates True, 'auto' or 'second'; use "
                "proposal='sgld'."
            )
        self.proposal = self._given_proposal or ("langevin" if has_curvature else "sgld")
        dim = self.layer.dim
        if self._given_target is not None:
            self.target_accept = float(self._given_target)
        elif self.proposal == "rw":
            self.target_accept = RW_TARGET.get(dim, RW_TARGET_HIGH_D)
        else:
            self.target_accept = LANGEVIN_TARGET

    def default_batch_size(self, n_rows: int) -> int:
        """Rows per test minibatch when ``batch_size`` is not given: ``min(500, N)``."""
        return min(DEFAULT_TEST_BATCH, n_rows)

    def default_step(self) -> float:
        """The optimal scales on a standard Gaussian: ``2.38 / sqrt(d)`` (random walk) and
        ``1.65 d^(-1/3)`` (Langevin), in the preconditioned coordinates."""
        dim = self.layer.dim
        return 2.38 / math.sqrt(dim) if self.proposal == "rw" else 1.65 * dim ** (-1.0 / 3.0)

    def default_inner(self) -> int:
        dim = self.layer.dim
        if self.proposal == "rw":
            return max(1, math.ceil(RW_DECISIONS_PER_DIM * dim))
        return max(1, math.ceil(LANGEVIN_DECISIONS * dim ** (1.0 / 3.0)))

    def _reset_chain_state(self) -> None:
        super()._reset_chain_state()
        self._decisions: list[_Decision] = []
        audit_on = self.audit_every is not None and self.epsilon > 0
        pool = self.layer.n_rows - len(self.census)
        self._audit = (
            DecisionAudit(pool, self.batch_size, self.audit_every, self.rng) if audit_on else None
        )

    def _reset_kernel_state(self) -> None:
        """Forget the cached known terms (the coordinates or the anchor moved)."""
        self._known_cache: list[tuple[np.ndarray, float, np.ndarray | None]] = []

    # ------------------------------------------------------------------ the log target ratio
    def _known(self, z: np.ndarray) -> tuple[float, np.ndarray | None]:
        """The log target's terms that need no rows at ``z`` (log prior, plus the control
        variates' full-data sum), and the ``"langevin"`` drift (their gradient in z)."""
        for i, (point, value, drift) in enumerate(self._known_cache):
            if point is z or np.array_equal(point, z):
                if i == 0:  # the least recently read first: the next decision's start stays
                    self._known_cache.reverse()
                return value, drift
        theta = self.precond.theta(z)
        try:
            value, grad = self.layer.prior_logp_grad(theta)
        except ParameterValueError:
            return math.nan, None
        value = float(value)
        if self.anchor is not None:
            cv_value, cv_grad = control_variate_sum(theta, self.anchor, self.cv_order)
            grad = grad + cv_grad
            if self.test == "residuals":
                value += cv_value
        drift = self.precond.grad_z(grad) if self.proposal == "langevin" else None
        self._known_cache = [*self._known_cache[-1:], (z, value, drift)]
        return value, drift

    def _row_differences(self, theta_new: np.ndarray, theta: np.ndarray, permutation: Rows):
        """``next_differences`` of a test: the next rows of ``permutation`` (started by the
        caller), their residual (or plain) differences between ``theta`` and ``theta_new``."""
        terms, order = self.layer.difference_terms, self.cv_order
        anchor = self.anchor if self.test == "residuals" else None

        def next_differences(k: int) -> np.ndarray:
            drawn = permutation.next(k)
            if isinstance(permutation, LazyPermutation) and self._pool is not None:
                drawn = self._pool[drawn]  # positions in the pool -> the source's rows
            rows = self.layer.take_rows(drawn)
            self._rows_read += k
            try:
                d = terms.differences(theta_new, theta, rows, anchor, order)
            except ParameterValueError as exc:
                raise _NonFinite from exc
            if not (math.isfinite(float(d.sum())) or np.all(np.isfinite(d))):
                raise _NonFinite  # (a finite sum: every row finite, the usual case)
            return d

        return next_differences

    def _census_sum(self, theta_new: np.ndarray, theta: np.ndarray) -> float:
        """The census rows' differences, summed: they enter every decision exactly (the
        stratum of rows that would dominate the test's variance, e.g. a rare outcome's)."""
        if self.minibatches.census_rows is None:
            return 0.0
        self._rows_read += len(self.census)
        anchor = self.anchor if self.test == "residuals" else None
        try:
            d = self.layer.difference_terms.differences(
                theta_new, theta, self.minibatches.census_rows, anchor, self.cv_order
            )
        except ParameterValueError as exc:
            raise _NonFinite from exc
        total = float(np.sum(d))
        if not math.isfinite(total):
            raise _NonFinite
        return total

    def _propose(self, z: np.ndarray) -> Proposal:
        h = self.step_size
        if self.proposal == "rw":
            return random_walk_proposal(z, h, self.rng)
        if self.proposal == "langevin":
            return langevin_proposal(z, h, lambda x: self._known(x)[1], self.rng)
        estimator = self._estimator()
        rows = estimator.with_census(self.minibatches.draw())  # one component
        self._rows_read += self.batch_size + len(self.census)

        def drift(x: np.ndarray) -> np.ndarray:
            try:
                g_theta = estimator.gradient(self.precond.theta(x), rows, estimator.weights)
            except ParameterValueError:
                return np.full(len(x), np.nan)
            return self.precond.grad_z(g_theta)

        return langevin_proposal(z, h, drift, self.rng)

    def _decide(self, z: np.ndarray) -> tuple[np.ndarray, _Decision]:
        """One proposal and its approximate MH decision."""
        proposal = self._propose(z)
        known_now, _ = self._known(z)
        known_new, _ = self._known(proposal.position)
        known = known_new - known_now
        rejected = _Decision(False, 0, 0, 0.0, math.nan, False, False)
        if not (math.isfinite(known) and math.isfinite(proposal.log_ratio)):
            return z, rejected
        theta, theta_new = self.precond.theta(z), self.precond.theta(proposal.position)
        n_census = len(self.census)
        pool = self.layer.n_rows - n_census
        try:
            self._permutation.start(self.rng)  # this decision's rows: none drawn yet
            known += self._census_sum(theta_new, theta)
            decided = mh_decision(
                proposal,
                known,
                self._row_differences(theta_new, theta, self._permutation),
                pool,
                self.batch_size,
                self.epsilon,
                self.rng,
            )
        except _NonFinite:
            return z, rejected._replace(rows=self._permutation.drawn + n_census)
        result = decided.test
        audited, wrong = self._audit_decision(decided, theta_new, theta, pool)
        decision = _Decision(
            bool(result.accept),
            result.rows + n_census,
            result.batches,
            result.delta,
            result.clt_error if result.rows < pool else math.nan,
            result.rows >= pool,
            True,
            audited,
            wrong,
        )
        return (proposal.position if result.accept else z), decision

    def _audit_decision(self, decided, theta_new: np.ndarray, theta: np.ndarray, pool: int):
        """``(audited, wrong)``: a kept decision's second opinion when due (one that read every
        row is exact: it agrees; rows whose difference is not finite make exact MH reject)."""
        if self._audit is None or self.tune or not self._audit.due():
            return False, False
        if decided.test.rows >= pool:
            return True, False
        try:
            accept = self._audit.redecide(
                decided.mu0, lambda perm: self._row_differences(theta_new, theta, perm)
            )
        except _NonFinite:
            accept = False
        return True, accept != decided.test.accept

    def _transitions(
        self, z0: np.ndarray, oracle: GradientOracle | None
    ) -> tuple[np.ndarray, bool, DrawRecord]:
        """``inner_steps`` approximate MH decisions (the test reads its own rows)."""
        self._rows_read = 0
        z, decisions = z0, []
        for _ in range(self.inner_steps):
            z, decision = self._decide(z)
            decisions.append(decision)
            if self.tune and self.adapt and not self._fixed_step:
                self.step_size = self._step_policy.update(float(decision.accepted))
        self._decisions = decisions
        self._decision_alarm.record(decisions, kept=not self.tune)
        return z, True, DrawRecord(self._rows_read)

    # ------------------------------------------------------------------ base hooks
    def _make_step_policy(self) -> DualAveragingStepSize:
        """Dual averaging of the proposal scale to ``target_accept``: it sets the scale at
        each tuning decision (``_transitions``), and its averaged value when tuning stops."""
        return DualAveragingStepSize(
            target=self.target_accept, step_size=self.step_size, fixed_step=self._fixed_step
        )

    def _extra_stats(self) -> dict[str, Any]:
        decisions = self._decisions
        count = max(len(decisions), 1)
        rows = sum(d.rows for d in decisions) / count
        early = [d.clt_error for d in decisions if d.finite and not d.exact]
        accept_rate = sum(d.accepted for d in decisions) / count
        clt = float(np.mean(early)) if early else math.nan
        nonfinite = sum(not d.finite for d in decisions)
        return {
            "accepted": bool(decisions[-1].accepted) if decisions else False,
            "accept_rate": accept_rate,
            "n_steps": len(decisions),
            "test_rows": rows,
            "decision_fraction": rows / self.layer.n_rows,
            "minibatches": sum(d.batches for d in decisions) / count,
            "test_error": sum(d.delta for d in decisions) / count,
            "clt_error": clt,
            "exact_fraction": sum(d.exact for d in decisions) / count,
            "nonfinite": nonfinite,
            "audited": sum(d.audited for d in decisions),
            "audit_wrong": sum(d.wrong for d in decisions),
        }

    def _make_alarms(self) -> list[AusterityAlarm]:
        """A sticky chain, a collapsed scale, a skewed test, rows not finite."""
        scales = None if self._fixed_step else (lambda: (self.step_size, self.default_step()))
        alarm = AusterityAlarm(
            epsilon=self.epsilon, consequence=self.off_target_consequence, scales=scales
        )
        self._decision_alarm = alarm
        return [alarm]
