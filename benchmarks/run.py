"""Side-by-side benchmark of the subsampling samplers against full-data NUTS (and peers).

One process, one data set per size: a logistic regression with ``d = 30`` correlated
features, sampled by

* ``pymc_bigdata.SGHMC``, ``SGLD``, ``SBPS``, ``HMCECS`` (perturbed and signed) and ``EWSG``
  with their defaults (``cores=1`` and ``cores=2``), and perturbed ``HMCECS`` at NumPyro's subsample
  size and blocks (``m = 1000``, ``G = 100``: ``hmcecs_m1000``), and ``SGHMC`` with
  ``local_batch=True`` (``sghmc_local``),
* PyMC's own NUTS on the full data (``pm.sample(nuts_sampler="pymc")``),
* PyMC's minibatch ADVI (mean-field, ``pm.Minibatch`` and ``pm.fit``),
* optional peers, when importable: BlackJAX SGLD / SGHMC (control-variate gradients,
  step size picked on a grid), NumPyro HMCECS and nutpie's full-data NUTS.

Every method is scored against a reference posterior (Laplace fit refined by importance
sampling, cached under ``benchmarks/results/``) on accuracy (error of the means and ratio
of the standard deviations) and efficiency (minimum bulk ESS per second and per pass over
the data).  See ``docs/benchmarks.md`` for the protocol.

The code: ``protocol.py`` (settings, command line, methods, data and model),
``reference.py`` (the reference posterior), ``scoring.py`` (what is measured),
``ours.py`` (our step methods), ``peers_nuts.py``, ``peers_blackjax.py``,
``peers_numpyro.py``, ``peers_nutpie.py`` and ``peers_advi.py`` (the others), ``report.py``
(tables and output files).

Usage::

    .venv/bin/python benchmarks/run.py                 # N = 1e5 and 1e6
    .venv/bin/python benchmarks/run.py --sizes 1e5     # one size
    .venv/bin/python benchmarks/run.py --quick         # smoke run, N = 2e4, short chains
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial

from ours import run_ours
from peers_advi import run_advi
from peers_blackjax import run_blackjax
from peers_numpyro import run_hmcecs
from peers_nutpie import run_nutpie
from peers_nuts import run_nuts
from protocol import OURS, Config, Dataset, build_model, make_data, parse_args
from reference import Reference, load_or_compute_reference
from report import Section, format_reference, git_revision, output_path, write_outputs
from scoring import MethodResult, add_nuts_ratios

Runner = Callable[[Dataset, Reference, Config], list[MethodResult]]

#: the runner of every method of the command line
RUNNERS: dict[str, Runner] = {
    **{kind: partial(run_ours, kind) for kind in OURS},
    "nuts": run_nuts,
    "blackjax": run_blackjax,
    "numpyro": run_hmcecs,
    "nutpie": run_nutpie,
    "advi": run_advi,
}


def run_size(n_rows: int, config: Config) -> tuple[Reference, list[MethodResult]]:
    """Generate the data of one size, get its reference and run every selected method.

    Parameters
    ----------
    n_rows
        Number of rows N.
    config
        The benchmark's settings.

    Returns
    -------
    Reference, list of MethodResult
    """
    data = make_data(n_rows, config.seed)
    print(f"\n=== N = {n_rows:,}: reference posterior", flush=True)
    ref = load_or_compute_reference(data, build_model(data), config.is_samples, config.is_df)
    print("  " + format_reference(n_rows, ref), flush=True)
    results: list[MethodResult] = []
    for name in config.methods:
        print(f"--- N = {n_rows:,}: {name}", flush=True)
        t0 = time.perf_counter()
        results += RUNNERS[name](data, ref, config)
        print(f"  done in {time.perf_counter() - t0:.1f} s", flush=True)
    add_nuts_ratios(results)
    return ref, results


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmark for every requested size and write the report.

    Parameters
    ----------
    argv
        Command-line arguments (default: ``sys.argv[1:]``).
    """
    revision = git_revision()  # the code imported at the start is the code that runs
    config = parse_args(argv, description=__doc__.split("\n\n")[0])
    sections: list[Section] = []
    for n_rows in config.sizes:
        ref, results = run_size(n_rows, config)
        sections.append((n_rows, ref, results))
        # keep partial results if a later size fails
        markdown = write_outputs(config, sections, revision)
    print()
    print(markdown)
    print(f"written: {output_path(config, '.md')} and .json")


if __name__ == "__main__":
    main()
