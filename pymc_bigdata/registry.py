"""Registration with PyMC's automatic step assignment.

Importing :mod:`pymc_bigdata` appends :class:`~pymc_bigdata.SGLD`,
:class:`~pymc_bigdata.SGHMC`, :class:`~pymc_bigdata.SBPS`, :class:`~pymc_bigdata.pSBPS`,
:class:`~pymc_bigdata.HMCECS`, :class:`~pymc_bigdata.EWSG` and
:class:`~pymc_bigdata.AusterityMH` (continuous variables) and
:class:`~pymc_bigdata.AusterityGibbs` (binary ones) to PyMC's ``STEP_METHODS``.
Their competence is ``COMPATIBLE``, below NUTS's ``PREFERRED``, so ``pm.sample()`` never picks
them on its own.
Inside ``with pmbd.prefer(pmbd.SGHMC):`` they claim every continuous variable, so
``pm.sample(sghmc={"batch_size": 500})`` configures them by name like PyMC's own samplers.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pymc.step_methods as pm_steps
from pymc.step_methods.compound import Competence

from pymc_bigdata.step_methods.austerity import AusterityMH
from pymc_bigdata.step_methods.austerity_gibbs import AusterityGibbs
from pymc_bigdata.step_methods.base import SubsamplingStep
from pymc_bigdata.step_methods.ewsg import EWSG
from pymc_bigdata.step_methods.hmcecs import HMCECS
from pymc_bigdata.step_methods.sbps import SBPS, pSBPS
from pymc_bigdata.step_methods.sghmc import SGHMC
from pymc_bigdata.step_methods.sgld import SGLD

__all__ = ["prefer", "register"]


def register() -> None:
    """Append our step methods to ``pymc.step_methods.STEP_METHODS`` (idempotent)."""
    for cls in (SGLD, SGHMC, SBPS, pSBPS, HMCECS, EWSG, AusterityMH, AusterityGibbs):
        if cls not in pm_steps.STEP_METHODS:
            pm_steps.STEP_METHODS.append(cls)


@contextmanager
def prefer(step_class: type[SubsamplingStep]) -> Iterator[None]:
    """Make ``step_class`` the automatic choice for continuous variables within the block."""
    register()
    original = step_class.__dict__.get("competence")

    def ideal(var, has_grad):
        if SubsamplingStep.competence(var, has_grad) == Competence.INCOMPATIBLE:
            return Competence.INCOMPATIBLE
        return Competence.IDEAL

    step_class.competence = staticmethod(ideal)
    try:
        yield
    finally:
        if original is None:
            del step_class.competence
        else:
            step_class.competence = original
