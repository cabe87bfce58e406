"""End-of-chain bias alarms from a sampler's own statistics.

A subsampling sampler has no accept/reject step to tell it that it is off target, but
three of its statistics have known equilibrium values:

* the **virial** ``-(z - c) . grad log p(z) / d`` (the configurational temperature) averages
  exactly 1 under the target for any smooth density (integration by parts), and the
  minibatch gradient is unbiased, so its average over draws estimates it without bias;
* the **kinetic temperature** ``2 K / d`` of a momentum-carrying kernel averages 1;
* the **noise share** (the gradient noise's share of the stationary variance, from the
  measured noise) should stay below the step's ``noise_bound``. Tuning chooses the step from
  its own measurements, so the check uses only the measurements made after tuning (every
  measuring draw's, at the kept step size): their mean share per coordinate. The noise of a
  small minibatch is heavy-tailed (the rows of a small group enter a 10-row minibatch in
  one draw of ~50, with weight ``N / n``) and grows with the distance from the control
  variates' anchor, so tuning's mean can come out several times too low; on the non-centred
  hierarchy with 10-row minibatches (``benchmarks/alarm_calibration.py``) one SGHMC chain
  took a step 3 times its twin's, and its measurements after tuning put the share of one
  group's effect at 0.18 against the bound 0.05, with that effect's sd 23 % too wide.

A chain whose dynamics are heated by gradient noise (rare rows, a step size too large for
the noise) shows a virial and a kinetic temperature far above 1.  The check allows
``max(ALARM_TOLERANCE, ALARM_Z * se)`` around 1, ``se`` from batch means.

In many dimensions a small heating adds up. Draws whose spread is ``1 + delta`` times the
posterior's in each of ``d`` directions have a virial near ``1 + delta`` and a log density
``delta d / 2`` below the posterior's on average, where the posterior's own log density
has an sd near ``sqrt(d / 2)``: the draws sit ``(virial - 1) sqrt(d / 2)`` of those sds
off, and a parameter the likelihood ties to all the directions (a residual scale) moves
with it. On crossed ratings (d = 4,004) SGLD's virial of 1.08 (3.6 such sds) came with the
residual scale 1.08 posterior sds off; on 1,000 groups (d = 1,003) its virial of 1.04
(0.9 sds) came with every coordinate in its bars. So the virial's allowance is also at
most ``ENERGY_SHIFT_ALARM / sqrt(d / 2)`` (binding above d = 356).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "ALARM_TOLERANCE",
    "ALARM_Z",
    "ENERGY_SHIFT_ALARM",
    "MIN_FRESH_MEASUREMENTS",
    "NOISE_ALARM_FACTOR",
    "NOISE_ALARM_SE",
    "ChainMonitor",
    "bias_warning",
    "temperature_alarm",
    "virial_tolerance",
]

#: allowed relative deviation of the virial / kinetic temperature from 1
ALARM_TOLERANCE = 0.15

#: ... or this many standard errors, whichever is larger
ALARM_Z = 4.0

#: the virial's allowance is at most this many posterior sds of the log density, divided
#: by ``sqrt(d / 2)`` (see the module docstring)
ENERGY_SHIFT_ALARM = 2.0

#: the noise share may exceed the step's bound by this factor before an alarm
NOISE_ALARM_FACTOR = 3.0

#: the mean share of the measurements after tuning is judged from at least this many
MIN_FRESH_MEASUREMENTS = 20

#: ... and only where it exceeds the limit by this many of its standard errors: the noise
#: of small minibatches is heavy-tailed, and one measurement in 100 can carry the mean
NOISE_ALARM_SE = 2.0

_BATCHES = 20


def temperature_alarm(
    values: np.ndarray, tolerance: float = ALARM_TOLERANCE
) -> tuple[float, float, bool]:
    """Mean, batch-means standard error, and whether the mean is off 1 by more than
    ``max(tolerance, ALARM_Z * se)``."""
    values = np.asarray(values, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) < 2 * _BATCHES:
        return math.nan, math.nan, False
    usable = len(values) - len(values) % _BATCHES
    batch_means = values[:usable].reshape(_BATCHES, -1).mean(axis=1)
    mean = float(values.mean())
    se = float(batch_means.std(ddof=1) / math.sqrt(_BATCHES))
    return mean, se, abs(mean - 1.0) > max(tolerance, ALARM_Z * se)


def virial_tolerance(dim: int) -> float:
    """The virial's allowance around 1 in ``dim`` dimensions (see the module docstring)."""
    return min(ALARM_TOLERANCE, ENERGY_SHIFT_ALARM / math.sqrt(max(dim, 1) / 2.0))


class ChainMonitor:
    """Collects the alarm statistics of one chain's post-tuning draws."""

    def __init__(self, dim: int):
        self.dim = dim
        self.virial: list[float] = []
        self.noise_share: list[float] = []
        self.kinetic: list[float] = []
        self._fresh_sum = np.zeros(dim)
        self._fresh_sum_sq = np.zeros(dim)
        self._fresh_count = 0

    def add(self, virial: float, noise_share: float, kinetic_temperature: float) -> None:
        self.virial.append(virial)
        self.noise_share.append(noise_share)
        self.kinetic.append(kinetic_temperature)

    def add_noise(self, shares: np.ndarray) -> None:
        """The noise share per coordinate that one measurement after tuning implies at the
        kept step size (non-finite ones are left out)."""
        if np.all(np.isfinite(shares)):
            self._fresh_sum += shares
            self._fresh_sum_sq += shares**2
            self._fresh_count += 1

    def noise_problem(self, noise_bound: float) -> str | None:
        """The noise-share alarm: in some coordinate, the mean share of the measurements
        after tuning is above ``NOISE_ALARM_FACTOR`` times the bound by more than
        ``NOISE_ALARM_SE`` of its standard errors (from ``MIN_FRESH_MEASUREMENTS`` on;
        before, the median of the draws' running-mean ``noise_share`` stat decides)."""
        limit = NOISE_ALARM_FACTOR * noise_bound
        count = self._fresh_count
        if count >= MIN_FRESH_MEASUREMENTS:
            mean = self._fresh_sum / count
            spread = np.maximum(self._fresh_sum_sq / count - mean**2, 0.0) * count / (count - 1)
            excess = mean - NOISE_ALARM_SE * np.sqrt(spread / count)
            worst = int(np.argmax(excess))
            if not excess[worst] > limit:
                return None
            return (
                f"the gradient noise measured after tuning ({count} measurements) feeds "
                f"{mean[worst]:.0%} of the variance of one (whitened) coordinate on average, "
                f"at least {excess[worst]:.0%} at {NOISE_ALARM_SE:g} standard errors (bound "
                f"{noise_bound:.0%})"
            )
        shares = np.array(self.noise_share)
        shares = shares[np.isfinite(shares)]
        if not (shares.size and float(np.median(shares)) > limit):
            return None
        return (
            f"gradient noise feeds {float(np.median(shares)):.0%} of the variance of the "
            f"noisiest coordinate (bound {noise_bound:.0%})"
        )

    def verdict(
        self,
        sampler: str,
        noise_bound: float,
        consequence: str = "Its draws are likely too dispersed.",
        remedy: str = "Raise batch_size, lower step_size, use more tuning draws, or check "
        "the model",
        stat_names: tuple[str, ...] = ("virial", "noise_share", "kinetic_energy"),
    ) -> str | None:
        """A warning message when the chain looks off target, else None. ``remedy`` is what
        the sampler's user can change; ``stat_names`` the statistics the sampler records."""
        problems = []
        mean, se, off = temperature_alarm(np.array(self.virial), virial_tolerance(self.dim))
        if off:
            problem = f"mean virial {mean:.3g} (± {se:.2g}) where 1 is expected"
            if abs(mean - 1.0) <= ALARM_TOLERANCE:  # off only through the dimension
                shift = abs(mean - 1.0) * math.sqrt(self.dim / 2.0)
                problem += (
                    f"; in {self.dim} dimensions that puts the draws' log density about "
                    f"{shift:.1f} of its posterior sds off: a small excess spread in every "
                    "direction adds up, and a parameter tied to all of them (e.g. a residual "
                    "scale) moves with it"
                )
            problems.append(problem)
        mean, se, off = temperature_alarm(np.array(self.kinetic))
        if off:
            problems.append(f"mean kinetic temperature {mean:.3g} (± {se:.2g}) where 1 is expected")
        noisy = self.noise_problem(noise_bound)
        problems += [] if noisy is None else [noisy]
        if not problems:
            return None
        return (
            f"{sampler}: this chain's own statistics show it off its target: "
            + "; ".join(problems)
            + f". {consequence} {remedy} (see the sampler statistics "
            + ", ".join(f"'{name}'" for name in stat_names)
            + ")."
        )


def bias_warning(message: str, stacklevel: int = 4):
    """Warn now (a :class:`~pymc_bigdata.BiasWarning`), and return the same message as a
    PyMC ``SamplerWarning`` for its end-of-sampling report."""
    import warnings

    from pymc.stats.convergence import SamplerWarning, WarningType

    from pymc_bigdata.errors import BiasWarning

    warnings.warn(message, BiasWarning, stacklevel=stacklevel)
    return SamplerWarning(WarningType.CONVERGENCE, message, "warn")
