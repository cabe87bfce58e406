"""What a chain tells its user: one divergence warning after tuning, and at the chain's end
one ``BiasWarning`` that joins the chain monitor's verdict (:mod:`.diagnostics`) and the
sampler's own alarms (:mod:`.alarms`).

A step holds one :class:`ChainReport` per chain. It sees the statistics of every kept
draw after tuning; it changes no other object.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from pymc.stats.convergence import SamplerWarning

from pymc_bigdata.errors import DivergenceWarning
from pymc_bigdata.step_methods.alarms import ChainAlarm
from pymc_bigdata.step_methods.crawl import CrawlWatch
from pymc_bigdata.step_methods.diagnostics import ChainMonitor, bias_warning
from pymc_bigdata.step_methods.divergence import JudgedDraw

__all__ = ["COMMON_STATS", "ChainReport", "common_stats"]

#: the statistics every step method reports per draw (a sampler adds its own)
COMMON_STATS: dict[str, tuple[Any, list | None]] = {
    "step_size": (np.float64, []),
    "lp_est": (np.float64, []),
    "rows_touched": (np.int64, []),
    "batch_size": (np.int64, []),
    "data_fraction": (np.float64, []),
    "grad_noise_sd": (np.float64, []),
    "noise_share": (np.float64, []),
    "local_noise_share": (np.float64, []),
    "virial": (np.float64, []),
    "cv_order": (np.int64, []),
    "diverging": (bool, []),
    "divergences": (np.int64, []),
    "tune": (bool, []),
    "warning": (SamplerWarning, None),
}


def common_stats(
    step: Any,
    draw: JudgedDraw,
    rows_read: int,
    noise_var: np.ndarray,
    policy: Any,
    measured: np.ndarray | None = None,
) -> dict[str, Any]:
    """A draw's :data:`COMMON_STATS` from the step's settings now (``step_size``,
    ``batch_size``, ``cv_order``, ``tune``, ``layer.n_rows``), the judged draw (its
    log-density estimate, virial and divergence), the rows it read, and the gradient noise
    now (variance per coordinate, z units) with the share of the stationary variance it
    feeds at the step size (the step-size ``policy``'s ``share``; NaN before a measurement):
    ``noise_share`` from the chain's running mean, ``local_noise_share`` from the draw's
    own measurement (``measured``, the per-unit noise ``N^2 s^2`` per coordinate, at the
    draw's batch size), where the draw ended (NaN where it measured none)."""
    noise_share = policy.share(step.step_size, noise_var) if noise_var.size else math.nan
    local = math.nan
    if measured is not None:
        local_var = measured * step.minibatches.batch_factor(step.batch_size)
        local = policy.share(step.step_size, local_var)
    return {
        "step_size": step.step_size,
        "lp_est": draw.log_density,
        "rows_touched": rows_read,
        "batch_size": step.batch_size,
        "data_fraction": rows_read / step.layer.n_rows,
        "grad_noise_sd": float(np.sqrt(noise_var.mean())) if noise_var.size else math.nan,
        "noise_share": noise_share,
        "local_noise_share": local,
        "virial": draw.virial,
        "cv_order": step.cv_order,
        "diverging": draw.diverging,
        "divergences": 0,  # the chain's count after tuning: ChainReport.observe sets it
        "tune": step.tune,
        "warning": None,
    }


class ChainReport:
    """One chain's warnings.

    Parameters
    ----------
    sampler
        The sampler's name, as the messages give it.
    dim
        Parameters sampled (the monitor's virial is per coordinate).
    alarms
        The sampler's own end-of-chain alarms.
    noise_bound
        The gradient noise's largest share of the stationary variance.
    consequence
        What the bias warning says an off-target chain's draws likely are.
    remedy
        What the bias warning tells the user to change (the sampler's own settings).
    stat_names
        The statistics of the monitor that the sampler records (named in the warning).
    crawl
        The watch of the kept draws' effective sample size (:mod:`.crawl`).
    noise_shares
        ``noise_shares(noise)``: the noise share per coordinate at the step size now that a
        draw's noise measurement implies (None where it implies none); None: the sampler's
        step is not noise-limited.
    """

    def __init__(
        self,
        sampler: str,
        dim: int,
        alarms: list[ChainAlarm],
        noise_bound: float,
        consequence: str,
        crawl: CrawlWatch,
        remedy: str = "Raise batch_size, lower step_size, use more tuning draws, or check "
        "the model",
        stat_names: tuple[str, ...] = ("virial", "noise_share", "kinetic_energy"),
        noise_shares: Callable[[Any], np.ndarray | None] | None = None,
    ):
        self.sampler = sampler
        self.crawl = crawl
        self.monitor = ChainMonitor(dim)
        self.noise_shares = noise_shares
        self.alarms = alarms
        self.noise_bound = noise_bound
        self.consequence = consequence
        self.remedy, self.stat_names = remedy, stat_names
        self.warned_divergence = False
        self.divergences = 0

    def observe(
        self,
        stats: dict[str, Any],
        kinetic_temperature: float,
        position: np.ndarray,
        noise: Any = None,
    ) -> None:
        """A kept draw after tuning (at ``position``, the model's coordinates, as the draws
        are returned): the monitor and each alarm see its statistics, the crawl watch its
        position, the monitor the noise share its ``noise`` measurement (a
        :class:`~.gradient_oracle.NoiseSample`, or None) implies unless it diverged. Sets
        the stat ``divergences``, the chain's diverging draws so far after tuning (as NUTS
        counts them)."""
        self.divergences += bool(stats["diverging"])
        stats["divergences"] = self.divergences
        self.monitor.add(stats["virial"], stats["noise_share"], kinetic_temperature)
        if self.noise_shares is not None and noise is not None and not stats["diverging"]:
            shares = self.noise_shares(noise)
            if shares is not None:
                self.monitor.add_noise(shares)
        self.crawl.add(position)
        for alarm in self.alarms:
            alarm.observe(stats)

    def divergence(self, message: str) -> None:
        """A divergence after tuning: warn once per chain (the draws' ``diverging`` stat
        counts them all)."""
        if self.warned_divergence:
            return
        self.warned_divergence = True
        warnings.warn(message, DivergenceWarning, stacklevel=4)

    def end_of_chain(self) -> SamplerWarning | None:
        """After the chain's last draw: one bias warning naming every problem found (warned
        now, and returned for PyMC's end-of-sampling report), or None."""
        verdict = self.monitor.verdict(
            self.sampler, self.noise_bound, self.consequence, self.remedy, self.stat_names
        )
        problems = [] if verdict is None else [verdict]
        for alarm in self.alarms:
            problems += alarm.problems(self.sampler)
        crawling = self.crawl.problem(self.sampler)
        problems += [] if crawling is None else [crawling]
        if not problems:
            return None
        return bias_warning(" ".join(problems), stacklevel=4)  # the step's step()
