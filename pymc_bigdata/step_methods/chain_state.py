"""One chain's collaborators, made afresh for each chain (``setup_chain``, ``reset_tuning``).

:func:`new_chain_state` builds them from what the sampler declares (:class:`ChainOwner`): the
measured gradient noise (:mod:`.noise`), the blow-up test (:mod:`.divergence`), the chain's
report with the sampler's alarms (:mod:`.chain_report`), its step-size policy
(:mod:`.step_size`) and the adaptation that tunes the step with them
(:mod:`.chain_adaptation`: the tuning windows and, where the sampler declares one, the
stability watch). The step keeps each as an attribute of its own, so that ``astep`` reaches
them directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import numpy as np

from pymc_bigdata.step_methods.alarms import ChainAlarm
from pymc_bigdata.step_methods.chain_adaptation import ChainAdaptation, Tunable
from pymc_bigdata.step_methods.chain_report import ChainReport
from pymc_bigdata.step_methods.crawl import CrawlWatch
from pymc_bigdata.step_methods.divergence import DivergenceCheck
from pymc_bigdata.step_methods.gradient_oracle import NoiseSample
from pymc_bigdata.step_methods.noise import NoiseAccumulator, measured_variance
from pymc_bigdata.step_methods.stability import StabilityWatch

__all__ = ["ChainOwner", "ChainState", "new_chain_state"]


class ChainOwner(Tunable, Protocol):
    """What :func:`new_chain_state` reads of a step (the declarations of
    :class:`~.base.SubsamplingStep`), besides what its adaptation tunes."""

    noise_bound: float
    #: rows per minibatch now (the noise check turns a measurement into this batch's noise)
    batch_size: int
    #: whether the kernel's own accept test decides (a diverging draw is then kept)
    accept_step: bool
    #: what the end-of-chain alarm says an off-target chain's draws likely are
    off_target_consequence: str
    #: what the end-of-chain alarm tells the user to change
    off_target_remedy: str
    #: what the divergence warning tells the user to change if divergences repeat
    divergence_remedy: str
    #: whether tuning halves the step size after divergences and hot blocks
    watches_stability: bool

    def _make_alarms(self) -> list[ChainAlarm]: ...

    def _make_step_policy(self) -> Any: ...

    def _reset_kernel_state(self) -> None: ...


class ChainState(NamedTuple):
    """One chain's collaborators (see the module docstring)."""

    noise: NoiseAccumulator
    divergence: DivergenceCheck
    report: ChainReport
    policy: Any
    adaptation: ChainAdaptation


def new_chain_state(
    step: ChainOwner, *, tune: int, draws: int, fixed: tuple[bool, bool]
) -> ChainState:
    """A chain's fresh collaborators for ``step``, with the alarms and the step-size policy
    it declares (``_make_alarms()``, then ``_make_step_policy()``; the step's settings are
    back at their initial values by then).

    Parameters
    ----------
    step
        The step they serve (its dimension, noise bound and declarations; its adaptation
        tunes it and restarts its kernel, ``_reset_kernel_state``).
    tune
        Tuning draws the adaptation's windows cover (0: no windows).
    draws
        Draws the chain keeps (the report's crawl watch holds them).
    fixed
        Whether a given step size and a given number of transitions per draw are kept.
    """
    dim = step.layer.dim
    noise = NoiseAccumulator(dim)
    name, consequence = type(step).__name__, step.off_target_consequence
    divergence = DivergenceCheck(name, kept=step.accept_step, remedy=step.divergence_remedy)
    stat_names = tuple(
        s for s in ("virial", "noise_share", "kinetic_energy") if s in step.stats_dtypes[0]
    )
    policy = step._make_step_policy()
    report = ChainReport(
        name,
        dim,
        step._make_alarms(),
        step.noise_bound,
        consequence,
        CrawlWatch(dim, draws, step.layer.coordinate_label, step.layer.var_sizes),
        step.off_target_remedy,
        stat_names,
        noise_shares=_fresh_noise_shares(step, policy),
    )
    adaptation = ChainAdaptation(
        step,
        tune=tune,
        policy=policy,
        noise=noise,
        stability=StabilityWatch(dim) if step.watches_stability else None,
        restart_kernel=step._reset_kernel_state,
        fixed=fixed,
    )
    return ChainState(noise, divergence, report, policy, adaptation)


def _fresh_noise_shares(
    step: ChainOwner, policy: Any
) -> Callable[[NoiseSample], np.ndarray | None]:
    """``shares(noise)``: the noise share per coordinate that one measurement implies at the
    step's size, batch size and control-variate order now (the policy's noise model; NaN
    for a policy without one), for the report's check of tuning's estimate."""

    def shares(noise: NoiseSample) -> np.ndarray | None:
        unit = measured_variance(noise, step.cv_order)
        if unit is None:
            return None
        factor = step.minibatches.batch_factor(step.batch_size)
        return policy.shares(step.step_size, unit * factor)

    return shares
