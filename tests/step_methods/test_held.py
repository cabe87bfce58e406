"""The held-variable configurations' fits (step_methods/held.py)."""

from __future__ import annotations

from pymc_bigdata.step_methods import held
from pymc_bigdata.step_methods.held import Configuration, HeldConfigurations


def _fit(tag: str) -> Configuration:
    return Configuration(laplace=tag, anchor=None, cv_order=1, map_problem=None)


def test_fits_are_kept_and_the_oldest_dropped_beyond_the_capacity(monkeypatch):
    """A configuration met again reuses its fit; past MAX_CONFIGURATIONS the oldest goes
    (the step's own is the oldest), and a new chain restarts from the step's own key."""
    monkeypatch.setattr(held, "MAX_CONFIGURATIONS", 3)
    configurations = HeldConfigurations(b"a", _fit("a"))
    configurations.add(b"b", _fit("b"))
    configurations.add(b"c", _fit("c"))
    assert configurations.get(b"b").laplace == "b"
    assert configurations.get(b"d") is None
    configurations.add(b"d", _fit("d"))
    assert set(configurations.fits) == {b"b", b"c", b"d"}
    configurations.current = b"d"
    configurations.fits.clear()  # a copy: the kept fits are untouched
    assert len(configurations.fits) == 3
    configurations._fits[b"a"] = _fit("a")  # the step's own fit, met again and re-fitted
    assert configurations.restart().laplace == "a" and configurations.current == b"a"
