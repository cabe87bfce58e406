"""Approximate Gibbs sampling of binary variables by the sequential test (Korattikara et al. 2014,
Sec. 5).

Each draw visits every binary coordinate ``x_j`` of the step's variables once, in a fresh
random order, and sets it from its full conditional given the others and the held
(continuous) variables: ``x_j = 1`` iff ``log[u / (1 - u)]`` is below the conditional
log-odds, the log prior odds plus ``sum_i l_i`` with
``l_i = log p(y_i | x_j = 1, ...) - log p(y_i | x_j = 0, ...)``. The sum is decided by the
sequential t-test of Algorithm 1 (:func:`~pymc_bigdata.kernels.austerity.gibbs_decision`) on
rows drawn without replacement; ``epsilon=0`` reads every row (exact Gibbs). Theorem 2 bounds
the stationary law's error by the conditionals' error over one minus the Dobrushin
coefficient.

The continuous variables are held: a continuous step beside it in a compound step moves them
(``step=[pmbd.AusterityGibbs([gamma]), pmbd.AusterityMH([beta])]``), and gives each
configuration of the binary variables its own Laplace fit and control-variate anchor (see
:mod:`~pymc_bigdata.step_methods.held`). The test reads the plain differences: a flip is no
small move, so a Taylor proxy would not shrink them.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, NamedTuple

import numpy as np
import pymc as pm
from pymc.blocking import RaveledVars
from pymc.logprob.utils import ParameterValueError
from pymc.stats.convergence import SamplerWarning
from pymc.step_methods.arraystep import ArrayStepShared
from pymc.step_methods.compound import Competence

from pymc_bigdata.errors import ModelNotSupportedError
from pymc_bigdata.kernels.austerity import gibbs_decision
from pymc_bigdata.model.layer_cache import cached_layer
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.row_windows import WindowPermutation
from pymc_bigdata.rows import LazyPermutation, check_batch_size, window_rows_for_tests
from pymc_bigdata.step_methods.base import step_own_vars
from pymc_bigdata.step_methods.decision_audit import (
    AUDIT_EVERY,
    DecisionAudit,
    audit_verdict,
    check_audit_every,
)
from pymc_bigdata.step_methods.diagnostics import bias_warning
from pymc_bigdata.step_methods.progress import ProgressField, progressbar_config, update_functions

__all__ = ["AusterityGibbs"]

#: rows per minibatch of the sequential test (the paper's experiments use 500)
DEFAULT_TEST_BATCH = 500

#: the test's per-look level: a flip's differences do not shrink (no Taylor proxy), so the
#: sequential test's many looks make the paper's 0.05 err on 12 % of the updates of the
#: variable-selection example (docs/austerity.md); 0.001 errs on 0.4 %
DEFAULT_EPSILON = 0.001


class _Update(NamedTuple):
    """What one coordinate's update did (for the statistics)."""

    flipped: bool
    rows: int
    batches: int
    delta: float
    clt_error: float
    exact: bool
    finite: bool
    audited: bool = False
    wrong: bool = False


class _Decisive(Exception):
    """A row ruled one value out (its difference is infinite): the conditional is certain."""

    def __init__(self, value: int):
        self.value = value


class _NaNRow(Exception):
    """A row difference that is NaN: the conditional is undefined there."""


class AusterityGibbs(ArrayStepShared):
    """Approximate Gibbs updates of binary variables whose conditional log-odds is a row sum.

    Parameters
    ----------
    vars
        The binary free variables to update (``pm.Bernoulli``; default: every discrete free
        variable). The model's other free variables are held at their current values.
    epsilon
        The test's per-look error level in ``[0, 1)`` (default 0.001); 0 reads every row
        (exact Gibbs). The paper's 0.05 is far too loose here: the share of wrong updates
        grows with the number of looks (see ``docs/austerity.md``).
    batch_size
        Rows per minibatch of the test (default ``min(500, N)``).
    model
        The PyMC model (default: the one in context).
    layer
        A discrete :class:`~pymc_bigdata.MinibatchModel` (``discrete=True``) to reuse
        (default: the one an earlier step built on the model and ``vars``, where its data
        are unchanged, else a new one: :mod:`~pymc_bigdata.model.layer_cache`).
    rng
        Seed or generator; ``pm.sample`` replaces it per chain.
    audit_every
        One kept update in this many is decided again at level ``1e-6`` from rows of its
        own, as AusterityMH's (:mod:`~pymc_bigdata.step_methods.decision_audit`); default 50,
        ``None`` switches it off. It does not change the draws.
    window_gathers
        True: where the row source reads window gathers (in-memory rows of at least
        ``WINDOW_MIN_BATCHES`` test minibatches, :mod:`pymc_bigdata.row_windows`), each
        update reads its first ``N / WINDOW_MIN_BATCHES`` rows as one window of the shuffled
        copy, as AusterityMH's decisions do, and uniform rows beyond. Default False (a lazy
        uniform permutation, the paper's): an update here reads about half the rows, so the
        window saves little, and on the variable-selection benchmark it decided more updates
        wrong (``docs/austerity.md``).

    Notes
    -----
    Statistics per draw (one sweep): ``flips`` (coordinates whose value changed),
    ``updates`` (coordinates visited), ``test_rows`` and ``decision_fraction`` (mean rows per
    update, and as a fraction of ``N``), ``minibatches`` (per update), ``test_error`` (the
    mean final p-value δ), ``clt_error`` (the Edgeworth estimate of the t-test's level error
    over the updates that stopped early), ``exact_fraction`` (updates that read every row),
    ``rows_touched`` and ``data_fraction`` (rows read in the sweep), ``nonfinite`` and
    ``diverging`` (updates whose conditional was NaN; the value is then kept), ``audited``
    and ``audit_wrong`` (updates the audit decided again, and those it decided the other
    way).
    """

    name = "austerity_gibbs"
    #: its progress-bar columns: the draw's flips and the decisions' mean final p-value
    PROGRESS_FIELDS = (
        ProgressField("flips", "Flips", "d"),
        ProgressField("test_error", "Test p-value", "0.2g"),
    )

    def _progressbar_config(self, n_chains: int = 1):
        """PyMC's progress-bar columns (:mod:`.progress`)."""
        return progressbar_config(self.PROGRESS_FIELDS, n_chains)

    def _make_progressbar_update_functions(self):
        """PyMC's progress-bar values from a draw's stats (:mod:`.progress`)."""
        return update_functions(self.PROGRESS_FIELDS)

    default_blocked = True
    #: Korattikara et al. (2014), Sec. 5 as Sec. 6.3 runs it: a per-look level of 0.05 (their
    #: Gibbs runs sweep 0.01-0.25; 0.05 is also their MH default; ours is 0.001) and
    #: minibatches of 500 terms (``min(500, N)``, the default already). The test reads the
    #: plain differences either way; the rows of each update a uniform permutation's (no
    #: window gathers); nothing else of ours is on.
    PAPER_SETTINGS: ClassVar[dict[str, Any]] = {"epsilon": 0.05, "window_gathers": False}

    stats_dtypes_shapes: ClassVar[dict[str, tuple[Any, list | None]]] = {
        "flips": (np.int64, []),
        "updates": (np.int64, []),
        "test_rows": (np.float64, []),
        "decision_fraction": (np.float64, []),
        "minibatches": (np.float64, []),
        "test_error": (np.float64, []),
        "clt_error": (np.float64, []),
        "exact_fraction": (np.float64, []),
        "rows_touched": (np.int64, []),
        "data_fraction": (np.float64, []),
        "nonfinite": (np.int64, []),
        "audited": (np.int64, []),
        "audit_wrong": (np.int64, []),
        "diverging": (bool, []),
        "tune": (bool, []),
        "warning": (SamplerWarning, None),
    }

    def __init__(
        self,
        vars=None,
        *,
        epsilon: float = DEFAULT_EPSILON,
        batch_size: int | None = None,
        model=None,
        layer: MinibatchModel | None = None,
        rng=None,
        blocked: bool = True,
        mode=None,
        initial_point=None,
        compile_kwargs: dict | None = None,
        audit_every: int | None = AUDIT_EVERY,
        window_gathers: bool = False,
    ):
        if isinstance(epsilon, bool) or not (
            isinstance(epsilon, int | float) and 0.0 <= epsilon < 1.0
        ):
            raise ValueError(f"epsilon must be a number in [0, 1), got {epsilon!r}.")
        model = pm.modelcontext(model)
        vars = _binary_vars(model, vars)
        if mode is None and compile_kwargs:
            mode = compile_kwargs.get("mode")
        if layer is None:
            layer = cached_layer(model, vars, mode, discrete=True)
        elif layer.model is not model or not layer.discrete:
            raise ValueError("layer= must be a MinibatchModel(model, vars, discrete=True).")
        self.layer = layer
        layer.rows.check_finite()  # before sampling: no minibatch meets a NaN row mid-chain
        if batch_size is None:
            batch_size = min(DEFAULT_TEST_BATCH, layer.n_rows)
        check_batch_size(batch_size, layer.n_rows)
        self.batch_size = int(batch_size)
        self.epsilon = float(epsilon)
        check_audit_every(audit_every)
        self.audit_every = audit_every
        layer.check_row_factorisation(gradient_free=True)
        super().__init__(layer.value_vars, {}, blocked=blocked, rng=rng)
        shuffled = layer.rows.window_copy(self.batch_size) if window_gathers else None
        #: each update's rows: one window of the row source's shuffled copy where its rows
        #: are read through window gathers, else a lazy uniform permutation
        self._permutation: LazyPermutation | WindowPermutation = (
            LazyPermutation(layer.n_rows, self.rng)
            if shuffled is None
            else WindowPermutation(
                shuffled, self.rng, window_rows_for_tests(shuffled, self.batch_size)
            )
        )
        self.tune = True
        self._chain_length = 0
        self._reset_chain_state()

    @staticmethod
    def competence(var, has_grad):
        """Compatible with Bernoulli variables; PyMC's BinaryGibbsMetropolis stays the
        automatic choice."""
        rv_op = getattr(getattr(var, "owner", None), "op", None)
        if isinstance(rv_op, type(pm.Bernoulli.rv_op)):
            return Competence.COMPATIBLE
        return Competence.INCOMPATIBLE

    # ------------------------------------------------------------------ chain lifecycle
    def setup_chain(self, rng, tune: int, draws: int) -> None:
        super().setup_chain(rng, tune, draws)
        self._chain_length = int(tune) + int(draws)
        self._reset_chain_state()

    def reset_tuning(self) -> None:
        self._reset_chain_state()

    def _reset_chain_state(self) -> None:
        self.tune = True
        self._draw_index = 0
        self._kept_clt: list[float] = []
        self._nonfinite_seen = 0
        self._audited = self._audit_wrong = self._audit_rows = 0
        self._kept_updates = self._kept_draws = 0
        audit_on = self.audit_every is not None and self.epsilon > 0
        self._audit = (
            DecisionAudit(self.layer.n_rows, self.batch_size, self.audit_every, self.rng)
            if audit_on
            else None
        )

    # ------------------------------------------------------------------ PyMC step
    def step(self, point):
        """PyMC's step; first the held (continuous) variables' values from ``point``."""
        self.layer.hold(self.layer.held_from_point(point))
        return step_own_vars(self, point)

    def astep(self, q0: RaveledVars) -> tuple[RaveledVars, list[dict[str, Any]]]:
        x = np.array(q0.data, dtype=np.float64)
        updates = []
        for j in self.rng.permutation(len(x)):
            x, update = self._update(x, int(j))
            updates.append(update)
        self._draw_index += 1
        stats = self._stats(updates)
        if not self.tune:
            stats["warning"] = self._end_of_chain_check()
        data = x.astype(q0.data.dtype)
        return RaveledVars(data, q0.point_map_info), [stats]

    # ------------------------------------------------------------------ one coordinate
    def _update(self, x: np.ndarray, j: int) -> tuple[np.ndarray, _Update]:
        """Draw ``x_j`` from its conditional by the sequential test."""
        one, zero = x.copy(), x.copy()
        one[j], zero[j] = 1.0, 0.0
        current = int(x[j])
        try:
            known = self.layer.prior_logp(one) - self.layer.prior_logp(zero)
        except ParameterValueError:
            known = math.nan
        if math.isinf(known) and not math.isnan(known):
            return (one if known > 0 else zero), _Update(
                int(known > 0) != current, 0, 0, 0.0, math.nan, True, True
            )
        if math.isnan(known):
            return x, _Update(False, 0, 0, 0.0, math.nan, False, False)
        self._permutation.start(self.rng)
        try:
            decided = gibbs_decision(
                known,
                self._row_differences(one, zero, self._permutation),
                self.layer.n_rows,
                self.batch_size,
                self.epsilon,
                self.rng,
            )
        except _Decisive as certain:
            value = certain.value
            new = one if value else zero
            return new, _Update(
                value != current, self._permutation.drawn, 0, 0.0, math.nan, False, True
            )
        except _NaNRow:
            return x, _Update(False, self._permutation.drawn, 0, 0.0, math.nan, False, False)
        test = decided.test
        value = int(test.accept)
        exact = test.rows >= self.layer.n_rows
        audited, wrong = self._audit_update(decided.mu0, value, exact, one, zero)
        update = _Update(
            value != current,
            test.rows,
            test.batches,
            test.delta,
            math.nan if exact else test.clt_error,
            exact,
            True,
            audited,
            wrong,
        )
        return (one if value else zero), update

    def _audit_update(
        self, mu0: float, value: int, exact: bool, one: np.ndarray, zero: np.ndarray
    ) -> tuple[bool, bool]:
        """``(audited, wrong)``: a kept update's second opinion when one is due (an update
        that read every row is exact; a conditional the audit finds undefined is not
        counted)."""
        if self._audit is None or self.tune or not self._audit.due():
            return False, False
        if exact:
            return True, False
        permutation = self._audit.permutation
        try:
            second = int(
                self._audit.redecide(mu0, lambda perm: self._row_differences(one, zero, perm))
            )
        except _Decisive as certain:
            second = certain.value
        except _NaNRow:
            self._audit_rows += permutation.drawn
            return False, False
        self._audit_rows += permutation.drawn
        return True, second != value

    def _row_differences(
        self,
        one: np.ndarray,
        zero: np.ndarray,
        permutation: LazyPermutation | WindowPermutation,
    ):
        """``next_differences`` of a test: ``l_i(x_j = 1) - l_i(x_j = 0)`` on the next rows
        of ``permutation`` (started by the caller)."""
        layer = self.layer

        def next_differences(k: int) -> np.ndarray:
            rows = layer.take_rows(permutation.next(k))
            try:
                d = layer.difference_terms.differences(one, zero, rows, None, -1)
            except ParameterValueError as exc:
                raise _NaNRow from exc
            if math.isfinite(float(d.sum())):  # every row finite (the usual case, 1 µs)
                return d
            if np.any(np.isnan(d)):
                raise _NaNRow
            if np.any(np.isinf(d)):
                signs = np.sign(d[np.isinf(d)])
                if np.all(signs > 0) or np.all(signs < 0):
                    raise _Decisive(int(signs[0] > 0))
                raise _NaNRow  # a row rules out each value: no value is possible
            return d

        return next_differences

    # ------------------------------------------------------------------ statistics
    def _stats(self, updates: list[_Update]) -> dict[str, Any]:
        count = max(len(updates), 1)
        n_rows = self.layer.n_rows
        rows_touched = sum(u.rows for u in updates) + self._audit_rows
        self._audit_rows = 0
        audited, wrong = sum(u.audited for u in updates), sum(u.wrong for u in updates)
        self._audited += audited
        self._audit_wrong += wrong
        early = [u.clt_error for u in updates if u.finite and not math.isnan(u.clt_error)]
        nonfinite = sum(not u.finite for u in updates)
        self._nonfinite_seen += nonfinite
        if not self.tune:
            self._kept_clt.extend(early)
            self._kept_updates += len(updates)
            self._kept_draws += 1
        return {
            "flips": sum(u.flipped for u in updates),
            "updates": len(updates),
            "test_rows": rows_touched / count,
            "decision_fraction": rows_touched / count / n_rows,
            "minibatches": sum(u.batches for u in updates) / count,
            "test_error": sum(u.delta for u in updates) / count,
            "clt_error": float(np.mean(early)) if early else math.nan,
            "exact_fraction": sum(u.exact for u in updates) / count,
            "rows_touched": rows_touched,
            "data_fraction": rows_touched / n_rows,
            "nonfinite": nonfinite,
            "audited": audited,
            "audit_wrong": wrong,
            "diverging": nonfinite > 0,
            "tune": self.tune,
            "warning": None,
        }

    def _end_of_chain_check(self) -> SamplerWarning | None:
        """Alarms after the chain's last draw: a t-test whose normal approximation is off by
        more than ``epsilon``, and conditionals that were not defined."""
        if self._draw_index != self._chain_length:
            return None
        name, problems = type(self).__name__, []
        if self.epsilon > 0 and self._kept_clt and np.mean(self._kept_clt) > self.epsilon:
            problems.append(
                f"{name}: the differences' skewness puts the t-test's error probability "
                f"about {np.mean(self._kept_clt):.2g} off its nominal level (epsilon "
                f"{self.epsilon:g}): the conditionals may be off by more than epsilon. Raise "
                "batch_size or lower epsilon."
            )
        per_draw = self._kept_updates / max(self._kept_draws, 1)
        remedy = "Lower epsilon (the default is 0.001)."
        audit = audit_verdict(name, self._audited, self._audit_wrong, per_draw, remedy)
        problems += [] if audit is None else [audit]
        if self._nonfinite_seen:
            problems.append(
                f"{name}: {self._nonfinite_seen} updates met a conditional that was not "
                "defined (NaN log-likelihood differences); those variables kept their value. "
                "Check the model's support."
            )
        return bias_warning(" ".join(problems), stacklevel=5) if problems else None


def _binary_vars(model: pm.Model, vars) -> list:
    """The step's value variables: given ones (each a Bernoulli), or every discrete one."""
    if vars is None or list(vars) == list(model.value_vars):
        vars = [v for v in model.value_vars if v.dtype.startswith(("int", "uint"))]
        if not vars:
            raise ModelNotSupportedError(
                "AusterityGibbs: the model has no discrete free variables to update; use a "
                "continuous sampler (pmbd.SGHMC, pmbd.AusterityMH) for it."
            )
    values = [model.rvs_to_values.get(v, v) for v in vars]
    for value in values:
        if value not in model.values_to_rvs:
            raise ValueError(f"AusterityGibbs: {value} is not a free variable of the model.")
        rv = model.values_to_rvs[value]
        if not isinstance(rv.owner.op, type(pm.Bernoulli.rv_op)):
            raise ValueError(
                f"AusterityGibbs samples binary (pm.Bernoulli) variables; {rv.name!r} is a "
                f"{type(rv.owner.op).__name__.removesuffix('RV')} variable. Give it to another "
                "step method."
            )
    return values
