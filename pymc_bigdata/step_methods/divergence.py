"""Divergence detection: when a draw has left the posterior.

A draw diverges when its kernel meets a non-finite value, or when :class:`DivergenceCheck`
finds it blown up: far out in the preconditioned coordinates, a virial or a kinetic
temperature far from 1, a measured log-density estimate that is not finite, or one that fell
by more than ``LOGP_DROP_DIVERGENCE`` (plus ten running sds of the estimates) since the last.
What the step then does depends on whether its kernel has an accept test (see
``SubsamplingStep.accept_step``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from pymc_bigdata.step_methods.gradient_oracle import DrawRecord

__all__ = [
    "BLOWUP_TEMPERATURE",
    "BLOWUP_VIRIAL",
    "BLOWUP_Z",
    "LOGP_DROP_DIVERGENCE",
    "DivergenceCheck",
    "JudgedDraw",
    "LogDensityTrack",
    "kept_divergence_message",
    "rejected_divergence_message",
]

#: a draw whose log-density estimate falls by more than this is a divergence (NUTS: 1000)
LOGP_DROP_DIVERGENCE = 1000.0

#: a position this many preconditioned sds from the centre is a blow-up (a divergence)
BLOWUP_Z = 1e4

#: a virial ``-z . grad / d`` above this is a blow-up (a divergence); at equilibrium it is
#: 1 +- sqrt(2 / d), and a chain started this far out in z would have ``|z|`` ~ 1000
BLOWUP_VIRIAL = 1e6

#: a kinetic temperature (``2 K / d`` over its equilibrium value) above this is a blow-up:
#: at equilibrium it is ``chi2_d / d`` (1 +- sqrt(2 / d); above 100 with probability under
#: 1e-20 even at d = 1), and a chain falling from a Laplace draw into the bulk gains a few
#: units at most. Without it a draw whose momentum exploded but whose position had not yet
#: left was kept, and the chain restarted from it diverged ever after: EWSG on the
#: non-centred hierarchical target accepted draws at temperatures 5e6 and (under an earlier
#: bound of 1e4) 3.4e3, the latter with tau at 6e-14, and every later draw diverged
BLOWUP_TEMPERATURE = 100.0


class JudgedDraw(NamedTuple):
    """A draw after the blow-up test: where the chain is (``z0`` for a rejected
    divergence), its log-density estimate and virial (NaN on a divergence)."""

    z: np.ndarray
    log_density: float
    virial: float
    diverging: bool


class DivergenceCheck:
    """The blow-up test of a chain's draws, with the recent log-density estimates it
    compares against (:class:`LogDensityTrack`).

    Parameters
    ----------
    sampler
        The sampler's name, as the warnings give it.
    kept
        Whether a diverging draw is kept: the kernel's own accept test decided (see
        ``SubsamplingStep.accept_step``); else it is rejected, the chain back at its start.
    """

    def __init__(
        self, sampler: str, kept: bool, remedy: str = "lower step_size or raise batch_size"
    ):
        self.sampler, self.kept, self.remedy = sampler, kept, remedy
        self.track = LogDensityTrack()

    def restart(self) -> None:
        """Another target (e.g. other values of held variables), or a base re-measured after
        a rejected draw: forget the estimates."""
        self.track = LogDensityTrack()

    def base_unsettled(self) -> bool:
        """Whether the base is a single estimate (no running sd to judge a drop by)."""
        return self.track.count <= 1

    def set_base(self, log_density: float) -> None:
        """A log-density estimate measured where the chain is (not a kernel's draw): the
        next draw's base, if finite."""
        if math.isfinite(log_density):
            self.track.add(log_density)

    def judge(
        self,
        z0: np.ndarray,
        z: np.ndarray,
        finite: bool,
        record: DrawRecord,
        kinetic_temperature: float,
        *,
        early: bool,
    ) -> JudgedDraw:
        """The kernel's draw from ``z0`` to ``z``: diverging where a value was not finite or
        it blew up (:meth:`blew_up`); a diverging draw is rejected (back at ``z0``) unless
        ``kept``. A good draw's log-density estimate becomes the next draw's base."""
        virial = record.virial()
        if not finite or self.blew_up(z, record, virial, kinetic_temperature, early):
            return JudgedDraw(z if self.kept else z0, math.nan, math.nan, True)
        if math.isfinite(record.log_density):
            self.track.add(record.log_density)
        return JudgedDraw(z, record.log_density, virial, False)

    def message(self, blew_up: bool) -> str:
        """The warning for a diverging draw (``blew_up``: its values were finite, the
        blow-up test fired)."""
        if self.kept:
            return kept_divergence_message(self.sampler, blew_up, self.remedy)
        return rejected_divergence_message(self.sampler, self.remedy)

    def blew_up(
        self,
        z: np.ndarray,
        record: DrawRecord,
        virial: float,
        kinetic_temperature: float,
        early: bool,
    ) -> bool:
        """Whether the draw at ``z`` (its evaluations ``record``) left the posterior;
        ``early``: judge log-density drops from the first estimate on (control variates)."""
        lp = record.log_density
        measured = record.noise is not None
        if float(np.max(np.abs(z))) > BLOWUP_Z or (measured and not math.isfinite(lp)):
            return True
        if record.grad is not None and not abs(virial) < BLOWUP_VIRIAL:
            return True
        if kinetic_temperature > BLOWUP_TEMPERATURE:  # NaN (no momentum): not judged
            return True
        return self.track.dropped(lp, early=early)


class LogDensityTrack:
    """Recent log-density estimates, to call a sudden fall a divergence.

    A fall counts when it exceeds ``LOGP_DROP_DIVERGENCE`` plus ten times the running sd of
    the estimates (which holds the posterior's own spread of log densities and the
    minibatch estimator's noise, large without control variates); checked from the tenth draw.
    """

    WARM = 10
    WEIGHT = 0.05

    def __init__(self):
        self.count = 0
        self.last = math.nan
        self._mean = 0.0
        self._var = 0.0

    def dropped(self, lp: float, early: bool = False) -> bool:
        """``early``: also in the first ``WARM`` draws, from the first recorded estimate on
        (for estimates with control variates, whose own noise is small near the anchor)."""
        if self.count < (1 if early else self.WARM) or not math.isfinite(lp):
            return False
        return lp < self.last - (LOGP_DROP_DIVERGENCE + 10.0 * math.sqrt(self._var))

    def add(self, lp: float) -> None:
        self.count += 1
        self.last = lp
        weight = max(self.WEIGHT, 1.0 / self.count)
        delta = lp - self._mean
        self._mean += weight * delta
        self._var = (1.0 - weight) * (self._var + weight * delta * delta)


def kept_divergence_message(sampler: str, blew_up: bool, remedy: str = "lower step_size") -> str:
    """The warning for a divergence that a sampler with an accept step keeps."""
    what = (
        "an accepted move reached a point that looks like a numerical blow-up (far out "
        "in the preconditioned coordinates, or a log-density drop of more than "
        f"{LOGP_DROP_DIVERGENCE:g}); the chain kept it, since its accept test decided"
        if blew_up
        else "a proposal met a non-finite value or a large energy error and was rejected"
    )
    return f"{sampler}: {what}; the draw is recorded as diverging. If this repeats, {remedy}."


def rejected_divergence_message(
    sampler: str, remedy: str = "lower step_size or raise batch_size"
) -> str:
    """The warning for a rejected (restarted) divergent draw."""
    return (
        f"{sampler}: a non-finite value or a log-density drop of more than "
        f"{LOGP_DROP_DIVERGENCE:g} appeared; the draw was rejected and recorded as "
        f"diverging. If this repeats, {remedy}."
    )
