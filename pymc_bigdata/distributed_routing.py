"""Routing ``pm.sample``'s chain loop to the cluster, for one :func:`sample_dask` call.

While a call is active, :func:`chains_on_cluster` replaces ``pymc.sampling.mcmc``'s
sequential chain loop (``_sample_many``) by a hook that sends the calling thread's chains to
:func:`~pymc_bigdata.distributed_chains.run_chains` (every other caller's stay sequential),
and its population loop by one that refuses. :func:`renamed_sequential_message` makes
``pm.sample``'s "Sequential sampling" log line say where the chains really run.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pymc as pm
import pymc.sampling.mcmc as _mcmc

from pymc_bigdata.distributed_chains import ClusterRun, run_chains

__all__ = ["chains_on_cluster", "renamed_sequential_message"]

_CURRENT_RUN: contextvars.ContextVar[ClusterRun | None] = contextvars.ContextVar(
    "pymc_bigdata_cluster_run", default=None
)
_PATCH_LOCK = threading.Lock()
_PATCH_USERS = 0
_ORIGINALS: dict[str, Any] = {}


def _sample_many_hook(**kwargs: Any) -> None:
    """Stands in for ``pymc.sampling.mcmc._sample_many`` while a sample_dask call is active:
    that call's chains go to the cluster, every other caller's stay sequential."""
    run = _CURRENT_RUN.get()
    if run is None:
        return _ORIGINALS["_sample_many"](**kwargs)
    return run_chains(run, **kwargs)


def _sample_population_hook(**kwargs: Any) -> None:
    if _CURRENT_RUN.get() is None:
        return _ORIGINALS["_sample_population"](**kwargs)
    raise NotImplementedError(
        "sample_dask cannot run population step methods (DEMetropolis): their chains "
        "update together. Use pm.sample for them."
    )


_HOOKS = {"_sample_many": _sample_many_hook, "_sample_population": _sample_population_hook}


@contextlib.contextmanager
def chains_on_cluster(run: ClusterRun) -> Iterator[None]:
    """Route pm.sample's sequential chain loop to the cluster, for this thread only."""
    global _PATCH_USERS
    with _PATCH_LOCK:
        if _PATCH_USERS == 0:
            for name, hook in _HOOKS.items():
                original = getattr(_mcmc, name, None)
                if not callable(original):
                    raise RuntimeError(
                        f"This PyMC ({pm.__version__}) has no pymc.sampling.mcmc.{name}; "
                        "sample_dask supports PyMC 6.4's sampling loop."
                    )
                _ORIGINALS[name] = original
                setattr(_mcmc, name, hook)
        _PATCH_USERS += 1
    token = _CURRENT_RUN.set(run)
    try:
        yield
    finally:
        _CURRENT_RUN.reset(token)
        with _PATCH_LOCK:
            _PATCH_USERS -= 1
            if _PATCH_USERS == 0:
                for name in _HOOKS:
                    setattr(_mcmc, name, _ORIGINALS.pop(name))


class _SequentialMessage(logging.Filter):
    """pm.sample logs "Sequential sampling (n chains in 1 job)"; say where they really run."""

    def __init__(self, run: ClusterRun, chains: int):
        super().__init__()
        self.run, self.chains = run, chains

    def filter(self, record: logging.LogRecord) -> bool:
        if record.thread == self.run.thread and str(record.msg).startswith("Sequential sampling"):
            workers = len(self.run.client.scheduler_info().get("workers", {}))
            record.msg = "Dask sampling (%d chains as tasks on %d workers)"
            record.args = (self.chains, workers)
        return True


@contextlib.contextmanager
def renamed_sequential_message(run: ClusterRun, chains: int) -> Iterator[None]:
    """Rename pm.sample's "Sequential sampling" log line of this run while active."""
    logger = logging.getLogger(_mcmc.__name__)
    message = _SequentialMessage(run, chains)
    logger.addFilter(message)
    try:
        yield
    finally:
        logger.removeFilter(message)
