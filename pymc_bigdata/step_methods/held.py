"""The Laplace fits of a compound step's held-variable configurations.

A step that samples the continuous variables beside a step for the discrete ones (e.g.
:class:`~pymc_bigdata.AusterityGibbs`) targets another conditional posterior each time the
held (discrete) values change: its mode, curvature and control variates differ. Each
configuration of the held values gets its own Laplace fit and anchor, found the first time it
is met (a MAP search from the chain's last point) and kept (at most ``MAX_CONFIGURATIONS``;
the oldest is dropped beyond). The step holds one :class:`HeldConfigurations`: at each of
PyMC's steps it holds the point's held values (:meth:`HeldConfigurations.hold`) and, in
another configuration, stands on that configuration's fit and restarts its kernel in the
fit's coordinates; the step size (in those coordinates) and the batch size carry over. A new
chain starts from the step's own configuration (:meth:`HeldConfigurations.restart`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from pymc_bigdata.model.anchor import Anchor
from pymc_bigdata.model.minibatch import MinibatchModel
from pymc_bigdata.step_methods.preconditioner import Preconditioner

__all__ = ["MAX_CONFIGURATIONS", "Configuration", "HeldConfigurations"]

#: Laplace fits kept for configurations of held (discrete) variables; the oldest is dropped
#: beyond (a configuration met again is then re-fitted)
MAX_CONFIGURATIONS = 256


class Configuration(NamedTuple):
    """One configuration's fit: the Laplace fit, the anchor, the control-variate order and
    what the MAP search found wrong (None: a usable mode)."""

    laplace: Preconditioner
    anchor: Anchor | None
    cv_order: int
    map_problem: str | None

    @property
    def has_curvature(self) -> bool:
        """Whether the anchor holds the dense full-data Hessian (second order possible)."""
        return self.anchor is not None and self.anchor.loglik_hessian is not None


class HeldConfigurations:
    """The fits by configuration key (the layer's ``held_key``), and the current key."""

    def __init__(self, key: bytes, initial: Configuration):
        self.initial_key = self.current = key
        self._fits = {key: initial}

    @property
    def fits(self) -> dict[bytes, Configuration]:
        """The kept fits by configuration key (a copy)."""
        return dict(self._fits)

    def restart(self) -> Configuration:
        """A new chain: back to the step's own configuration."""
        self.current = self.initial_key
        return self._fits[self.initial_key]

    def hold(self, layer: MinibatchModel, point: dict) -> bool:
        """Hold ``point``'s values of the layer's held variables; whether they are another
        configuration than the current one (the step then :meth:`switch`-es to it)."""
        layer.hold(layer.held_from_point(point))
        return layer.held_key != self.current

    def get(self, key: bytes) -> Configuration | None:
        """The configuration's fit, if it was met before (and kept)."""
        return self._fits.get(key)

    def switch(self, key: bytes, fit: Callable[[], Configuration]) -> Configuration:
        """Make ``key`` the current configuration; its fit, from ``fit()`` the first time it
        is met (and kept)."""
        config = self._fits.get(key)
        if config is None:
            config = fit()
            self.add(key, config)
        self.current = key
        return config

    def add(self, key: bytes, fit: Configuration) -> None:
        """Keep a new configuration's fit (dropping the oldest beyond the capacity)."""
        if len(self._fits) >= MAX_CONFIGURATIONS:
            self._fits.pop(next(iter(self._fits)))
        self._fits[key] = fit
