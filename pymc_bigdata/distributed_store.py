"""Finished chains of a :func:`~pymc_bigdata.sample_dask` run, kept on disk as they finish.

A store is a directory. ``manifest.json`` holds the run's *fingerprint* (what must be equal
for the stored chains to be the chains of this run: package versions, draws, tuning, chain
count, the model's variables, the step methods, every chain's generator state and initial
point, and a digest of the model's data); ``chain-<i>.pickle`` holds chain ``i``'s recorded
draws, statistics and warnings, written by the caller the moment the chain's result comes
back (to a temporary file first, then renamed, so a file in the store is always whole).

:meth:`ChainStore.open` refuses a store whose fingerprint differs, naming what differs;
:func:`read_store` reads the finished chains as an ArviZ ``DataTree`` without the model.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from pymc_bigdata.data import row_column

__all__ = ["EDGE_ROWS", "ChainStore", "read_store", "run_fingerprint"]

#: rows read from each end of a row source (pmbd.Data) for the store's data digest: a file's
#: other rows are not read, so a change only between them is not detected
EDGE_ROWS = 1024

_FORMAT = 1
_MANIFEST = "manifest.json"


def run_fingerprint(
    *,
    model: Any,
    step: Any,
    traces: Sequence[Any],
    start: Sequence[dict[str, np.ndarray]],
    rng_states: Sequence[Any],
    draws: int,
    tune: int,
) -> dict[str, Any]:
    """What must be equal for stored chains to be the chains of this run (JSON-able)."""
    trace = traces[0]
    return {
        "format": _FORMAT,
        "versions": {name: _version(name) for name in ("pymc-bigdata", "pymc", "pytensor")}
        | {"numpy": np.__version__},
        "draws": int(draws),
        "tune": int(tune),
        "chains": len(start),
        "variables": {
            name: [list(trace.var_shapes[name]), str(trace.var_dtypes[name])]
            for name in sorted(trace.var_shapes)
        },
        "steps": _step_names(step),
        "chain_states": [
            _digest(repr(state), _point_bytes(point))
            for state, point in zip(rng_states, start, strict=True)
        ],
        "data": _data_digest(model),
    }


class ChainStore:
    """The directory a run's finished chains are written to and read back from.

    Parameters
    ----------
    path
        The store's directory.
    fingerprint
        The run's :func:`run_fingerprint`.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict[str, Any]):
        self.path = Path(path)
        self.fingerprint = fingerprint

    @classmethod
    def open(cls, path: str | os.PathLike, fingerprint: dict[str, Any]) -> ChainStore:
        """Open (or create) the store at ``path`` for the run with ``fingerprint``.

        Raises
        ------
        ValueError
            The store was written by another run (a different model, data, step, seed,
            draw count or package version), or ``path`` is a file.
        """
        store = cls(path, fingerprint)
        if store.path.exists() and not store.path.is_dir():
            raise ValueError(f"store={str(path)!r} is a file; sample_dask needs a directory.")
        manifest = store.path / _MANIFEST
        if manifest.exists():
            written = json.loads(manifest.read_text())
            differing = sorted(
                k
                for k in fingerprint.keys() | written.keys()
                if written.get(k) != fingerprint.get(k)
            )
            if differing:
                raise ValueError(
                    f"store={str(path)!r} holds chains of another run: its "
                    f"{', '.join(differing)} differ from this call's. Use a new directory "
                    "(or delete this one) to start afresh; sample_dask never mixes runs."
                )
        else:
            store.path.mkdir(parents=True, exist_ok=True)
            _write_atomic(manifest, json.dumps(fingerprint, indent=1).encode())
        return store

    def finished(self) -> dict[int, dict[str, Any]]:
        """The results of the chains already in the store, by chain."""
        results = {}
        for chain in range(self.fingerprint["chains"]):
            path = self._chain_path(chain)
            if path.exists():
                with path.open("rb") as file:
                    results[chain] = pickle.load(file)
        return results

    def write(self, chain: int, result: dict[str, Any]) -> None:
        """Keep chain ``chain``'s result (whole, or not at all)."""
        _write_atomic(self._chain_path(chain), pickle.dumps(result, protocol=5))

    def _chain_path(self, chain: int) -> Path:
        return self.path / f"chain-{chain}.pickle"


def read_store(path: str | os.PathLike, *, warmup: bool = False) -> Any:
    """The finished chains in a :func:`~pymc_bigdata.sample_dask` store, as a ``DataTree``.

    Reads what a run kept without the model: the ``posterior`` (model variables and
    deterministics) and ``sample_stats`` of each chain that finished, with its chain number.
    Use it to look at the chains of a run that did not finish; calling ``sample_dask`` again
    with the same ``store=`` gives the whole result.

    Parameters
    ----------
    path
        The store's directory.
    warmup
        Also return the tuning draws (``warmup_posterior``, ``warmup_sample_stats``).

    Returns
    -------
    DataTree
        With chains in the order of their numbers.

    Raises
    ------
    FileNotFoundError
        ``path`` holds no store, or no chain has finished.
    """
    import arviz as az

    manifest = Path(path) / _MANIFEST
    if not manifest.exists():
        raise FileNotFoundError(f"{str(path)!r} holds no sample_dask store ({_MANIFEST}).")
    fingerprint = json.loads(manifest.read_text())
    results = ChainStore(path, fingerprint).finished()
    if not results:
        raise FileNotFoundError(f"No chain of the run in {str(path)!r} has finished yet.")
    chains = sorted(results)
    tune = fingerprint["tune"]
    data: dict[str, dict[str, np.ndarray]] = {}
    for prefix, kept in (("", slice(tune, None)), ("warmup_", slice(0, tune))):
        if prefix and not warmup:
            continue
        data[f"{prefix}posterior"] = _stacked([results[c]["samples"] for c in chains], kept)
        data[f"{prefix}sample_stats"] = _stacked(
            [_merged_stats(results[c]["stats"]) for c in chains], kept
        )
    return az.from_dict(data, coords={"chain": chains}, save_warmup=warmup)


def _stacked(per_chain: list[dict[str, np.ndarray]], kept: slice) -> dict[str, np.ndarray]:
    return {name: np.stack([values[name][kept] for values in per_chain]) for name in per_chain[0]}


def _merged_stats(stats: list[dict[str, np.ndarray]] | None) -> dict[str, np.ndarray]:
    """One sampler's stats, or several samplers' (the first of a repeated name kept),
    numeric ones only."""
    merged: dict[str, np.ndarray] = {}
    for method_stats in stats or []:
        for name, values in method_stats.items():
            values = np.asarray(values)
            if name not in merged and values.dtype.kind in "biuf":
                merged[name] = values
    return merged


def _write_atomic(path: Path, content: bytes) -> None:
    """Write ``content`` to a temporary file beside ``path``, then rename it to ``path``."""
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    with partial.open("wb") as file:
        file.write(content)
        file.flush()
        os.fsync(file.fileno())
    os.replace(partial, path)


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _step_names(step: Any) -> list[list[Any]]:
    """Each step method's class and the variables it updates."""
    methods = getattr(step, "methods", [step])
    return [
        [f"{type(m).__module__}.{type(m).__qualname__}", sorted(v.name for v in m.vars)]
        for m in methods
    ]


def _digest(*parts: str | bytes) -> str:
    sha = hashlib.sha256()
    for part in parts:
        sha.update(part.encode() if isinstance(part, str) else part)
        sha.update(b"\0")
    return sha.hexdigest()


def _point_bytes(point: dict[str, np.ndarray]) -> bytes:
    return b"".join(
        name.encode() + np.ascontiguousarray(point[name]).tobytes() for name in sorted(point)
    )


def _array_digest(values: np.ndarray) -> str:
    values = np.ascontiguousarray(values)
    return _digest(str(values.dtype), str(values.shape), values.tobytes())


def _data_digest(model: Any) -> dict[str, str]:
    """A digest of each data variable and observed value of ``model``: whole for arrays in
    memory, the shape and :data:`EDGE_ROWS` rows at each end for a row source."""
    digests = {}
    for var in model.data_vars:
        column = row_column(var)
        if column is None:
            digests[var.name] = _array_digest(var.get_value(borrow=True))
            continue
        n = column.n_rows
        edges = [column.read(0, min(n, EDGE_ROWS)), column.read(max(0, n - EDGE_ROWS), n)]
        digests[var.name] = _digest(str(n), *(_array_digest(e) for e in edges))
    for rv in model.observed_RVs:
        value = model.rvs_to_values[rv]
        if hasattr(value, "data"):  # a constant (shared data are digested above)
            digests[f"observed:{rv.name}"] = _array_digest(np.asarray(value.data))
    return digests
