"""Exceptions and warnings raised by pymc-bigdata."""

__all__ = ["DivergenceWarning", "ModelNotSupportedError"]


class ModelNotSupportedError(ValueError):
    """The model cannot be subsampled by rows (the message says why and what to do)."""


class DivergenceWarning(RuntimeWarning):
    """A sampler met a non-finite gradient or log density and rejected the transition."""
