"""Compatibility names: the difference terms live in :mod:`pymc_bigdata.model.difference_terms`."""

from __future__ import annotations

from pymc_bigdata.model.difference_terms import TAYLOR_ORDERS, DifferenceTerms, control_variate_sum

__all__ = ["TAYLOR_ORDERS", "DifferenceTerms", "control_variate_sum"]
