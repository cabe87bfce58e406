"""The README's demo runs end to end (at a small size) and reports what it promises."""

from __future__ import annotations

from pymc_bigdata import demo


def test_demo_small(capsys):
    """The demo prints a summary table, the wall time and the error against Laplace."""
    demo.main(["--rows", "20000", "--coefs", "3", "--seed", "1"])
    out = capsys.readouterr().out
    assert "beta[2]" in out
    assert "wall time" in out
    line = next(s for s in out.splitlines() if s.startswith("max |mean - Laplace|"))
    max_err = float(line.split("=")[1].split(";")[0])
    assert max_err < 0.3  # 2,000 draws: MCSE ~0.025 sd, so a correct run is far below this
    assert "divergences 0" in out
