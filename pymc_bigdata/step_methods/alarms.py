"""The samplers' own end-of-chain alarms, as collaborators a sampler declares.

Every step runs the base's :class:`~.diagnostics.ChainMonitor` (virial, kinetic temperature,
noise share). A sampler whose own statistics say more declares alarms here
(``_make_alarms``): the step hands each one the statistics of every kept draw
(:meth:`ChainAlarm.observe`) and, after the chain's last draw, joins their
:meth:`ChainAlarm.problems` into one ``BiasWarning``. An alarm reads the stats the step
records and nothing else, so a user can check the same numbers in ``sample_stats``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from pymc_bigdata.kernels.hmcecs import VARIANCE_WALL
from pymc_bigdata.step_methods.decision_audit import audit_verdict

__all__ = [
    "COLLAPSED_SCALE",
    "ESTIMATOR_EDGE_ALARM",
    "LOGLIK_VAR_ALARM",
    "NEGATIVE_SIGN_ALARM",
    "STICKY_ACCEPT",
    "SUBSAMPLE_ACCEPT_ALARM",
    "AusterityAlarm",
    "ChainAlarm",
    "HMCECSAlarm",
    "SBPSAlarm",
]

#: HMC-ECS: the fraction of negative signs above which the sign-corrected estimates are
#: unreliable (each one costs ``(2 tau - 1)^2`` of the effective sample size: 0.64 at 10 %)
NEGATIVE_SIGN_ALARM = 0.1
#: HMC-ECS: after tuning, a mean sigma_hat^2 above this multiple of the target is reported
LOGLIK_VAR_ALARM = 3.0
#: HMC-ECS: a mean subsample acceptance below this means u rarely moves (a stuck
#: pseudo-marginal chain)
SUBSAMPLE_ACCEPT_ALARM = 0.5
#: HMC-ECS: the share of kept draws whose trajectory blew up at the estimate's own edge (a
#: zero of the signed ``L_hat``, the perturbed estimate's variance wall; rejected, not
#: divergences: ``kernels/hmcecs.py``) above which the estimator keeps the chain from part of
#: the posterior. Such a rejection leaves the draws right for the estimator's target, but
#: each is a trajectory the chain could not follow; at 1 % they cover too little of the
#: posterior to move a mean or sd by a tenth of an sd unless they reach several sds out.
#: In band (the three-seed alarm table): signed at most 5 of a chain's 1,000 kept draws
#: (a2adf5b) and at most 8 of a run's 2,000 (f526650), perturbed at most 2 of a run's 2,000
#: (e8cf055)
ESTIMATOR_EDGE_ALARM = 0.01

#: SBPS: the alarm fires when a chain's bound violations exceed this share of its proposals
#: (plus ``VIOLATION_SLACK``), whatever the regression predicts. The rule before (beyond the
#: prediction, ``3 E + 4 sqrt(E)``, *or* beyond 1 %) fired on 4 of the 8 hard targets where
#: SBPS was within 0.075 sd: Eq. 11's Gaussian predictive underestimates the tails of G_hat
#: when a minibatch holds a few large rows, so violations far beyond the prediction are
#: common and harmless at low rates; what biases the draws is the rate, and a small given
#: ``k`` predicts its own violations (k = 0.01: 38 % of the proposals, sds 8 times too
#: wide). Chosen on ``benchmarks/results/hard_targets.json`` and ``hard_targets_redesign*``:
#: in-band SBPS and pSBPS runs violated on 0.01-0.99 % of their proposals (the rare event
#: 0.63 %), the paper's pSBPS (every sd 0-10 % wide, up to 0.128 sd off) on 1.52-1.55 %.
#: Checked on ``notebooks/sbps_paper.ipynb`` (0.16-0.26 % in band, the paper's pSBPS 1.81 %)
#: and ``results/hard_targets_sbps_paper_settings.md``
VIOLATION_SHARE = 0.0125
VIOLATION_SLACK = 5.0

#: Austerity: a mean acceptance after tuning below this means the chain hardly moves
STICKY_ACCEPT = 0.05
#: Austerity: a tuned proposal scale below this fraction of its optimum on a Gaussian
#: (``default_step``) means the preconditioner does not describe the posterior: the chain
#: crawls (on the non-centred hierarchical hard target the scale fell to 0.13 of it, and the
#: draws stayed 4.5 sds off; on the seven other hard targets it stayed at 0.65 or above)
COLLAPSED_SCALE = 0.25


class ChainAlarm(Protocol):
    """What a sampler's alarm does: watch the kept draws' stats, then name its problems."""

    def observe(self, stats: Mapping[str, Any]) -> None:
        """One kept (post-tuning) draw's statistics."""

    def problems(self, sampler: str) -> list[str]:
        """The chain's problems, one sentence each (empty when none)."""


class HMCECSAlarm:
    """HMC-ECS: many negative signs (signed), a large mean ``sigma_hat^2`` (perturbed: a
    larger perturbation), truncated trajectories, a subsample that rarely moves, many
    trajectories blown up at the estimate's zeros or variance wall."""

    def __init__(
        self,
        *,
        signed: bool,
        loglik_var_target: float,
        trajectory_length: float,
        max_leapfrog: int,
    ):
        self.signed, self.target = signed, loglik_var_target
        self.trajectory_length, self.max_leapfrog = trajectory_length, max_leapfrog
        self._signs: list[int] = []
        self._subsample_accepts: list[float] = []
        self._loglik_vars: list[float] = []
        self._truncated = 0
        self._edges = 0
        self._step_size = math.nan

    def observe(self, stats: Mapping[str, Any]) -> None:
        """Collect a kept draw's sign, subsample acceptance, sigma_hat^2 and truncation."""
        self._signs.append(stats["sign"])
        self._subsample_accepts.append(stats["subsample_accept"])
        self._loglik_vars.append(stats["loglik_var"])
        self._truncated += bool(stats["trajectory_truncated"])
        self._edges += bool(stats["estimator_zero"]) or bool(stats["variance_wall"])
        self._step_size = stats["step_size"]

    def problems(self, sampler: str) -> list[str]:
        """See the class docstring."""
        problems = []
        signs = np.array(self._signs)
        if signs.size and np.mean(signs < 0) > NEGATIVE_SIGN_ALARM:
            problems.append(
                f"{sampler}: {np.mean(signs < 0):.0%} of this chain's likelihood estimates are "
                "negative: the sign-corrected estimates (pmbd.sign_weights) lose "
                f"{1 - np.mean(signs) ** 2:.0%} of their effective sample size and may be "
                "unreliable. Raise products (lambda) or use better control variates."
            )
        loglik_var = np.array(self._loglik_vars, dtype=np.float64)
        loglik_var = loglik_var[np.isfinite(loglik_var)]
        limit = LOGLIK_VAR_ALARM * self.target
        if not self.signed and loglik_var.size and np.mean(loglik_var) > limit:
            problems.append(
                f"{sampler}: the log-likelihood estimator's variance averaged "
                f"{np.mean(loglik_var):.3g} (target {self.target:g}): the "
                "perturbed posterior may be off. Raise subsample_size or tune longer."
            )
        if self._truncated:
            problems.append(
                f"{sampler}: {self._truncated} draws ran {self.max_leapfrog} leapfrog steps, "
                f"short of trajectory_length {self.trajectory_length:g} at step size "
                f"{self._step_size:.3g} (sample stat 'trajectory_truncated'): the chain mixes "
                "more slowly than asked. Check the preconditioner (a tiny step size means "
                "it does not fit the posterior) or lower trajectory_length."
            )
        kept = len(self._signs)
        if kept and self._edges > ESTIMATOR_EDGE_ALARM * kept:
            wall = f"variance wall (sigma_hat^2 above {VARIANCE_WALL:g})"
            edge = "zeros" if self.signed else wall
            remedy = "products (lambda)" if self.signed else "subsample_size"
            problems.append(
                f"{sampler}: {self._edges} of this chain's {kept} trajectories blew up at the "
                f"likelihood estimate's {edge} and were rejected (sample stats "
                "'estimator_zero', 'variance_wall'): the estimator keeps the chain from part "
                f"of the posterior. Raise {remedy} or use better control variates."
            )
        accepts = np.array(self._subsample_accepts, dtype=np.float64)
        if accepts.size and np.mean(accepts) < SUBSAMPLE_ACCEPT_ALARM:
            problems.append(
                f"{sampler}: the subsample update accepted {np.mean(accepts):.0%} on average: "
                "the pseudo-marginal chain is sticky. Raise subsample_size or blocks."
            )
        return problems


class SBPSAlarm:
    """SBPS: draws that ran out of proposals, and bound violations above ``VIOLATION_SHARE``
    of the proposals (the bounces skipped there bias the draws outward)."""

    def __init__(self, max_proposals: int):
        self.max_proposals = max_proposals
        #: violations, expected violations and proposals of the chain's kept draws
        self._counts = np.zeros(3)
        self._exhausted = 0

    def observe(self, stats: Mapping[str, Any]) -> None:
        """Add a kept draw's violations, expected violations, proposals and exhaustion."""
        self._counts += (stats["violations"], stats["expected_violations"], stats["proposals"])
        self._exhausted += stats["proposals_exhausted"]

    def problems(self, sampler: str) -> list[str]:
        """See the class docstring."""
        problems = []
        if self._exhausted:
            problems.append(
                f"{sampler}: {self._exhausted} draws stopped after {self.max_proposals} bounce "
                "proposals, short of their travel time (sample stat 'proposals_exhausted'): "
                "the proposal rate's bound is far above the gradient or the path is stuck. "
                "The process went on from where each stopped, but the chain may not have "
                "explored the posterior. Lower k or check the model."
            )
        observed, expected, proposals = self._counts
        if observed > VIOLATION_SHARE * proposals + VIOLATION_SLACK:
            problems.append(
                f"{sampler}: {observed:.0f} of {proposals:.0f} bounce proposals "
                f"({observed / max(proposals, 1.0):.2%}, above {VIOLATION_SHARE:.2%}) violated "
                f"the proposal rate ([G]_+ > lambda), where the local regression predicts "
                f"{expected:.1f}: the bounces skipped there bias the draws outward. "
                "Raise k, or batch_size (less noise), or check the model (G far from linear "
                "along the path); see the sampler statistics 'violations' and "
                "'expected_violations'."
            )
        return problems


class AusterityAlarm:
    """Approximate MH: a chain that hardly moves, a proposal scale that collapsed in tuning,
    a test whose normal approximation is off by more than ``epsilon`` for the skewness seen,
    rows whose log-likelihood was not finite (an early decision may not have read them), and
    decisions that a second test overturns too often (:mod:`.decision_audit`).

    The sampler feeds the decisions themselves (:meth:`record`); only the kept draws'
    count. A non-finite row met in tuning is an early proposal far out in the tails (an
    ``exp`` that overflows in a Poisson rate, seen once in 2,000 tuning draws on the
    150,000-row Poisson hierarchy), which the test rejects and the kept draws never go near;
    a support bound that matters lies at the edge of the bulk and is met after tuning too.
    The scale check reads the step's final scale and its Gaussian optimum through
    ``scales``.
    """

    def __init__(
        self,
        *,
        epsilon: float,
        consequence: str,
        scales: Callable[[], tuple[float, float]] | None,
    ):
        self.epsilon, self.consequence, self.scales = epsilon, consequence, scales
        self._accepts: list[float] = []
        self._clt: list[float] = []
        self._nonfinite = 0
        self._audited = self._wrong = self._kept_decisions = self._kept_draws = 0

    def record(self, decisions: list, kept: bool) -> None:
        """One draw's decisions (each with ``accepted``, ``finite``, ``exact`` and
        ``clt_error``); ``kept``: a post-tuning draw."""
        if kept:
            self._nonfinite += sum(not d.finite for d in decisions)
            self._audited += sum(d.audited for d in decisions)
            self._wrong += sum(d.wrong for d in decisions)
            self._kept_decisions += len(decisions)
            self._kept_draws += 1
        if kept and decisions:
            self._accepts.append(sum(d.accepted for d in decisions) / len(decisions))
            early = (d.clt_error for d in decisions if d.finite and not d.exact)
            self._clt.extend(e for e in early if math.isfinite(e))

    def observe(self, stats: Mapping[str, Any]) -> None:
        """Nothing: the decisions are recorded as they are made (:meth:`record`)."""

    def problems(self, sampler: str) -> list[str]:
        """See the class docstring."""
        problems = []
        if self._accepts and np.mean(self._accepts) < STICKY_ACCEPT:
            problems.append(
                f"{sampler}: the proposals were accepted {np.mean(self._accepts):.1%} of the "
                "time after tuning: the chain hardly moves. Tune longer or give a smaller "
                "step_size."
            )
        if self.scales is not None:
            scale, optimum = self.scales()
            if scale < COLLAPSED_SCALE * optimum:
                problems.append(
                    f"{sampler}: tuning shrank the proposal scale to {scale:.3g}, "
                    f"{scale / optimum:.0%} of its optimum on a Gaussian: the preconditioner "
                    "(from the Laplace fit and the tuning draws) does not describe this "
                    "posterior and the chain crawls, so its draws may be far from the target. "
                    "Tune longer, or reparameterise (e.g. a hierarchical model's other "
                    "parameterisation)."
                )
        if self.epsilon > 0 and self._clt and np.mean(self._clt) > self.epsilon:
            problems.append(
                f"{sampler}: the differences' skewness puts the t-test's error probability "
                f"about {np.mean(self._clt):.2g} off its nominal level (epsilon "
                f"{self.epsilon:g}): {self.consequence} Raise batch_size, use "
                "control variates, or lower epsilon."
            )
        audit = self._audit_problem(sampler)
        if audit:
            problems.append(audit)
        if self.epsilon > 0 and self._nonfinite:
            problems.append(
                f"{sampler}: {self._nonfinite} proposals met rows whose log-likelihood was "
                "not finite there (e.g. a bound of the likelihood's support that depends on a "
                "parameter). A test that stops early reads only some rows and can accept a "
                "proposal that such an unread row rules out: use epsilon=0 for this model, or "
                "check the draws against the support."
            )
        return problems

    def _audit_problem(self, sampler: str) -> str | None:
        """The audit's verdict (:func:`~.decision_audit.audit_verdict`)."""
        if not self._kept_draws:
            return None
        per_draw = self._kept_decisions / self._kept_draws
        remedy = "Lower epsilon, or use the residual test (control variates)."
        return audit_verdict(sampler, self._audited, self._wrong, per_draw, remedy)
