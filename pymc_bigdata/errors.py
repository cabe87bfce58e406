"""Exceptions and warnings raised by pymc-bigdata."""

__all__ = [
    "BiasWarning",
    "DivergenceWarning",
    "FullDataWarning",
    "ModeWarning",
    "ModelNotSupportedError",
    "SharedRowsGone",
    "StaleDataError",
]


class ModelNotSupportedError(ValueError):
    """The model cannot be subsampled by rows (the message says why and what to do)."""


class DivergenceWarning(RuntimeWarning):
    """A sampler met a non-finite gradient or log density and rejected the transition."""


class ModeWarning(RuntimeWarning):
    """The MAP search found no usable mode; the step anchors where tuning finds the bulk."""


class BiasWarning(RuntimeWarning):
    """A chain's own statistics show it off its target (heated dynamics, noisy gradients)."""


class FullDataWarning(RuntimeWarning):
    """A subsampling sampler's tuning chose to read every row at each step: its chain is
    then the full-data method (right, but no cheaper than it)."""


class StaleDataError(ValueError):
    """The model's data changed after the step (or its layer) read it."""


class SharedRowsGone(RuntimeError):
    """An unpickled step's in-memory rows were shared by a process of another machine, or
    by one that no longer holds them (:func:`pymc_bigdata.rows_travel_with_pickles`)."""
